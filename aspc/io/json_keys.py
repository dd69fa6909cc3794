"""Which keys the messages of JSON-lines chats hold, before pyarrow reads them with a fixed struct type.

pyarrow.json reads a chat field as ``list<struct<role, content>>`` only when
told that type, and then drops every other key a message holds (``name``,
``tool_calls``) without a word, where the row reader keeps them in the stored
chat. A byte scan (:mod:`aspc.io.json_keys_kernel`, ~1 GB/s) says whether any
message holds such a key; where one does, the file is read row by row.
"""

from __future__ import annotations

import numpy as np

from aspc.io.json_keys_kernel import chat_keys_only

__all__ = ["only_keys_in"]


def _packed(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    raw = [n.encode() for n in names]
    bounds = np.zeros(len(raw) + 1, dtype=np.int64)
    bounds[1:] = np.cumsum([len(r) for r in raw])
    return np.frombuffer(b"".join(raw) or b"\0", dtype=np.uint8)[: bounds[-1]].copy(), bounds


def only_keys_in(data: bytes, fields: list[str], keys: list[str]) -> bool:
    """Whether every object key inside the top-level ``fields`` of the JSON lines ``data`` is one of ``keys``.

    Conservative: a top-level key written with an escape (``"pr\\u006fmpt"``), or a key of ``fields`` or
    ``keys`` that JSON would escape, counts as another key. Only the lines pyarrow parses need a right answer.
    """
    if any(c in n for n in fields + keys for c in '"\\') or any(ord(c) < 0x20 for n in fields + keys for c in n):
        return False
    f, fb = _packed(fields)
    k, kb = _packed(keys)
    return bool(chat_keys_only(np.frombuffer(data, dtype=np.uint8), f, fb, k, kb))
