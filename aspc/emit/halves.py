"""One string column's chunk encoded as two halves on two threads, byte for byte the one-thread chunk.

At a million prompts, zstd over the prompt text is most of a plan's write and
runs on one core. Parquet compresses every page on its own, so a column chunk
cut at one of its page boundaries is two runs of pages that can be encoded
apart. The cut must fall where the one-thread writer would end a page anyway:

- Arrow buffers values in batches of ``write_batch_size`` rows and ends a data
  page after the first batch that brings it to ``data_page_size`` bytes
  (PLAIN byte arrays: 4 + length bytes per value);
- a column starts dictionary-encoded and falls back to PLAIN after the first
  batch whose distinct values reach ``dictionary_pagesize_limit`` bytes of
  dictionary; prompts are nearly all distinct, so that is a few batches in.

The first half [0, m) is encoded as usual; the second [m, n) with no
dictionary, which is what the writer does after the fallback. ``m`` is a page
end predicted from the value lengths, and both halves' page headers are then
checked against the prediction (row counts of every page, the fallback row,
the last page of the first half full): any difference, or a column the rule
does not cover (a dictionary that never falls back, nulls, other writer
options), returns None and the caller encodes the column on one thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aspc.emit import stitch as T

# Below this many rows one thread is faster than two plus the checks.
HALVES_ROWS = 200_000

# Arrow's writer defaults (parquet/properties.h); options that change them are refused.
_BATCH = 1024
_PAGE_BYTES = 1 << 20
_DICT_BYTES = 1 << 20
_REFUSED = ("write_batch_size", "data_page_size", "dictionary_pagesize_limit", "data_page_version", "column_encoding")
# The fallback must come within this many batches, or the column is left whole.
_MAX_DICT_BATCHES = 64

# Page types and encodings (parquet.thrift).
_DATA_PAGE, _DICTIONARY_PAGE = 0, 2
_PLAIN, _PLAIN_DICTIONARY, _RLE_DICTIONARY = 0, 2, 8


def _offsets(arr: pa.Array) -> np.ndarray:
    """The string offsets of ``arr``'s rows (a view of its buffer)."""
    return np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]


def _plain_bytes(offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """PLAIN-encoded bytes (4-byte length + data per value) of rows [0, r) for each r in ``rows``."""
    return offsets[rows].astype(np.int64) - int(offsets[0]) + 4 * rows.astype(np.int64)


def _fallback_row(arr: pa.Array) -> int | None:
    """The row after which the writer drops its dictionary (a batch end), or None."""
    seen = arr.slice(0, 0)
    dict_bytes = 0
    for j in range(_MAX_DICT_BATCHES):
        lo, hi = j * _BATCH, min(len(arr), (j + 1) * _BATCH)
        if lo >= hi:
            return None
        grown = pc.unique(pa.concat_arrays([seen, arr.slice(lo, hi - lo)]))
        new = grown.slice(len(seen))
        dict_bytes += int(pc.sum(pc.binary_length(new)).as_py() or 0) + 4 * len(new)
        seen = grown
        if dict_bytes >= _DICT_BYTES:
            return hi
    return None


def _page_ends(offsets: np.ndarray, start: int) -> np.ndarray:
    """Rows where PLAIN data pages end, for pages starting at row ``start`` (a batch boundary)."""
    n = offsets.size - 1
    if start >= n:
        return np.empty(0, dtype=np.int64)
    edges = np.r_[np.arange(start, n, _BATCH), n]
    per_batch = np.diff(_plain_bytes(offsets, edges))
    ends = []
    acc = 0
    for k, b in enumerate(per_batch.tolist()):
        acc += b
        if acc >= _PAGE_BYTES:
            ends.append(int(edges[k + 1]))
            acc = 0
    if not ends or ends[-1] != n:
        ends.append(n)  # the last page, flushed when the column closes
    return np.asarray(ends, dtype=np.int64)


def split_row(arr: pa.Array, kwargs: dict) -> tuple[int, int, np.ndarray] | None:
    """(fallback row, cut row m, predicted PLAIN page ends) for ``arr``, or None if it is not to be cut."""
    if (
        len(arr) < HALVES_ROWS
        or not pa.types.is_string(arr.type)
        or arr.null_count
        or not kwargs.get("use_dictionary", True)
        or any(kwargs.get(k) is not None for k in _REFUSED)
    ):
        return None
    offsets = _offsets(arr)
    p0 = _fallback_row(arr)
    if p0 is None:
        return None
    ends = _page_ends(offsets, p0)
    inner = ends[:-1]  # a cut at the column's end would leave nothing to the second half
    if inner.size == 0:
        return None
    # The page end that halves the bytes to compress.
    half = _plain_bytes(offsets, np.array([len(arr)]))[0] / 2
    m = int(inner[np.argmin(np.abs(_plain_bytes(offsets, inner) - half))])
    return p0, m, ends


def _pages(data: memoryview, cc: list) -> list[tuple[int, int, int, int]]:
    """(page type, encoding, rows, uncompressed bytes) of every page of a column chunk."""
    md = T._get(cc, 3, T._STRUCT)
    pos, end = T._span(cc)
    raw = data[pos:end]  # a view: headers are read in place, the pages never copied
    pos, out = 0, []
    while pos < len(raw):
        header, pos = T._read_struct(raw, pos)
        typ = T._get(header, 1, T._I32)
        size = T._get(header, 3, T._I32)
        body = T._get(header, 5 if typ == _DATA_PAGE else 7, T._STRUCT)
        out.append((typ, T._get(body, 2, T._I32), T._get(body, 1, T._I32), T._get(header, 2, T._I32)))
        pos += size
    if pos != len(raw) or sum(p[2] for p in out if p[0] == _DATA_PAGE) != T._get(md, 5, T._I64):
        raise T._Unexpected("pages")
    return out


def _check(first: T.Big, second: T.Big, p0: int, m: int, ends: np.ndarray) -> None:
    """Both halves' pages are the ones the prediction says the one-thread writer writes."""
    a, b = _pages(first.data, first.cc), _pages(second.data, second.cc)
    if not a or a[0][0] != _DICTIONARY_PAGE:
        raise T._Unexpected("no dictionary page")
    dict_rows, k = 0, 1
    while k < len(a) and a[k][0] == _DATA_PAGE and a[k][1] in (_PLAIN_DICTIONARY, _RLE_DICTIONARY):
        dict_rows += a[k][2]
        k += 1
    if dict_rows != p0:
        raise T._Unexpected("fallback row")
    rows = np.cumsum([p[2] for p in a[k:]] + [p[2] for p in b]) + p0
    if any(p[:2] != (_DATA_PAGE, _PLAIN) for p in a[k:] + b) or not np.array_equal(rows, ends):
        raise T._Unexpected("page ends")
    # The first half's last page must be one the writer ends by size, not by closing the file.
    if k == len(a) or a[-1][3] < _PAGE_BYTES or p0 + sum(p[2] for p in a[k:]) != m:
        raise T._Unexpected("cut")


def _merge_stats(a: list, b: list) -> list:
    """Column statistics of the two halves as one: min of mins, max of maxes, nulls added."""
    got = {f[0] for f in a}
    if got != {f[0] for f in b} or got - {3, 5, 6, 7, 8} or not {5, 6} <= got:
        raise T._Unexpected("statistics fields")  # legacy or dropped min/max: not merged
    out = []
    for fid, t, v in a:
        w = T._get(b, fid, t) if t not in (T._TRUE, T._FALSE) else next(f[2] for f in b if f[0] == fid)
        if fid == 3:
            v = v + w
        elif fid == 5:
            v = max(v, w)
        elif fid == 6:
            v = min(v, w)
        elif v is not True or w is not True:  # 7, 8: exact min/max only
            raise T._Unexpected("inexact statistics")
        out.append([fid, t, v])
    return out


def _merge_encoding_stats(a: tuple, b: tuple) -> tuple:
    """Page counts per (page type, encoding) of the two halves added."""
    et, items = a
    out = [[list(f) for f in s] for s in items]
    index = {(T._get(s, 1, T._I32), T._get(s, 2, T._I32)): s for s in out}
    if len(index) != len(out):
        raise T._Unexpected("encoding stats")
    for s in b[1]:
        key = (T._get(s, 1, T._I32), T._get(s, 2, T._I32))
        if key not in index or {f[0] for f in s} != {1, 2, 3}:
            raise T._Unexpected("encoding stats")
        T._set(index[key], 3, T._get(index[key], 3, T._I32) + T._get(s, 3, T._I32))
    return (et, out)


def _merge_size_stats(a: list, b: list) -> list:
    if {f[0] for f in a} != {f[0] for f in b}:
        raise T._Unexpected("size statistics fields")
    out = []
    for fid, t, v in a:
        w = T._get(b, fid, t)
        if fid == 1:
            v = v + w
        elif fid in (2, 3) and len(v[1]) == len(w[1]):
            v = (v[0], [x + y for x, y in zip(v[1], w[1], strict=True)])
        else:
            raise T._Unexpected("size statistics")
        out.append([fid, t, v])
    return out


def _merge_meta(a: list, b: list) -> list:
    """ColumnMetaData of the chunk whose pages are ``a``'s followed by ``b``'s (offsets: ``a``'s)."""
    if {f[0] for f in b} - {1, 2, 3, 4, 5, 6, 7, 9, 12, 13, 16}:
        raise T._Unexpected("second half's metadata")
    out = []
    for fid, t, v in a:
        if fid in (5, 6, 7):
            v = v + T._get(b, fid, t)
        elif fid in (1, 3, 4):
            if v != T._get(b, fid, t):
                raise T._Unexpected(f"metadata field {fid}")
        elif fid == 2:
            if not set(T._get(b, 2, T._LIST)[1]) <= set(v[1]):
                raise T._Unexpected("encodings")
        elif fid == 12:
            v = _merge_stats(v, T._get(b, 12, T._STRUCT))
        elif fid == 13:
            v = _merge_encoding_stats(v, T._get(b, 13, T._LIST))
        elif fid == 16:
            v = _merge_size_stats(v, T._get(b, 16, T._STRUCT))
        elif fid not in (9, 11):
            raise T._Unexpected(f"metadata field {fid}")
        out.append([fid, t, v])
    if {f[0] for f in b} & {12, 13, 16} - {f[0] for f in a}:
        raise T._Unexpected("fields only in the second half")
    return out


def _joined(first: T.Big, second: T.Big) -> T.Big:
    rg = []
    for fid, t, v in first.rg:
        if fid in (2, 3, 6):
            v = v + T._get(second.rg, fid, T._I64)
        rg.append([fid, t, v])
    cc = [[fid, t, _merge_meta(v, T._get(second.cc, 3, T._STRUCT)) if fid == 3 else v] for fid, t, v in first.cc]
    return T.Big(first.data, first.pieces + second.pieces, rg, cc)


def encode_in_halves(table: pa.Table, kwargs: dict, to_buffer: Callable[[pa.Table, dict], memoryview]) -> T.Big | None:
    """The one column of ``table`` encoded as two halves on two threads, or None (encode it whole)."""
    if table.num_columns != 1 or table.column(0).num_chunks != 1:
        return None
    cut = split_row(table.column(0).chunk(0), kwargs)
    if cut is None:
        return None
    p0, m, ends = cut
    box: dict[str, Any] = {}

    def second_half() -> None:
        try:
            box["b"] = to_buffer(table.slice(m), {**kwargs, "use_dictionary": False})
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=second_half, daemon=True)
    thread.start()
    try:
        first = to_buffer(table.slice(0, m), kwargs)
    finally:
        thread.join()
    if "error" in box:
        raise box["error"]
    try:
        a, b = T.whole(first), T.whole(box["b"])
        _check(a, b, p0, m, ends)
        return _joined(a, b)
    except (T._Unexpected, IndexError, KeyError, TypeError, ValueError, StopIteration):
        return None
