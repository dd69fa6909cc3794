"""Whether any of many strings is blank as Python's ``str.strip()`` sees it, by Arrow kernels.

The row reader refuses a prompt or id that is empty after ``strip()``; the bulk readers
(:mod:`aspc.io.bulk`) must find the same rows without a Python call per row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aspc.io.table import column_numpy, string_column

# Every character Python's str.strip() removes: a prompt or id made only of
# these is "empty" to the row reader, so the bulk check must use the same set.
# (tests/test_io.py checks it against str.isspace over all of Unicode.)
PY_SPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_PY_SPACE = string_column(list(PY_SPACE))


# First UTF-8 byte of every character in PY_SPACE: a string that starts with
# none of them (and is not empty) cannot be blank.
_PY_SPACE_LEAD = np.zeros(256, dtype=bool)
_PY_SPACE_LEAD[[c.encode()[0] for c in PY_SPACE]] = True


def _has_blank_exact(arr: pa.Array) -> bool:
    """Whether any string is empty after Python's str.strip(): first code points, then Python on those."""
    first = pc.utf8_slice_codeunits(arr, 0, 1)
    empty = column_numpy(pc.binary_length(arr)) == 0
    spaced = column_numpy(pc.is_in(first, value_set=_PY_SPACE))
    idx = np.flatnonzero(empty | spaced)
    return any(not arr[int(i)].as_py().strip() for i in idx)


def _has_blank(arr: pa.Array) -> bool:
    """Whether any string is empty after Python's str.strip().

    The first byte of each string, read from the Arrow buffers, rules out
    almost every row at once (a million prompts: milliseconds, where slicing
    every first code point costs ~0.2 s); the few left (empty, or starting
    with a lead byte of some whitespace character) get the exact check.
    """
    if arr.null_count or not pa.types.is_string(arr.type):
        return _has_blank_exact(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]
    sizes = np.diff(offsets)
    if np.any(sizes == 0):
        return True
    data = arr.buffers()[2]
    if data is None:
        return len(arr) > 0  # no character data: every string is empty
    lead = np.frombuffer(data, dtype=np.uint8)[offsets[:-1]]
    idx = np.flatnonzero(_PY_SPACE_LEAD[lead])
    if idx.size == 0:
        return False
    return _has_blank_exact(arr.take(pa.array(idx)))
