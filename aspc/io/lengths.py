"""Read observed response lengths keyed by prompt id.

Sources: any dataset with an id field and a length field (a number or a list
of sampled lengths), or an aspc run log directory, whose ``samples/`` parts
hold one row per generated sample with ``prompt_id`` and ``response_len``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from aspc.arrow_files import read_parquet_parts
from aspc.errors import InputError, epochs_root_hint, short_reason
from aspc.io.prompts import check_field_names
from aspc.io.readers import BadRecord, detect_format, iter_numbered_records
from aspc.io.rows import MAX_LENGTH, _RowError, parse_length, refuse_twice
from aspc.io.runlog_meta import (
    check_runlog_version,
    committed,
    is_runlog_meta,
    part_number,
    part_ranges,
    refuse_runlog_meta,
)
from aspc.io.table import arrow_array, column_numpy


def committed_sample_parts(path: str | os.PathLike, *, require_meta: bool = False) -> list[Path]:
    """The ``samples/`` parts of the run log at ``path`` that its ``meta.json`` committed.

    A run killed before a commit leaves parts no commit covers (and a crash
    during compaction leaves replaced ones); ``meta.json``'s ``parts`` ranges
    say which are live (the format is :mod:`aspc.runtime.record.runlog`'s;
    read here without importing the runtime). A log without ranges (format
    1.0) had only whole, live parts. A bare ``samples/`` directory with no
    ``meta.json`` (not written by ``aspc run``) has no commits to consult and
    is read whole, unless ``require_meta``: training pairs need the log's
    plan too, so there a directory without ``meta.json`` is no run log.
    """
    import json

    path = Path(path)
    samples = path / "samples"
    meta_path = path / "meta.json"
    has_meta = meta_path.is_file()
    if not has_meta and (require_meta or not samples.is_dir()):
        missing = "meta.json" if require_meta else "samples/"
        hint = epochs_root_hint(path) or "; pass a run log or a dataset"
        raise InputError(f"{path}: a directory but not an aspc run log (no {missing}){hint}")
    if not has_meta:
        return sorted(f for f in samples.iterdir() if f.suffix == ".parquet" and not f.name.startswith("."))
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested too deep
        raise InputError(f"{path}: corrupt run log meta.json; pass a readable run log") from None
    if not is_runlog_meta(meta):
        raise InputError(f"{path}: meta.json is not an aspc run log's")
    check_runlog_version(meta, path, InputError)
    # A log whose run committed nothing yet may have no samples/ at all; committed() says
    # whether parts its meta.json counts are gone.
    files = sorted(f for f in samples.iterdir() if part_number(f) is not None) if samples.is_dir() else []
    return committed(files, "samples", part_ranges(meta, path, InputError), path, InputError)


def _read_run_log(path: Path) -> dict[str, np.ndarray]:
    keys, values, offsets = run_log_groups(path)
    bounds = offsets.tolist()
    return dict(zip(keys, [values[s:e] for s, e in zip(bounds[:-1], bounds[1:], strict=True)], strict=True))


def run_log_groups(path: str | os.PathLike) -> tuple[list[str], np.ndarray, np.ndarray]:
    """A run log's lengths by prompt id, as ``(ids, values, offsets)``: ids sorted, ``values[offsets[i]:offsets[i+1]]``
    the lengths of ``ids[i]`` in log order (what :func:`read_lengths` gives, before its dict)."""
    import pyarrow as pa

    path = Path(path)
    files = committed_sample_parts(path)
    empty = ([], np.empty(0), np.zeros(1, dtype=np.int64))
    if not files:
        return empty
    try:
        table = read_parquet_parts(files, ["prompt_id", "response_len"])
    except MemoryError:  # pa.ArrowMemoryError too: out of memory is no damaged log
        raise
    except (pa.ArrowException, OSError, KeyError) as exc:
        raise InputError(
            f"{path}: unreadable run log samples ({short_reason(exc, limit=120)}); the run log is damaged: "
            "run the plan again with a new --log"
        ) from None
    if table.num_rows == 0:
        return empty
    if table.column("prompt_id").null_count:  # only a hand-made samples/ folder: aspc writes an id on every sample
        raise InputError(f"{path}: run log samples hold a null prompt_id; the run log is damaged: "
                         "run the plan again with a new --log")  # fmt: skip
    lens = column_numpy(table.column("response_len")).astype(np.float64)  # to_numpy imports pandas
    _check_run_log_lengths(path, table.column("response_len"), lens)
    grouped = _group_string_ids(table.column("prompt_id"))
    if grouped is None:  # not a plain string column: sorted as Python objects, as always
        ids = np.asarray(table.column("prompt_id").to_pylist(), dtype=object)
        order = np.argsort(ids, kind="stable")
        ids, lens = ids[order], lens[order]
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        return [str(ids[s]) for s in starts], lens, np.r_[starts, len(ids)].astype(np.int64)
    keys, key = grouped
    order = np.argsort(key, kind="stable")  # stable: each prompt's lengths stay in log order
    sizes = np.bincount(key.reshape(-1), minlength=len(keys))
    return keys, lens[order], np.r_[0, np.cumsum(sizes)].astype(np.int64)


def _check_run_log_lengths(path: Path, col, lens: np.ndarray) -> None:
    """Refuse a run log whose response_len is null, negative or above MAX_LENGTH, as a dataset's length is."""
    if col.null_count:  # only a hand-made or damaged part: aspc writes a length on every sample
        raise InputError(f"{path}: run log samples hold a null response_len; the run log is damaged: "
                         "run the plan again with a new --log")  # fmt: skip
    bad = np.flatnonzero((lens < 0) | (lens > MAX_LENGTH))
    if bad.size:
        x = int(column_numpy(col.slice(int(bad[0]), 1))[0])  # the int64 as written: float64 rounds 2**62
        why = "is negative" if x < 0 else f"is above {MAX_LENGTH:,} tokens"
        raise InputError(f"{path}: run log samples hold response_len {x}, which {why} (lengths are token counts "
                         f"0..{MAX_LENGTH:,}); the run log is damaged: run the plan again with a new --log")  # fmt: skip


def _group_string_ids(col) -> tuple[list[str], np.ndarray] | None:
    """(distinct ids sorted, each row's place among them) of a string column with no nulls; None otherwise.

    Sorting a few hundred thousand Python strings took seconds. Arrow sorts strings by their
    UTF-8 bytes, which order as their code points, as Python's sort does.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)) or col.null_count:
        return None
    try:
        arr = pa.concat_arrays(col.chunks) if col.num_chunks != 1 else col.chunk(0)
        enc = pc.dictionary_encode(arr)
    except MemoryError:  # pa.ArrowMemoryError too: the Python sort below would need more
        raise
    except pa.ArrowException:  # past 2 GiB of ids in one array
        return None
    by_text = column_numpy(pc.sort_indices(enc.dictionary)).astype(np.int64)
    rank = np.empty_like(by_text)
    rank[by_text] = np.arange(by_text.size, dtype=np.int64)
    return enc.dictionary.take(arrow_array(by_text, pa.int64())).to_pylist(), rank[column_numpy(enc.indices).astype(np.int64)]


def _refuse_plan(path: Path) -> None:
    """An aspc plan holds predictions, not observed lengths ("line 1: missing id field 'id'" said nothing of it)."""
    if path.suffix.lower() != ".parquet" or not path.is_file():
        return
    import pyarrow.parquet as pq

    from aspc.arrow_files import arrow_file

    try:
        with arrow_file(path) as f:  # a name that is not UTF-8: pyarrow refused the str path
            meta = pq.read_schema(f).metadata or {}
    except Exception:  # noqa: BLE001 - not readable as Parquet: the reader below says why
        return
    if b"aspc.schema_version" in meta:
        raise InputError(f"{path.name}: an aspc plan, which holds predicted lengths, not observed ones; pass a run "
                         "log directory (aspc run --log) or a dataset of observed lengths")  # fmt: skip


def read_lengths(
    path: str | os.PathLike, *, id_field: str = "id", length_field: str = "length", option: str = "--length-field",
    own_id_field: bool = True,
) -> dict[str, np.ndarray]:
    """Map prompt id -> observed lengths (float64 array, one or more values).

    ``option`` is the option that names ``length_field``, for the messages.
    ``own_id_field``: ``--id-field`` names this file's id field alone (``aspc run``'s
    ``--actual-lengths``); else it is the input's too, and a missing one is fixed in this file.

    A prompt id seen on several rows accumulates all its lengths.
    """
    check_field_names(length_field, option)
    path = Path(path)
    if path.is_dir():
        return _read_run_log(path)
    _refuse_plan(path)
    refuse_runlog_meta(path)
    fmt = detect_format(path)
    from_text = fmt == "csv"
    fast_reader = {"parquet": _parquet_lengths, "jsonl": _jsonl_lengths}.get(fmt)
    fast = fast_reader(path, id_field, length_field) if fast_reader is not None else None
    if fast is not None:
        return fast
    out: dict[str, list[np.ndarray]] = {}
    for _row, line, rec in iter_numbered_records(path, (id_field, length_field), columns=(id_field, length_field)):
        where = f"{path.name}: line {line}"
        if isinstance(rec, BadRecord):
            raise InputError(f"{where}: {rec.reason}")
        if not isinstance(rec, dict):
            raise InputError(f"{where}: expected an object with {id_field!r} and {length_field!r}")
        try:
            refuse_twice(rec, (id_field, length_field))
        except _RowError as exc:
            raise InputError(f"{where}: {exc}") from None
        pid = rec.get(id_field)
        if id_field not in rec:
            if own_id_field:
                raise InputError(f"{where}: missing id field {id_field!r}; pass --id-field NAME")
            # --id-field names the input's field as well: passing it for this file breaks the input.
            raise InputError(f"{where}: missing id field {id_field!r}, the input's id field, by which its lengths "
                             f"are matched; name the ids {id_field!r} in this file too")  # fmt: skip
        # Present but unusable: "missing ... pass --id-field" named a flag the user had right.
        if pid is None:
            raise InputError(f"{where}: id field {id_field!r} is null; give every row an id")
        if isinstance(pid, bool) or not isinstance(pid, (str, int)):
            raise InputError(f"{where}: id field {id_field!r} must be a string or integer, got {type(pid).__name__}; "
                             "fix the row's id")  # fmt: skip
        try:
            lens = parse_length(rec.get(length_field), length_field, from_text, option, present=length_field in rec)
        except _RowError as exc:
            raise InputError(f"{where}: {exc}") from None
        out.setdefault(str(pid), []).append(lens)
    if not out:
        raise InputError(f"{path.name}: no rows; give a file with at least one id and length")
    return {k: np.concatenate(v) for k, v in out.items()}


def _parquet_lengths(path: Path, id_field: str, length_field: str) -> dict[str, np.ndarray] | None:
    """:func:`read_lengths` of a Parquet file read by column; None where any row needs the row reader.

    Row by row (a record dict and a parsed list per row) 300,000 rows took 7 s. Only a file whose
    every row the row reader would take is read here: integer or string ids, numbers or non-empty
    lists of numbers within 0..MAX_LENGTH, no nulls. Anything else, an unreadable file included, goes
    to the row reader, which refuses it with its own message.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    from aspc.io.readers import read_parquet_table
    from aspc.io.rows import MAX_LENGTH

    if not path.is_file() or path.stat().st_size == 0:
        return None
    try:
        table = read_parquet_table(path, (id_field, length_field))  # what the row reader reads, too
    except InputError:
        return None
    names = table.schema.names
    if table.num_rows == 0 or id_field not in names or length_field not in names:
        return None
    if not all(_plain(t) for t in table.schema.types):  # the row reader may refuse converting it (a timestamp)
        return None
    ids, lens = table.column(id_field), table.column(length_field)
    it, lt = ids.type, lens.type
    if ids.null_count or lens.null_count or not (pa.types.is_string(it) or pa.types.is_large_string(it) or
                                                 pa.types.is_integer(it)):  # fmt: skip
        return None
    lens = pa.concat_arrays(lens.chunks) if lens.num_chunks != 1 else lens.chunk(0)
    if pa.types.is_list(lt) or pa.types.is_large_list(lt):
        sizes = column_numpy(pc.list_value_length(lens)).astype(np.int64)
        values = lens.flatten()
    else:
        sizes, values = np.ones(len(lens), dtype=np.int64), lens
    vt = values.type
    if values.null_count or np.any(sizes == 0) or not (pa.types.is_integer(vt) or vt in (pa.float32(), pa.float64())):
        return None
    raw = column_numpy(values)
    flat = raw.astype(np.float64)
    if raw.size and (not np.all(np.isfinite(flat)) or raw.min() < 0 or raw.max() > MAX_LENGTH):
        return None
    try:
        keys = [str(k) for k in ids.to_pylist()]
    except UnicodeDecodeError:  # an id that is not UTF-8
        return None
    return _by_id(keys, flat, np.r_[0, np.cumsum(sizes)])


def _jsonl_lengths(path: Path, id_field: str, length_field: str) -> dict[str, np.ndarray] | None:
    """:func:`read_lengths` of a JSON-lines file read by column; None where any row needs the row reader.

    json.loads row by row took 3.4 s for 300,000 rows of 8 lengths (~0.6 s so). Only a file whose every row
    the row reader would take, read the same, is read here (:mod:`aspc.io.bulk_lengths` says which); anything
    else, an unreadable file included, goes to the row reader, which refuses it with its own message.
    """
    from aspc.io.bulk_lengths import jsonl_lengths

    try:
        if not path.is_file() or path.stat().st_size == 0:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    got = jsonl_lengths(data, id_field, length_field)
    del data
    if got is None:
        return None
    keys, lengths = got
    return _by_id(keys, lengths.values, lengths.offsets)


def _by_id(keys: list[str], flat: np.ndarray, bounds: np.ndarray) -> dict[str, np.ndarray]:
    """Row ``i``'s lengths ``flat[bounds[i]:bounds[i+1]]`` by its key ``keys[i]``, as the row reader builds them."""
    bounds = bounds.tolist()
    parts = [flat[s:e] for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
    if len(set(keys)) == len(keys):
        return dict(zip(keys, parts, strict=True))
    out: dict[str, list[np.ndarray]] = {}
    for k, part in zip(keys, parts, strict=True):  # an id on several rows accumulates its lengths, in file order
        out.setdefault(k, []).append(part)
    return {k: np.concatenate(v) for k, v in out.items()}


def _plain(t) -> bool:
    """Whether every value of Arrow type ``t`` converts to Python without fail (bad UTF-8 aside)."""
    import pyarrow as pa

    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _plain(t.value_type)
    if pa.types.is_struct(t):
        return all(_plain(t.field(i).type) for i in range(t.num_fields))
    return any(f(t) for f in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary,
                              pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_null))  # fmt: skip
