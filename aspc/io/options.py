"""How to read a prompt dataset: field names, bad-row policy, token counter."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from aspc.io.table import PromptTable


@dataclass(frozen=True)
class InputOptions:
    prompt_field: str = "prompt"  # field holding the prompt text or chat messages
    id_field: str = "id"  # field holding the prompt id; absent -> extra_info.index, else a content hash
    length_field: str | None = None  # known response lengths; None -> use a predictor
    on_bad_line: str = "error"  # "error" or "skip"
    # Counts prompt_tokens: a Hugging Face tokenizer directory or "qwen"; None
    # -> estimated from UTF-8 bytes (aspc.io.rows.BYTES_PER_TOKEN).
    tokenizer: str | None = None

    def read(self, path: str | os.PathLike, **changes: Any) -> PromptTable:
        """Read ``path`` with these options (``changes`` override fields, e.g. ``length_field=None``)."""
        from aspc.io.prompts import read_prompts

        opts = dataclasses.replace(self, **changes) if changes else self
        table = read_prompts(
            path,
            prompt_field=opts.prompt_field,
            id_field=opts.id_field,
            length_field=opts.length_field,
            on_bad_line=opts.on_bad_line,
        )
        if opts.tokenizer is not None:
            from aspc.io.tokens import count_tokens, load_tokenizer

            tok = load_tokenizer(opts.tokenizer)
            table.prompt_tokens = count_tokens(tok, table.text_array)
            table.token_counter = tok.identity()
        return table

    def record(self) -> dict[str, Any]:
        """These options for the plan metadata: no paths, and no key for an unset tokenizer."""
        rec = dataclasses.asdict(self)
        if self.tokenizer is None:
            # Plans compiled without a tokenizer keep the bytes they always had.
            del rec["tokenizer"]
        else:
            rec["tokenizer"] = "qwen" if self.tokenizer == "qwen" else "dir"
        return rec
