"""Numba kernel: whether JSON lines hold what Python's json.loads reads alike (no validation here; see
aspc.io.json_lines).

A byte scan that tracks only what it must: inside a string or not (and its escapes), the nesting depth,
and whether the line's one top-level object has closed. Its answer matters only for files pyarrow then
parses: a line that is not valid JSON fails that parse whatever this returns.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from aspc.numba_config import NJIT_FLAGS

_QUOTE, _BACKSLASH, _MINUS = 0x22, 0x5C, 0x2D
_OPEN_OBJ, _OPEN_ARR, _CLOSE_OBJ, _CLOSE_ARR = 0x7B, 0x5B, 0x7D, 0x5D
_NEWLINE, _SPACE, _TAB, _CR = 0x0A, 0x20, 0x09, 0x0D
_I, _N = 0x49, 0x4E
_INFINITY = np.frombuffer(b"Infinity", dtype=np.uint8).copy()
_NAN = np.frombuffer(b"NaN", dtype=np.uint8).copy()


@njit(**NJIT_FLAGS)
def _spells(data: np.ndarray, at: int, word: np.ndarray) -> bool:
    if at + word.size > data.size:
        return False
    for j in range(word.size):
        if data[at + j] != word[j]:
            return False
    return True


@njit(**NJIT_FLAGS)
def one_object_a_line(data: np.ndarray, max_depth: int) -> bool:
    """True when every line that is not JSON whitespace holds exactly one object, nested at most
    ``max_depth`` deep, no NUL byte, and no number literal but ``NaN``, ``Infinity`` and ``-Infinity``
    (pyarrow reads ``Inf``, ``-Inf`` and ``-NaN`` too)."""
    depth = 0
    in_string = escaped = closed = False
    prev = 0  # the last byte outside strings that is not whitespace
    skip = 0  # the rest of a NaN or Infinity read
    for i in range(data.size):
        if i < skip:
            continue
        b = data[i]
        if b == 0:
            return False  # rapidjson's input ends at a NUL; json.loads refuses one anywhere
        if in_string:
            if b == _NEWLINE:
                return False  # no JSON string holds one, escaped or not
            if escaped:
                escaped = False
            elif b == _BACKSLASH:
                escaped = True
            elif b == _QUOTE:
                in_string = False
                prev = b
            continue
        if b == _NEWLINE:
            if depth != 0:
                return False  # an object over two lines
            closed = False
            prev = 0
            continue
        if b == _SPACE or b == _TAB or b == _CR:
            continue
        if depth == 0:
            if closed or b != _OPEN_OBJ:
                return False  # a second value on the line, or one that is not an object
            depth = 1
        elif b == _QUOTE:
            in_string = True
        elif b == _OPEN_OBJ or b == _OPEN_ARR:
            depth += 1
            if depth > max_depth:
                return False
        elif b == _CLOSE_OBJ or b == _CLOSE_ARR:
            depth -= 1
            closed = depth == 0
        elif b == _I:
            if not _spells(data, i, _INFINITY):
                return False
            skip = i + _INFINITY.size
        elif b == _N:
            if prev == _MINUS or not _spells(data, i, _NAN):
                return False
            skip = i + _NAN.size
        prev = b
    return depth == 0 and not in_string
