"""Observed lengths from JSON lines, read by column: the fast path of :func:`aspc.io.lengths.read_lengths`.

pyarrow.json parses the file in C++ (300,000 rows of 8 lengths: ~0.6 s in all,
where json.loads row by row took ~3.4 s). Where it reads the file otherwise than
the row reader's json.loads (:mod:`aspc.io.json_lines`: lines, literals, depth;
UTF-8, which it never checks; ``-0``, which it reads as -0.0 where Python reads
the integer 0), :func:`jsonl_lengths` gives None and the row reader reads the
file, refusing what it refuses in its own words.
"""

from __future__ import annotations

import json

import pyarrow as pa

from aspc.io.bulk_columns import JSON_BLOCK, Bail, is_utf8, json_kind, lengths_column, line_rows, one_chunk
from aspc.io.json_lines import read_alike
from aspc.io.ragged import RaggedLengths
from aspc.io.readers import json_int
from aspc.io.table import column_numpy


def jsonl_lengths(data: bytes, id_field: str, length_field: str) -> tuple[list[str], RaggedLengths] | None:
    """Each row's id (as the row reader keys it) and lengths, in file order; None where any row needs the row reader.

    ``data``: the whole file. Read here: integer (int64) or string ids, of one kind in every row, and numbers or
    non-empty lists of numbers within 0..MAX_LENGTH, of one kind in every row; one object a line.
    """
    if id_field == length_field:
        return None
    if data.startswith(b"\xef\xbb\xbf"):  # the row reader decodes with utf-8-sig
        data = data[3:]
    if not is_utf8(pa.py_buffer(data)) or not read_alike(data):
        return None
    schema = _schema(data, id_field, length_field)
    if schema is None:
        return None
    tab = _read(data, schema)
    if tab is None or len(tab) == 0 or line_rows(data, len(tab)) is None:
        return None
    ids = one_chunk(tab[id_field])
    try:
        lengths = lengths_column(tab, length_field)  # no nulls, no empty lists, numbers within 0..MAX_LENGTH, no -0.0
    except Bail:
        return None
    if ids.null_count:
        return None
    try:
        keys = list(map(str, column_numpy(ids).tolist())) if pa.types.is_integer(ids.type) else ids.to_pylist()
    except UnicodeDecodeError:  # not seen (the file is UTF-8, escaped lone surrogates fail the parse): to be sure
        return None
    # A copy, as the row reader's arrays are: column_numpy's is a view of pyarrow's buffer (writable or not as it made it).
    return keys, RaggedLengths(lengths.values.copy(), lengths.offsets)


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
    kinds = [json_kind(rec.get(id_field), "id"), json_kind(rec.get(length_field), "length")]
    if None in kinds:
        return None
    return pa.schema([(id_field, kinds[0]), (length_field, kinds[1])])


def _read(data: bytes, schema: pa.Schema) -> pa.Table | None:
    import pyarrow.json as pj

    try:
        return pj.read_json(
            pa.BufferReader(pa.py_buffer(data)),
            read_options=pj.ReadOptions(block_size=JSON_BLOCK),  # a line past ~2 blocks fails: the row reader takes it
            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except MemoryError:  # pa.ArrowMemoryError too: the row reader would need more
        raise
    except (pa.ArrowException, ValueError):
        return None
