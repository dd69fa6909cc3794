"""Bulk readers: Parquet and JSONL straight into Arrow columns, validated with pyarrow.compute.

Each function returns the :class:`PromptTable` that the row-by-row reader
(:mod:`aspc.io.rows`) would return, or ``None`` when the data holds anything
it cannot vouch for (a bad row, a null, an unexpected type, a duplicate id):
the caller then reads the file row by row, which words the error exactly as
before or skips the bad rows. So bulk reading changes speed, never results.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aspc.arrow_files import arrow_file
from aspc.io import gather
from aspc.io.blank import PY_SPACE, _has_blank, _has_blank_exact  # noqa: F401 - PY_SPACE, _has_blank_exact re-exported
from aspc.io.bulk_chat import chat_columns
from aspc.io.bulk_columns import (
    CHAT,
    CHAT_KEYS,
    JSON_BLOCK,
    Bail,
    check,
    is_utf8,
    json_kind,
    lengths_column,
    line_rows,
    one_chunk,
)
from aspc.io.json_keys import only_keys_in
from aspc.io.json_lines import read_alike
from aspc.io.rows import (
    CHAT_ROLES,
    DEFAULT_ID_FIELD,
    MAX_PROMPT_BYTES,
    VERL_INDEX,
    _RowError,
    content_id,
    estimate_tokens,
    parse_prompt_value,
)
from aspc.io.table import PromptTable, column_numpy, string_column

# Parquet is read through a buffer of this size.
_PARQUET_BUFFER = 1 << 20
# Types inferred from the start of a JSONL file, enough lines to see each field.
_JSON_PREFIX = 1 << 20
# Files under this are scanned (aspc.io.json_lines) inline, larger ones on a thread beside the parse.
_SCAN_THREAD_BYTES = 8 << 20


def _single_chunks(tab: pa.Table) -> pa.Table:
    """One chunk per column, as the row reader's arrays are: plans written from
    them are then byte-identical whatever the file's layout. Columns already
    in one chunk are not copied (Table.combine_chunks would copy them)."""
    return pa.Table.from_arrays([one_chunk(tab[name]) for name in tab.column_names], names=tab.column_names)


def _valid_strings(arr: pa.Array) -> pa.Array:
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    check(pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type))
    try:
        arr.validate(full=True)  # UTF-8; the row reader words the error
    except pa.ArrowInvalid:
        raise Bail from None
    return arr.cast(pa.string()) if pa.types.is_large_string(arr.type) else arr


def _prompts(tab: pa.Table, prompt_field: str) -> tuple[pa.Array, pa.Array]:
    """Stored prompts and plain texts (the same array for text prompts)."""
    names = tab.column_names
    col = None
    if prompt_field in names and tab[prompt_field].null_count == 0:
        col = tab[prompt_field]
    elif (prompt_field not in names or tab[prompt_field].null_count == len(tab)) and "messages" in names:
        col = tab["messages"] if tab["messages"].null_count == 0 else None
    check(col is not None)
    arr = one_chunk(col)
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        built = chat_columns(arr, CHAT_ROLES)
        if built is not None:  # the common chats (role and content strings) by Arrow kernels, checked as text is
            stored, texts = built
            texts = _valid_strings(texts)  # every content is in a text: UTF-8 there is UTF-8 everywhere
            check(not _has_blank(texts))
            check(pc.max(pc.binary_length(stored)).as_py() <= MAX_PROMPT_BYTES)
            return stored, texts
        # Other chats: canonical JSON per row, exactly as the row reader builds it.
        stored, texts = [], []
        try:
            for value in arr.to_pylist():
                s, t = parse_prompt_value(value)
                stored.append(s)
                texts.append(t)
        except (_RowError, UnicodeDecodeError, ValueError, OverflowError, pa.ArrowException):
            # UnicodeDecodeError: a message's text is not UTF-8; ValueError: a struct that names a field twice;
            # OverflowError: a date past Python's range
            raise Bail from None
        return string_column(stored), string_column(texts)
    arr = _valid_strings(arr)
    check(not _has_blank(arr))
    check(pc.max(pc.binary_length(arr)).as_py() <= MAX_PROMPT_BYTES)
    return arr, arr


def _id_strings(col: pa.Array) -> pa.Array:
    if pa.types.is_integer(col.type):
        return col.cast(pa.string())
    arr = _valid_strings(col)
    check(not _has_blank(arr))
    # A NUL marks aspc's own rows in a plan (rows._check_no_nul); the row reader words the error.
    check(not pc.any(pc.match_substring(arr, "\x00")).as_py())
    return arr


def _ids(tab: pa.Table, id_field: str, stored: pa.Array) -> pa.Array:
    """Ids from the id field, else verl's extra_info.index, else content hashes."""
    names = tab.column_names
    if id_field in names and tab[id_field].null_count != len(tab):
        check(tab[id_field].null_count == 0)
        return _id_strings(one_chunk(tab[id_field]))
    info = VERL_INDEX[0]
    if info in names:
        # The row reader consults extra_info here and refuses a cell holding text that is not UTF-8, in any field.
        check(_utf8_throughout(one_chunk(tab[info])))
    if info in names and pa.types.is_struct(tab[info].type):
        arr = one_chunk(tab[info])
        check(arr.null_count == 0 and arr.type.get_field_index(VERL_INDEX[1]) >= 0)
        index = arr.field(VERL_INDEX[1])
        check(index.null_count == 0 and (pa.types.is_integer(index.type) or pa.types.is_string(index.type)))
        return _id_strings(index)
    return string_column([content_id(s) for s in stored.to_pylist()])


def _utf8_throughout(arr: pa.Array) -> bool:
    """Whether every string in ``arr``, nested ones included, is UTF-8 (a Parquet reader never checks)."""
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _all_distinct(ids: pa.Array) -> bool:
    return len(pc.unique(ids)) == len(ids)  # hash-based; twice as fast as count_distinct


def table_from_columns(
    tab: pa.Table, source_rows: np.ndarray, *, prompt_field: str, id_field: str, length_field: str | None
) -> PromptTable | None:
    """A PromptTable from Arrow columns, or None if any row needs the row reader."""
    unique = None
    try:
        check(len(tab) > 0)
        # A named id field missing from some row: the row reader words it.
        check(id_field == DEFAULT_ID_FIELD or (id_field in tab.column_names and tab[id_field].null_count == 0))
        if id_field in tab.column_names and tab[id_field].null_count != len(tab):
            # Ids from their own field: checked for duplicates on a thread while the prompts are checked.
            ids = _ids(tab, id_field, None)
            unique = gather.Background(_all_distinct, ids, threaded=len(ids) >= gather.THREAD_ROWS)
        stored, texts = _prompts(tab, prompt_field)
        if unique is None:
            ids = _ids(tab, id_field, stored)
            unique = gather.Background(_all_distinct, ids, threaded=False)
        lengths = lengths_column(tab, length_field) if length_field else None
        check(unique.result())
    except Bail:
        if unique is not None:
            with contextlib.suppress(Exception):
                unique.result()  # no thread left running; the row reader words any error
        return None
    nbytes = column_numpy(pc.binary_length(texts))
    return PromptTable(
        ids=ids,
        prompts=stored,
        texts=stored if texts is stored else texts,
        source_rows=source_rows,
        prompt_tokens=estimate_tokens(nbytes),
        lengths=lengths,
        input_hash="",
        ids_unique=True,  # _all_distinct above
    )


def _wanted(names: list[str], prompt_field: str, id_field: str, length_field: str | None) -> list[str]:
    want = [prompt_field, "messages", id_field, VERL_INDEX[0]] + ([length_field] if length_field else [])
    return [c for c in dict.fromkeys(want) if c in names]


def read_parquet_bulk(
    path: Path, *, prompt_field: str, id_field: str, length_field: str | None
) -> PromptTable | None:
    import pyarrow.parquet as pq

    try:
        # Streamed in batches through a small buffer: the whole column chunk is
        # never held compressed and decoded at once (peak ~ the decoded size).
        # A name that is not UTF-8 (legal on Linux) is opened by its bytes: pyarrow refused the str path.
        with arrow_file(path) as src:
            pf = pq.ParquetFile(src, pre_buffer=False, buffer_size=_PARQUET_BUFFER)
            names = pf.schema_arrow.names
            if len(set(names)) != len(names):
                return None
            columns = _wanted(names, prompt_field, id_field, length_field)
            meta = pf.metadata
            # A batch per row group: one chunk per column, nothing to merge after.
            rows = max([meta.row_group(i).num_rows for i in range(meta.num_row_groups)] + [1])
            batches = list(pf.iter_batches(batch_size=rows, columns=columns, use_threads=True))
        tab = pa.Table.from_batches(batches, schema=pa.schema([pf.schema_arrow.field(c) for c in columns]))
        del batches
        tab = _single_chunks(tab)
    except MemoryError:  # pyarrow's ArrowMemoryError too: the row reader would need more, not less
        raise
    except (pa.ArrowException, OSError, ValueError):
        return None
    rows = np.arange(len(tab), dtype=np.int64)
    return table_from_columns(tab, rows, prompt_field=prompt_field, id_field=id_field, length_field=length_field)


def _json_schema(data: bytes, prompt_field: str, id_field: str, length_field: str | None) -> pa.Schema | None:
    """Parse types of the fields that matter, from the file's first lines; None: give up.

    Fields not seen there are typed null, so a later value fails the bulk
    parse and the row reader takes over; every other field is skipped.
    """
    roles = {prompt_field: "prompt", "messages": "prompt", id_field: "id"}
    if length_field:
        roles[length_field] = "length"
    seen: dict[str, pa.DataType] = {}
    has_id = False
    for line in data[:_JSON_PREFIX].split(b"\n")[:-1] or [data]:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            return None
        if not isinstance(rec, dict):
            return None
        has_id = has_id or rec.get(id_field) is not None
        for name, role in [*roles.items(), (VERL_INDEX[0], "info")]:
            v = rec.get(name)
            if v is None:
                continue
            t = json_kind(v, role)
            if t is None or seen.setdefault(name, t) != t:
                return None
    fields = [pa.field(name, seen.get(name, pa.null())) for name in roles]
    if not has_id:
        # Typed null when unseen, like the fields above: an index that first appears later fails the parse
        # (the row reader refuses ids on some rows only); ignored, it was dropped and content ids taken.
        fields.append(pa.field(VERL_INDEX[0], seen.get(VERL_INDEX[0], pa.null())))
    return pa.schema(fields)


def read_jsonl_bulk(
    data: bytes | list[bytes], *, prompt_field: str, id_field: str, length_field: str | None
) -> PromptTable | None:
    """``data``: the whole file (its UTF-8 validity is checked here).

    Given as a one-item list, the bytes are taken out of it and dropped once
    parsed, so the file's bytes and the merged columns are never held at once.
    """
    if isinstance(data, list):
        data = data.pop()
    parsed = _parse_jsonl(data, prompt_field=prompt_field, id_field=id_field, length_field=length_field)
    del data
    if parsed is None:
        return None
    tab, rows = parsed
    tab = _single_chunks(tab)
    return table_from_columns(tab, rows, prompt_field=prompt_field, id_field=id_field, length_field=length_field)


def _scanned(alike: gather.Background) -> bool:
    """The byte scan's answer; no (the row reader reads the file) if it failed at all, e.g. an import of
    Numba's on its thread meeting the kernel warm-up's (aspc.io.gather.kernels_warmed_for)."""
    try:
        return bool(alike.result())
    except Exception:  # noqa: BLE001 - a scan that did not finish vouches for nothing
        return False


def _parse_jsonl(
    data: bytes, *, prompt_field: str, id_field: str, length_field: str | None
) -> tuple[pa.Table, np.ndarray] | None:
    import pyarrow.json as pj

    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    buf = pa.py_buffer(data)
    if not is_utf8(buf):
        return None
    schema = _json_schema(data, prompt_field, id_field, length_field)
    if schema is None:
        return None
    chats = [f.name for f in schema if f.type == CHAT]
    if chats and not only_keys_in(data, chats, list(CHAT_KEYS)):
        return None  # a message holds another key, which pyarrow would drop: the row reader keeps it
    # Lines pyarrow reads and json.loads would not (two objects on one, Inf, deep nesting), checked beside the parse.
    alike = gather.Background(read_alike, data, threaded=len(data) >= _SCAN_THREAD_BYTES)
    try:
        tab = pj.read_json(
            pa.BufferReader(buf),
            read_options=pj.ReadOptions(block_size=JSON_BLOCK),
            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except MemoryError:
        raise
    except (pa.ArrowException, ValueError):
        return None
    finally:
        scanned = _scanned(alike)  # joined on every way out: no scan left running
    if not scanned:
        return None
    rows = line_rows(data, len(tab))
    return None if rows is None else (tab, rows)


