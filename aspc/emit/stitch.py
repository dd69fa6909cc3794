"""Write a plan's Parquet file on two cores, byte for byte the file ``pq.write_table`` writes.

pyarrow encodes a file's columns one after another on one thread, and at a
million prompts the prompt text alone (zstd) is ~3/4 of the write. Column
chunks do not depend on each other or on where they sit in the file, so the
prompt column is encoded on a thread into one in-memory file while the other
columns are encoded into another; their chunks are then laid end to end in
schema order, and the footer (Thrift compact protocol) is rebuilt from the
two files' column metadata, offsets shifted, with the schema, key-value
metadata and ``created_by`` of a zero-row file of the full table.

Only what pyarrow writes for a plan is handled: one row group, no page
indexes, bloom filters or sorting columns, and footers that re-encode to
their own bytes. Anything else returns ``None`` and the caller writes the
plain way, so the result is the same file either way (tests compare the two).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

_MAGIC = b"PAR1"

# Compact-protocol type ids.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


class _Unexpected(Exception):
    """The files are not laid out as this module expects: write the plain way."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = out = 0
    while True:
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, pos
        shift += 7


def _put_varint(out: bytearray, n: int) -> None:
    while True:
        if n < 0x80:
            out.append(n)
            return
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def _unzig(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _zig(n: int) -> int:
    return (n << 1) ^ (n >> 63)


# A struct is a list of [field id, type, value]; lists are (element type, [values]).
def _read_value(buf: bytes, pos: int, t: int) -> tuple[Any, int]:
    if t in (_TRUE, _FALSE):  # only inside lists: one byte each
        return buf[pos] == _TRUE, pos + 1
    if t == _BYTE:
        return buf[pos], pos + 1
    if t in (_I16, _I32, _I64):
        n, pos = _varint(buf, pos)
        return _unzig(n), pos
    if t == _DOUBLE:
        return buf[pos : pos + 8], pos + 8
    if t == _BINARY:
        n, pos = _varint(buf, pos)
        return buf[pos : pos + n], pos + n
    if t in (_LIST, _SET):
        head = buf[pos]
        pos += 1
        size, et = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        items = []
        for _ in range(size):
            v, pos = _read_value(buf, pos, et)
            items.append(v)
        return (et, items), pos
    if t == _STRUCT:
        return _read_struct(buf, pos)
    raise _Unexpected(f"thrift type {t}")  # maps: none in a Parquet footer


def _read_struct(buf: bytes, pos: int) -> tuple[list, int]:
    fields: list = []
    last = 0
    while True:
        head = buf[pos]
        pos += 1
        if head == 0:
            return fields, pos
        t, delta = head & 0x0F, head >> 4
        if delta:
            fid = last + delta
        else:
            n, pos = _varint(buf, pos)
            fid = _unzig(n)
        if t in (_TRUE, _FALSE):
            v = t == _TRUE
        else:
            v, pos = _read_value(buf, pos, t)
        fields.append([fid, t, v])
        last = fid


def _write_value(out: bytearray, t: int, v: Any) -> None:
    if t in (_TRUE, _FALSE):
        out.append(_TRUE if v else _FALSE)
    elif t == _BYTE:
        out.append(v)
    elif t in (_I16, _I32, _I64):
        _put_varint(out, _zig(v))
    elif t == _DOUBLE:
        out += v
    elif t == _BINARY:
        _put_varint(out, len(v))
        out += v
    elif t in (_LIST, _SET):
        et, items = v
        if len(items) < 15:
            out.append(len(items) << 4 | et)
        else:
            out.append(0xF0 | et)
            _put_varint(out, len(items))
        for item in items:
            _write_value(out, et, item)
    elif t == _STRUCT:
        _write_struct(out, v)
    else:
        raise _Unexpected(f"thrift type {t}")


def _write_struct(out: bytearray, fields: list) -> None:
    last = 0
    for fid, t, v in fields:
        ht = (_TRUE if v else _FALSE) if t in (_TRUE, _FALSE) else t
        if 0 < fid - last <= 15:
            out.append((fid - last) << 4 | ht)
        else:
            out.append(ht)
            _put_varint(out, _zig(fid))
        if t not in (_TRUE, _FALSE):
            _write_value(out, t, v)
        last = fid
    out.append(0)


def _encode(fields: list) -> bytes:
    out = bytearray()
    _write_struct(out, fields)
    return bytes(out)


def _get(fields: list, fid: int, t: int) -> Any:
    for f in fields:
        if f[0] == fid:
            if f[1] != t:
                raise _Unexpected(f"field {fid} has type {f[1]}")
            return f[2]
    raise _Unexpected(f"no field {fid}")


def _set(fields: list, fid: int, value: Any) -> None:
    for f in fields:
        if f[0] == fid:
            f[2] = value
            return
    raise _Unexpected(f"no field {fid}")


def _footer(data: memoryview) -> tuple[list, int]:
    """(FileMetaData fields, offset where the footer starts), checked to re-encode to its own bytes."""
    if bytes(data[:4]) != _MAGIC or bytes(data[-4:]) != _MAGIC:
        raise _Unexpected("not a Parquet file")
    size = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - size
    raw = bytes(data[start : len(data) - 8])
    fields, end = _read_struct(raw, 0)
    if end != len(raw) or _encode(fields) != raw:
        raise _Unexpected("footer does not round-trip")
    return fields, start


# FileMetaData 4 row_groups; RowGroup 1 columns, 2 total_byte_size, 3 num_rows,
# 5 file_offset, 6 total_compressed_size, 7 ordinal; ColumnChunk 2 file_offset,
# 3 meta_data; ColumnMetaData 7 total_compressed_size, 9 data_page_offset,
# 10 index_page_offset, 11 dictionary_page_offset.
# Only fields known to hold no file offset, besides the offsets shifted here,
# are carried over: a field added by a later pyarrow makes this fall back.
_FILE_KNOWN = {1, 2, 3, 4, 5, 6, 7}
_RG_KNOWN = {1, 2, 3, 5, 6, 7}
_CC_KNOWN = {2, 3}
_CMD_OFFSETS = (9, 10, 11)
_CMD_KNOWN = {*range(1, 14), 16}  # 14/15: bloom filter offset/length; 16: size statistics


def _chunks(fields: list) -> tuple[list, list]:
    """(the one row group's fields, its column chunks' fields)."""
    if {f[0] for f in fields} - _FILE_KNOWN:
        raise _Unexpected("file metadata fields")
    et, groups = _get(fields, 4, _LIST)
    if et != _STRUCT or len(groups) != 1:
        raise _Unexpected("not one row group")
    rg = groups[0]
    if {f[0] for f in rg} - _RG_KNOWN:
        raise _Unexpected("row group fields")
    et, cols = _get(rg, 1, _LIST)
    for cc in cols:
        if {f[0] for f in cc} - _CC_KNOWN or _get(cc, 2, _I64) != 0:
            raise _Unexpected("column chunk fields")
        if {f[0] for f in _get(cc, 3, _STRUCT)} - _CMD_KNOWN:
            raise _Unexpected("column metadata fields")
    return rg, cols


def _span(cc: list) -> tuple[int, int]:
    """Where a column chunk's pages lie: [first page offset, end)."""
    md = _get(cc, 3, _STRUCT)
    starts = [f[2] for f in md if f[0] in _CMD_OFFSETS]
    start = min(starts)
    return start, start + _get(md, 7, _I64)


def _shift(cc: list, delta: int) -> list:
    md = [list(f) for f in _get(cc, 3, _STRUCT)]
    for f in md:
        if f[0] in _CMD_OFFSETS:
            f[2] += delta
    return [[fid, t, (md if fid == 3 else v)] for fid, t, v in cc]


def _to_buffer(table: pa.Table, kwargs: dict) -> memoryview:
    # Into a buffer sized for the worst case up front: a growing output stream
    # reallocates and copies as it doubles, faulting in fresh pages each time
    # (a quarter of a million-prompt write's page faults). Pages never
    # written to are never touched, so the spare capacity costs nothing.
    capacity = table.nbytes + table.nbytes // 16 + 16 * table.num_rows + (4 << 20)
    try:
        buf = pa.allocate_buffer(capacity)
        sink = pa.FixedSizeBufferWriter(buf)
        pq.write_table(table, sink, **kwargs)
        return memoryview(buf)[: sink.tell()]
    except (pa.ArrowException, OSError, MemoryError):
        pass  # past the bound after all, or no address space for it (strict overcommit)
    stream = pa.BufferOutputStream()  # grows as it must
    pq.write_table(table, stream, **kwargs)
    return memoryview(stream.getvalue())


class Big(NamedTuple):
    """The big column's chunk: pages to lay out in order, with its row group's and chunk's metadata."""

    data: memoryview  # the file it was encoded into (the first one, when in halves)
    pieces: list  # its pages, as slices of the encoded files
    rg: list  # RowGroup fields
    cc: list  # ColumnChunk fields; offsets as if its pages started at byte 4


def whole(data: memoryview) -> Big:
    """The one column chunk of a one-column file ``data``."""
    fields, start = _footer(data)
    rg, cols = _chunks(fields)
    if len(cols) != 1 or _span(cols[0]) != (4, start):
        raise _Unexpected("big file layout")
    return Big(data, [data[4:start]], rg, cols[0])


def split_write(table: pa.Table, column: str, kwargs: dict, cut: Callable | None = None) -> list | None:
    """The bytes of ``pq.write_table(table, ..., **kwargs)`` as pieces to write in order, or None.

    ``column`` (the big one) is encoded on a thread beside all the others;
    ``cut(one_column_table, kwargs, to_buffer)`` may encode it in parts
    (a :class:`Big`), or return None to have it encoded whole.
    """
    names = table.column_names
    if column not in names or len(names) < 2 or table.num_rows == 0:
        return None
    k = names.index(column)
    rest = table.drop_columns([column])
    box: dict[str, Any] = {}

    def encode_big() -> None:
        try:
            one = table.select([column])
            box["big"] = (cut and cut(one, kwargs, _to_buffer)) or _to_buffer(one, kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=encode_big, daemon=True)
    thread.start()
    try:
        small = _to_buffer(rest, kwargs)
        empty = _to_buffer(table.slice(0, 0), kwargs)
    finally:
        thread.join()
    if "error" in box:
        raise box["error"]
    try:
        big = box["big"] if isinstance(box["big"], Big) else whole(box["big"])
        return _stitch(big, small, empty, k, table.num_rows)
    except (_Unexpected, IndexError, KeyError, TypeError, ValueError):
        return None


def _stitch(big: Big, small: memoryview, empty: memoryview, k: int, num_rows: int) -> list:
    fs, start_s = _footer(small)
    fe, _ = _footer(empty)
    if {f[0] for f in fe} - _FILE_KNOWN:
        raise _Unexpected("file metadata fields")
    rg_s, cols_s = _chunks(fs)
    if _get(big.rg, 3, _I64) != num_rows or _get(rg_s, 3, _I64) != num_rows:
        raise _Unexpected("row counts")
    # Chunks lie end to end from offset 4, in column order, up to the footer.
    spans_s = [_span(cc) for cc in cols_s]
    big_len = sum(len(p) for p in big.pieces)
    if [a for a, _ in spans_s] != [4] + [e for _, e in spans_s[:-1]] or spans_s[-1][1] != start_s:
        raise _Unexpected("small file layout")
    if _span(big.cc) != (4, 4 + big_len):
        raise _Unexpected("big file layout")
    cut = spans_s[k - 1][1] if k else 4  # where the big column goes, in the small file's bytes
    cols = [_shift(cc, 0) for cc in cols_s[:k]]
    cols.append(_shift(big.cc, cut - 4))
    cols += [_shift(cc, big_len) for cc in cols_s[k:]]
    rg = []
    for fid, t, v in rg_s:
        if fid == 1:
            v = (_STRUCT, cols)
        elif fid in (2, 6):
            v = v + _get(big.rg, fid, _I64)
        elif fid == 5 and v != 4:
            raise _Unexpected("row group offset")
        rg.append([fid, t, v])
    meta = []
    for fid, t, v in fe:
        if fid == 3:
            v = num_rows
        elif fid == 4:
            v = (_STRUCT, [rg])
        meta.append([fid, t, v])
    if 3 not in {f[0] for f in fe} or 4 not in {f[0] for f in fe}:
        raise _Unexpected("file metadata fields")
    footer = _encode(meta)
    return [
        small[:cut],
        *big.pieces,
        small[cut:start_s],
        footer,
        len(footer).to_bytes(4, "little"),
        _MAGIC,
    ]
