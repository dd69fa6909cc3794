"""The validated prompt table every reader returns: Arrow columns, ragged lengths."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from aspc.io.ragged import RaggedLengths


@dataclass
class SkippedRow:
    row: int  # 0-based row number in the input (JSONL: line number - 1)
    reason: str  # why the row was skipped


def _strings(values: Sequence[str] | pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values if values.type == pa.string() else values.cast(pa.string())
    return pa.array(values, pa.string())


class PromptTable:
    """Validated prompts of one dataset, in input order.

    Columns are Arrow string arrays (``id_array``, ``prompt_array``,
    ``text_array``) and NumPy arrays; ``ids``, ``prompts`` and ``texts`` give
    them as Python lists (built on first use, for callers that need lists).
    """

    def __init__(
        self,
        ids: Sequence[str] | pa.Array | pa.ChunkedArray,
        prompts: Sequence[str] | pa.Array | pa.ChunkedArray,
        texts: Sequence[str] | pa.Array | pa.ChunkedArray,
        source_rows: np.ndarray,
        prompt_tokens: np.ndarray,
        lengths: RaggedLengths | Sequence[np.ndarray] | None,
        input_hash: str,
        skipped: list[SkippedRow] | None = None,
        token_counter: dict[str, Any] | None = None,
    ) -> None:
        self.id_array = _strings(ids)  # unique prompt ids
        self.prompt_array = _strings(prompts)  # stored form: the text, or chat messages as compact JSON
        # Flattened plain text, what predictors read (the prompt itself for text prompts).
        self.text_array = self.prompt_array if texts is prompts else _strings(texts)
        self.source_rows = np.asarray(source_rows, dtype=np.int64)  # 0-based row of each prompt in the input
        self.prompt_tokens = np.asarray(prompt_tokens, dtype=np.int64)  # prompt length in tokens
        if lengths is not None and not isinstance(lengths, RaggedLengths):
            lengths = RaggedLengths.from_arrays(lengths)
        self.lengths = lengths  # known response lengths (>= 1 value per prompt), or None
        self.input_hash = input_hash  # sha256 of the input file's bytes
        self.skipped = skipped if skipped is not None else []  # rows dropped under on_bad_line="skip"
        # How prompt_tokens were counted: {} = estimated from UTF-8 bytes, else the tokenizer's identity.
        self.token_counter = dict(token_counter or {})
        n = len(self.id_array)
        if not (len(self.prompt_array) == len(self.text_array) == self.source_rows.size == self.prompt_tokens.size == n):
            raise ValueError("PromptTable columns differ in length")
        if lengths is not None and len(lengths) != n:
            raise ValueError(f"{len(lengths)} length entries for {n} prompts")
        self._lists: dict[str, list[str]] = {}

    def __len__(self) -> int:
        return len(self.id_array)

    def _list(self, name: str, arr: pa.Array | pa.ChunkedArray) -> list[str]:
        if name not in self._lists:
            self._lists[name] = arr.to_pylist()
        return self._lists[name]

    @property
    def ids(self) -> list[str]:
        return self._list("ids", self.id_array)

    @property
    def prompts(self) -> list[str]:
        return self._list("prompts", self.prompt_array)

    @property
    def texts(self) -> list[str]:
        return self._list("texts", self.text_array)
