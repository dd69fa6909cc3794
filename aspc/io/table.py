"""The validated prompt table every reader returns: Arrow columns, ragged lengths."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aspc.io.ragged import RaggedLengths


@dataclass
class SkippedRow:
    row: int  # 0-based row number in the input (JSONL: line number - 1)
    reason: str  # why the row was skipped
    line: int = 0  # where the error would have said it was ("line N": the file's line, a record's number)


# Built with Array.from_buffers: no copy of NumPy data, and none of the pandas
# probe (import pandas: ~0.5 s) that pa.array() runs on first use.
_NUMPY_OF = {pa.int32(): np.int32, pa.int64(): np.int64, pa.float64(): np.float64}


def numpy_column(values: np.ndarray, type: pa.DataType) -> pa.Array:
    """A NumPy array as an Arrow int32/int64/float64 array, sharing its memory."""
    x = np.ascontiguousarray(values, dtype=_NUMPY_OF[type])
    if x.ndim != 1:
        raise ValueError("numpy_column takes a 1-D array")
    return pa.Array.from_buffers(type, x.size, [None, pa.py_buffer(x)])


def column_numpy(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``arr.to_numpy(zero_copy_only=False)``, without pandas for numbers, booleans and strings.

    Zero-copy for numbers without nulls; a float column's nulls come back NaN, strings as an
    object array. ``to_numpy`` itself goes through pyarrow's pandas layer (import pandas:
    ~0.4 s, holding the GIL) for every column.
    """
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return np.array(arr.to_pylist(), dtype=object)
    if isinstance(arr, pa.ChunkedArray) and arr.num_chunks == 0 and _numeric_or_bool(arr.type):
        # combine_chunks() of no chunks imports pandas too
        return np.empty(0, dtype=bool if pa.types.is_boolean(arr.type) else _NUMPY_NAME[str(arr.type)])
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
    if arr.null_count and str(arr.type) in ("float", "double"):
        arr = arr.fill_null(arrow_scalar(np.nan, arr.type))
    if arr.null_count or not _numeric_or_bool(arr.type):
        return arr.to_numpy(zero_copy_only=False)
    if pa.types.is_boolean(arr.type):
        arr = arr.cast(pa.uint8())
        return column_numpy(arr).astype(bool)
    width = np.dtype(_NUMPY_NAME[str(arr.type)])
    data = np.frombuffer(arr.buffers()[1], dtype=width)
    return data[arr.offset : arr.offset + len(arr)]


def _numeric_or_bool(type: pa.DataType) -> bool:
    return str(type) in _NUMPY_NAME or pa.types.is_boolean(type)


def arrow_array(values: Any, type: pa.DataType, mask: np.ndarray | None = None) -> pa.Array:
    """``pa.array(values, type=type, mask=mask)`` for 1-D NumPy numbers or booleans, without its pandas probe.

    The values are cast to ``type`` safely, as pa.array casts them (an overflow or a
    fraction raises); they are shared, not copied, where already of that type.
    """
    x = np.ascontiguousarray(values)
    if x.ndim != 1 or not x.dtype.isnative or x.dtype.kind not in "biuf":
        return pa.array(x, type=type, mask=mask)  # not seen here: pa.array's own handling
    nulls = 0 if mask is None else int(np.count_nonzero(mask))
    valid = pa.py_buffer(np.packbits(~np.asarray(mask, dtype=bool), bitorder="little")) if nulls else None
    if x.dtype == np.bool_:
        data, native = pa.py_buffer(np.packbits(x, bitorder="little")), pa.bool_()
    else:
        data, native = pa.py_buffer(x), pa.from_numpy_dtype(x.dtype)
    arr = pa.Array.from_buffers(native, x.size, [valid, data], null_count=nulls)
    return arr if native == type else arr.cast(type)


def arrow_scalar(value: Any, type: pa.DataType) -> pa.Scalar:
    """``pa.scalar(value, type)`` for a number or a string, without pyarrow's pandas probe.

    Wanted wherever a Python value would go to pyarrow (``fill_null(-1)``, a compute
    kernel's argument): pyarrow asks pandas whether it is one of its types first.
    """
    if pa.types.is_string(type):
        return string_column([value])[0]
    return arrow_array(np.array([value]), type)[0]


_NUMPY_NAME = {
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "halffloat": "float16", "float": "float32", "double": "float64",
}


def string_column(values: Sequence[str]) -> pa.Array:
    """Python strings as an Arrow string array (UTF-8; lone surrogates raise)."""
    data = [s.encode("utf-8") for s in values]
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, data), dtype=np.int64, count=len(data)), out=offsets[1:])
    if offsets[-1] >= 2**31:
        return pa.array(values, pa.large_string()).cast(pa.string())  # over 2 GiB: let Arrow chunk it
    bufs = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(data))]
    return pa.Array.from_buffers(pa.string(), len(data), bufs)


def _strings(values: Sequence[str] | pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values if values.type == pa.string() else values.cast(pa.string())
    return string_column(values)


def _first_duplicate(ids: pa.Array | pa.ChunkedArray) -> str:
    """One id that occurs more than once in ``ids`` (which has one)."""
    counts = pc.value_counts(ids)
    return counts.field("values").filter(pc.greater(counts.field("counts"), 1))[0].as_py()


class PromptTable:
    """Validated prompts of one dataset, in input order.

    Columns are Arrow string arrays (``id_array``, ``prompt_array``,
    ``text_array``) and NumPy arrays; ``ids``, ``prompts`` and ``texts`` give
    them as Python lists (built on first use, for callers that need lists).
    """

    def __init__(
        self,
        ids: Sequence[str] | pa.Array | pa.ChunkedArray,
        prompts: Sequence[str] | pa.Array | pa.ChunkedArray,
        texts: Sequence[str] | pa.Array | pa.ChunkedArray,
        source_rows: np.ndarray,
        prompt_tokens: np.ndarray,
        lengths: RaggedLengths | Sequence[np.ndarray] | None,
        input_hash: str,
        skipped: list[SkippedRow] | None = None,
        token_counter: dict[str, Any] | None = None,
        *,
        ids_unique: bool = False,
    ) -> None:
        self.id_array = _strings(ids)  # unique prompt ids
        self.prompt_array = _strings(prompts)  # stored form: the text, or chat messages as compact JSON
        # Flattened plain text, what predictors read (the prompt itself for text prompts).
        self.text_array = self.prompt_array if texts is prompts else _strings(texts)
        self.source_rows = np.asarray(source_rows, dtype=np.int64)  # 0-based row of each prompt in the input
        self.prompt_tokens = np.asarray(prompt_tokens, dtype=np.int64)  # prompt length in tokens
        if lengths is not None and not isinstance(lengths, RaggedLengths):
            lengths = RaggedLengths.from_arrays(lengths)
        self.lengths = lengths  # known response lengths (>= 1 value per prompt), or None
        self.input_hash = input_hash  # sha256 of the input file's bytes
        self.skipped = skipped if skipped is not None else []  # rows dropped under on_bad_line="skip"
        # How prompt_tokens were counted: {} = estimated from UTF-8 bytes, else the tokenizer's identity.
        self.token_counter = dict(token_counter or {})
        n = len(self.id_array)
        if not (len(self.prompt_array) == len(self.text_array) == self.source_rows.size == self.prompt_tokens.size == n):
            raise ValueError("PromptTable columns differ in length")
        if lengths is not None and len(lengths) != n:
            raise ValueError(f"{len(lengths)} length entries for {n} prompts")
        # A plan keys samples, history and resume by prompt id: a table built by hand (the Python API) is
        # checked here; the readers check in bulk while they read and say so (ids_unique), sparing 1M rows ~0.2 s.
        if not ids_unique and n and len(pc.unique(self.id_array)) != n:
            raise ValueError(f"duplicate prompt id {_first_duplicate(self.id_array)!r}; prompt ids must be unique")
        self._lists: dict[str, list[str]] = {}

    def __len__(self) -> int:
        return len(self.id_array)

    def take(self, rows: np.ndarray) -> PromptTable:
        """The prompts at ``rows`` (int positions) as a table of their own, without known lengths or skips."""
        rows = np.asarray(rows, dtype=np.int64)
        idx = pa.array(rows)
        prompts = self.prompt_array.take(idx)
        # Distinct rows of a table whose ids are unique: checked on the row numbers, not by hashing the ids.
        distinct = rows.size == 0 or (int(rows.min()) >= 0 and int(np.bincount(rows).max()) <= 1)
        return PromptTable(
            ids=self.id_array.take(idx),
            prompts=prompts,
            texts=prompts if self.text_array is self.prompt_array else self.text_array.take(idx),
            source_rows=self.source_rows[rows],
            prompt_tokens=self.prompt_tokens[rows],
            lengths=None,
            input_hash=self.input_hash,
            token_counter=self.token_counter,
            ids_unique=distinct,
        )

    def _list(self, name: str, arr: pa.Array | pa.ChunkedArray) -> list[str]:
        if name not in self._lists:
            self._lists[name] = arr.to_pylist()
        return self._lists[name]

    @property
    def ids(self) -> list[str]:
        return self._list("ids", self.id_array)

    @property
    def prompts(self) -> list[str]:
        return self._list("prompts", self.prompt_array)

    @property
    def texts(self) -> list[str]:
        if self.text_array is self.prompt_array:
            return self.prompts  # text prompts: one list, not two
        return self._list("texts", self.text_array)


def take_rows(table: pa.Table, rows: Sequence[int] | np.ndarray) -> pa.Table:
    """``table``'s rows ``rows`` in that order, every column keeping its type.

    Arrow has no take for view types (``string_view``, ``binary_view``, and types holding them): such a
    column is taken through its non-view twin (``large_string``, ``large_binary``) and cast back, or,
    where Arrow casts neither way (a ``list_view`` of them), through Python values.
    """
    idx = arrow_array(np.asarray(rows, dtype=np.int64), pa.int64())
    cols = []
    for col in table.columns:
        try:
            cols.append(col.take(idx))
            continue
        except pa.ArrowNotImplementedError:
            pass
        try:
            cols.append(col.cast(_without_views(col.type)).take(idx).cast(col.type))
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            values = col.to_pylist()
            cols.append(pa.array([values[i] for i in idx.to_numpy()], col.type))
    return pa.Table.from_arrays(cols, schema=table.schema)


def _without_views(t: pa.DataType) -> pa.DataType:
    """``t`` with every ``string_view`` / ``binary_view`` in it as ``large_string`` / ``large_binary``."""
    if t == pa.string_view():
        return pa.large_string()
    if t == pa.binary_view():
        return pa.large_binary()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_without_views(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_without_views(t.key_type)), t.item_field.with_type(_without_views(t.item_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_without_views(t.value_type)), t.list_size)
    for is_kind, make in ((pa.types.is_list, pa.list_), (pa.types.is_large_list, pa.large_list),
                          (pa.types.is_list_view, pa.list_view), (pa.types.is_large_list_view, pa.large_list_view)):  # fmt: skip
        if is_kind(t):
            return make(t.value_field.with_type(_without_views(t.value_type)))
    return t
