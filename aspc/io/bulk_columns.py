"""Column checks the bulk readers share: Arrow columns taken only where the row reader would take them alike.

:mod:`aspc.io.bulk` (compile's prompts) and :mod:`aspc.io.bulk_lengths`
(observed lengths) raise :class:`Bail` from these checks where a column holds
anything they cannot vouch for; their callers then read the file row by row,
which words every error.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aspc.io.ragged import RaggedLengths
from aspc.io.rows import MAX_LENGTH, VERL_INDEX
from aspc.io.table import column_numpy

# pyarrow.json blocks; a line that straddles more than two of them makes pyarrow
# fail, and the row reader takes over (prompts are capped at 2 MiB).
JSON_BLOCK = 8 << 20
# A JSON-lines chat, when every message holds exactly these keys (see json_kind).
CHAT_KEYS = {"role": None, "content": None}.keys()
CHAT = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


class Bail(Exception):
    """The bulk reader cannot vouch for the data; read it row by row."""


def one_chunk(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``col`` as one array (not copied when it is one chunk already)."""
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def check(ok: bool) -> None:
    """Bail unless ``ok``."""
    if not ok:
        raise Bail


def numbers(arr: pa.Array) -> np.ndarray:
    """``arr``'s lengths as float64: numbers in [0, MAX_LENGTH], no nulls, no -0.0 (else Bail)."""
    t = arr.type
    check(arr.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)))
    # Unchecked: integers past 2**53 are far above MAX_LENGTH and bail below either way.
    x = column_numpy(arr.cast(pa.float64(), safe=False))
    # NaN fails every comparison, so it bails here too.
    check(bool(np.all((x >= 0) & (x <= MAX_LENGTH))) if x.size else True)
    # pyarrow.json reads -0 as -0.0, json.loads as the integer 0 ("-0.0" is -0.0 in both): the row reader says.
    check(not np.signbit(x).any())
    return x


def lengths_column(tab: pa.Table, length_field: str) -> RaggedLengths:
    """The lengths of ``tab``'s ``length_field``: a number or a non-empty list of them per row (else Bail)."""
    check(length_field in tab.column_names and tab[length_field].null_count == 0)
    arr = one_chunk(tab[length_field])
    t = arr.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        sizes = column_numpy(pc.list_value_length(arr)).astype(np.int64)
        check(sizes.size == 0 or int(sizes.min()) >= 1)
        values = numbers(arr.flatten())
        return RaggedLengths(values, np.r_[0, np.cumsum(sizes)])
    return RaggedLengths.single(numbers(arr))


_INT64 = (-(2**63), 2**63 - 1)


def json_kind(v: object, role: str) -> pa.DataType | None:
    """The Arrow type to parse one field as, from one Python value (None: give up)."""
    if isinstance(v, bool):
        return None
    if role == "prompt":
        # Chats as role and content only: pyarrow drops every key a struct type does not name (name,
        # tool_calls), which the stored chat keeps, so aspc.io.bulk._parse_jsonl first scans the file for such keys.
        if isinstance(v, list) and v and all(isinstance(m, dict) and m.keys() == CHAT_KEYS for m in v):
            return CHAT
        return pa.string() if isinstance(v, str) else None
    if role == "id":
        if isinstance(v, str):
            return pa.string()
        return pa.int64() if isinstance(v, int) and _INT64[0] <= v <= _INT64[1] else None
    if role == "length":
        if isinstance(v, (int, float)):
            return pa.float64()  # integers parse into float64 too: later rows may hold 2.5
        if isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            return pa.list_(pa.float64())
        return None
    # extra_info: only its index matters, and only without an id field.
    index = v.get(VERL_INDEX[1]) if isinstance(v, dict) else None
    t = json_kind(index, "id") if index is not None else None
    return pa.struct([(VERL_INDEX[1], t)]) if t is not None else None


# A line that starts with JSON whitespace, or is empty: after \\n, or at the start of the file.
_BLANKISH = re.compile(rb"\n[\n\r\t ]")


def line_rows(data: bytes, n_rows: int) -> np.ndarray | None:
    """0-based line of each parsed row: lines end at \\n, blank lines hold no row."""
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    last = data[data.rfind(b"\n") + 1 :]
    # As many rows as lines means one row a line only when no line is blank: two records on one line
    # and a blank line elsewhere add up too (a regex pass: ~0.1 s for 280 MB).
    if lines == n_rows and data[:1] not in b"\n\r\t " and (data.endswith(b"\n") or last.strip(b" \t\r")) and (
            _BLANKISH.search(data) is None):  # fmt: skip
        return np.arange(n_rows, dtype=np.int64)
    # pyarrow parsed every line, so a line is either an object or JSON whitespace.
    rows = np.fromiter((i for i, line in enumerate(data.split(b"\n")) if line.strip()), dtype=np.int64)
    return rows if rows.size == n_rows else None


def is_utf8(buf: pa.Buffer) -> bool:
    """Whether ``buf`` is UTF-8 (pyarrow.json never checks): one cast validates it all, in C++, without a copy."""
    try:
        offsets = pa.py_buffer(np.array([0, buf.size], dtype=np.int64).tobytes())
        pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, buf]).cast(pa.large_string())
    except pa.ArrowInvalid:
        return False
    return True
