"""Numba kernel: the object keys inside chat fields of JSON lines (no validation here; see aspc.io.json_keys).

A byte scan that tracks only what it must: inside a string or not (and its
escapes), the nesting depth, and the last string closed, which a ``:`` makes
a key. Its answer matters only for lines pyarrow then parses; a line that is
not valid JSON fails that parse whatever this returns.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from aspc.numba_config import NJIT_FLAGS

_QUOTE, _BACKSLASH, _COLON, _COMMA = 0x22, 0x5C, 0x3A, 0x2C
_OPEN_OBJ, _OPEN_ARR, _CLOSE_OBJ, _CLOSE_ARR, _NEWLINE = 0x7B, 0x5B, 0x7D, 0x5D, 0x0A


@njit(**NJIT_FLAGS)
def _key_is(data: np.ndarray, start: int, end: int, names: np.ndarray, bounds: np.ndarray) -> bool:
    """Whether ``data[start:end]`` equals one of the byte strings ``names[bounds[k]:bounds[k+1]]``."""
    for k in range(bounds.size - 1):
        lo, hi = bounds[k], bounds[k + 1]
        if hi - lo != end - start:
            continue
        same = True
        for j in range(hi - lo):
            if data[start + j] != names[lo + j]:
                same = False
                break
        if same:
            return True
    return False


@njit(**NJIT_FLAGS)
def chat_keys_only(
    data: np.ndarray, fields: np.ndarray, field_bounds: np.ndarray, keys: np.ndarray, key_bounds: np.ndarray
) -> bool:
    """True when every object key inside a top-level ``fields`` value is one of ``keys``, and no top-level key
    holds an escape (it could spell a field's name another way)."""
    depth = 0
    in_string = escaped = string_escapes = in_field = False
    start = end = 0
    for i in range(data.size):
        b = data[i]
        if in_string:
            if escaped:
                escaped = False
            elif b == _BACKSLASH:
                escaped = string_escapes = True
            elif b == _QUOTE:
                in_string = False
                end = i
        elif b == _QUOTE:
            in_string, string_escapes, start = True, False, i + 1
        elif b == _COLON:
            if depth == 1:
                if string_escapes:
                    return False
                in_field = _key_is(data, start, end, fields, field_bounds)
            elif in_field and not _key_is(data, start, end, keys, key_bounds):  # an escaped key never equals
                return False
        elif b == _OPEN_OBJ or b == _OPEN_ARR:
            depth += 1
        elif b == _CLOSE_OBJ or b == _CLOSE_ARR:
            depth -= 1
            if depth <= 0:
                in_field = False
        elif b == _COMMA and depth == 1:
            in_field = False
        elif b == _NEWLINE:
            # JSON lines: a string or an object never spans a newline; start the next line clean.
            depth, in_string, escaped, in_field = 0, False, False, False
    return True
