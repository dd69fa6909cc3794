"""Observed lengths from JSON lines, read by column: the fast path of :func:`aspc.io.lengths.read_lengths`.

pyarrow.json parses the file in C++ (300,000 rows of 8 lengths: ~0.6 s in all,
where json.loads row by row took ~3.4 s). It is more lenient than the row reader's
json.loads in a few ways, each ruled out here: it does not check UTF-8, it
reads ``-NaN``, ``Inf`` and ``-Inf``, it nests without limit (json.loads
fails past ~1,000 levels), it reads two objects on one line and one object
over two lines, and it parses ``-0`` as -0.0 (Python: the integer 0). Where
any doubt is left, :func:`jsonl_lengths` gives None and the row reader reads
the file, refusing what it refuses in its own words.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa

from aspc.io.bulk import _JSON_BLOCK, _Bail, _kind, _lengths, _one, _utf8
from aspc.io.ragged import RaggedLengths
from aspc.io.readers import json_int
from aspc.io.table import column_numpy

# Nesting deeper than this anywhere in a line goes to the row reader: json.loads raises RecursionError
# somewhere under sys.getrecursionlimit() (1,000), less the frames already on the stack.
_MAX_DEPTH = 100
_LF, _CR, _OPEN_OBJ, _CLOSE_OBJ, _OPEN_ARR, _CLOSE_ARR = 0x0A, 0x0D, 0x7B, 0x7D, 0x5B, 0x5D
# A JSON string, escapes included (for a line pyarrow has parsed, so well formed).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# Number literals json.loads refuses and pyarrow reads, followed by what may end a value.
_LENIENT = (re.compile(rb"Inf[ \t\r\n,\]}]"), re.compile(rb"-NaN[ \t\r\n,\]}]"))


def jsonl_lengths(data: bytes, id_field: str, length_field: str) -> tuple[list[str], RaggedLengths] | None:
    """Each row's id (as the row reader keys it) and lengths, in file order; None where any row needs the row reader.

    ``data``: the whole file. Read here: integer (int64) or string ids, of one kind in every row, and numbers or
    non-empty lists of numbers within 0..MAX_LENGTH, of one kind in every row; one object a line.
    """
    if id_field == length_field:
        return None
    if data.startswith(b"\xef\xbb\xbf"):  # the row reader decodes with utf-8-sig
        data = data[3:]
    # A NUL byte ends rapidjson's input early; json.loads refuses it anywhere, in a string or out.
    if b"\x00" in data or not _utf8(pa.py_buffer(data)) or _has_lenient_number(data):
        return None
    schema = _schema(data, id_field, length_field)
    if schema is None:
        return None
    tab = _read(data, schema)
    if tab is None or len(tab) == 0 or not _one_object_a_line(data, len(tab)):
        return None
    ids = _one(tab[id_field])
    try:
        lengths = _lengths(tab, length_field)  # no nulls, no empty lists, numbers within 0..MAX_LENGTH
    except _Bail:
        return None
    # -0 parses as -0.0 here, as 0.0 in Python; "-0.0" is -0.0 in both, but which was written is lost.
    if ids.null_count or np.signbit(lengths.values).any():
        return None
    try:
        keys = list(map(str, column_numpy(ids).tolist())) if pa.types.is_integer(ids.type) else ids.to_pylist()
    except UnicodeDecodeError:  # not seen (the file is UTF-8, escaped lone surrogates fail the parse): to be sure
        return None
    # A copy, as the row reader's arrays are: column_numpy's is a view of pyarrow's buffer (writable or not as it made it).
    return keys, RaggedLengths(lengths.values.copy(), lengths.offsets)


def _has_lenient_number(data: bytes) -> bool:
    """Whether some ``Inf``, ``-Inf`` or ``-NaN`` may stand as a value (after ``:``, ``,`` or ``[``).

    Conservative: text inside a string that looks so (``"a, Inf b"``) counts too, and the row reader reads the file.
    """
    for pattern in _LENIENT:
        for m in pattern.finditer(data):
            before = data[max(0, m.start() - 64) : m.start()].rstrip(b" \t\r\n").removesuffix(b"-").rstrip(b" \t\r\n")
            if not before or before[-1:] in (b":", b",", b"["):  # nothing but whitespace seen: may be a value too
                return True
    return False


def _schema(data: bytes, id_field: str, length_field: str) -> pa.Schema | None:
    """Types of the two fields, from the first row (every row must have both; a later kind fails the parse)."""
    start = 0
    while True:
        end = data.find(b"\n", start)
        line = data[start : len(data) if end < 0 else end]
        if line.strip():
            break
        if end < 0:
            return None  # blank lines only: "no rows", in the row reader's words
        start = end + 1
    try:
        rec = json.loads(line.decode("utf-8"), parse_int=json_int)  # a huge integer elsewhere is no error
    except (ValueError, RecursionError):
        return None
    if not isinstance(rec, dict):
        return None
    kinds = [_kind(rec.get(id_field), "id"), _kind(rec.get(length_field), "length")]
    if None in kinds:
        return None
    return pa.schema([(id_field, kinds[0]), (length_field, kinds[1])])


def _read(data: bytes, schema: pa.Schema) -> pa.Table | None:
    import pyarrow.json as pj

    try:
        return pj.read_json(
            pa.BufferReader(pa.py_buffer(data)),
            read_options=pj.ReadOptions(block_size=_JSON_BLOCK),  # a line past ~2 blocks fails: the row reader takes it
            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except MemoryError:  # pa.ArrowMemoryError too: the row reader would need more
        raise
    except (pa.ArrowException, ValueError):
        return None


def _one_object_a_line(data: bytes, n_rows: int) -> bool:
    """Whether the ``n_rows`` values pyarrow parsed from ``data`` lie one a line, each line one object or blank,
    nested no deeper than the row reader's json.loads goes.

    A line that starts with ``{`` and ends with ``}`` (JSON whitespace aside) ends outside any string (no string
    holds a newline) and outside any object or array (inside one, a value is followed by ``,``, ``]`` or ``}``,
    never by the next line's ``{``), so each such line holds whole values, at least one; as many values as such
    lines, each holds exactly one.
    """
    b = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(b == _LF)
    starts, ends = np.r_[0, newlines + 1], np.r_[newlines, b.size]
    some = ends > starts
    first = b[np.where(some, starts, 0)]
    last, before = b[np.maximum(ends - 1, 0)], b[np.maximum(ends - 2, 0)]
    tidy = some & (first == _OPEN_OBJ) & ((last == _CLOSE_OBJ) | ((last == _CR) & (before == _CLOSE_OBJ)))
    rows = int(np.count_nonzero(tidy))
    for i in np.flatnonzero(~tidy & some).tolist():  # blank lines, padded lines: few, read one by one
        line = data[starts[i] : ends[i]].strip(b" \t\r")
        if not line:
            continue
        if line[:1] != b"{" or line[-1:] != b"}":
            return False
        rows += 1
    if rows != n_rows:
        return False
    # Depth is at most the brackets a line opens; the few lines that open many are measured, strings left out.
    opens = np.flatnonzero((b == _OPEN_OBJ) | (b == _OPEN_ARR))
    per_line = np.bincount(np.searchsorted(newlines, opens), minlength=starts.size)
    return all(_depth(data[starts[i] : ends[i]]) <= _MAX_DEPTH for i in np.flatnonzero(per_line > _MAX_DEPTH).tolist())


def _depth(line: bytes) -> int:
    bare = np.frombuffer(_STRING.sub(b"", line), dtype=np.uint8)
    step = np.isin(bare, (_OPEN_OBJ, _OPEN_ARR)).astype(np.int64) - np.isin(bare, (_CLOSE_OBJ, _CLOSE_ARR))
    return int(np.cumsum(step).max()) if step.size else 0
