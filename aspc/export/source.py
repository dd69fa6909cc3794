"""Find the dataset a plan was compiled from, and read its rows unchanged.

A plan stores the input's sha256 (``aspc.input_hash``), never its path (plans
are machine-independent). ``export`` looks for a dataset file with that hash
next to the plan and in the working directory, and otherwise asks for
``--source``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aspc.emit import Plan
from aspc.emit import schema as S
from aspc.errors import InputError, short_reason
from aspc.io.prompts import file_hash
from aspc.io.readers import SUPPORTED_SUFFIXES, BadRecord, detect_format, iter_records, json_int
from aspc.io.table import arrow_array, column_numpy, take_rows


def locate_source(plan: Plan, plan_path: Path, source: Path | None) -> Path:
    """The dataset file the plan was compiled from, checked by the sha256 the plan records.

    Without ``source``: the first dataset file (by name) next to the plan, then
    in the working directory, whose hash matches.
    """
    want = plan.input_hash
    if source is not None:
        if not source.is_file():
            raise InputError(f"--source {source}: no such file; pass the dataset given to 'aspc compile'")
        if want and file_hash(source) != want:
            raise InputError(
                f"--source {source.name} is not the dataset the plan was compiled from (its sha256 differs); "
                "pass the very file given to 'aspc compile'"
            )
        return source
    me = plan_path.resolve()
    seen: set[Path] = set()
    for d in dict.fromkeys([me.parent, Path.cwd().resolve()]):
        try:
            entries = sorted(d.iterdir())
        except OSError:
            continue
        for f in entries:
            r = f.resolve()
            if r in seen or r == me or f.suffix.lower() not in SUPPORTED_SUFFIXES or not f.is_file():
                continue
            seen.add(r)
            if want and file_hash(f) == want:
                return f
    raise InputError(
        f"cannot find the dataset {plan_path.name} was compiled from (sha256 {want[:12]}) next to the plan "
        "or in the working directory; pass --source PATH, or --no-source to export aspc's columns only"
    )


def check_rows(plan: Plan, source: Path) -> None:
    """Every plan row's source_row must hold the plan's prompt id (same reading options as compile)."""
    from aspc.io import read_prompts

    inputs = plan.config.get("inputs") or {}
    table = read_prompts(
        source,
        prompt_field=inputs.get("prompt_field", "prompt"),
        id_field=inputs.get("id_field", "id"),
        on_bad_line=inputs.get("on_bad_line", "error"),
    )
    at_row = {r: i for i, r in enumerate(np.asarray(table.source_rows).tolist())}
    ids = table.ids
    plan_rows, plan_ids = plan.column(S.SOURCE_ROW).tolist(), plan.column(S.PROMPT_ID).tolist()
    where: list[int] = []
    for r, pid in zip(plan_rows, plan_ids, strict=True):
        i = at_row.get(int(r))
        if i is None or ids[i] != pid:
            raise InputError(
                f"--source {source.name}: row {int(r) + 1} does not hold plan prompt {pid!r}; "
                "pass the dataset the plan was compiled from"
            )
        where.append(i)
    # The ids alone let a plan whose prompt_field was edited (to another text column) export that column as
    # every row's prompt: the prompts read now, in the form compile stores, must be the plan's.
    at = arrow_array(np.array(where, dtype=np.int64), pa.int64())  # pa.array imports pandas
    same = pc.equal(table.prompt_array.take(at), plan.table.column(S.PROMPT))
    if not pc.all(same).as_py():
        k = int(np.flatnonzero(~column_numpy(same).astype(bool))[0])
        raise InputError(
            f"--source {source.name}: row {int(plan_rows[k]) + 1} holds another prompt than plan prompt "
            f"{plan_ids[k]!r}: the source is not the dataset the plan was compiled from, or the plan's metadata "
            "(aspc.config inputs) was edited; pass the dataset given to 'aspc compile', or recompile the plan"
        )


def source_records(source: Path, rows: list[int], length_field: str | None = None) -> list[dict[str, Any]]:
    """The source's records at ``rows`` (in that order), as dicts, values untouched.

    ``length_field``: the plan's (compile's ``--length-field``). A CSV cell is text, and compile reads that
    field's cells as JSON ("5", "[4, 6]"): those cells are the numbers compile read, so the records compile
    back with the same lengths (a JSON string "5" is no length).
    """
    if detect_format(source) == "parquet":
        from aspc.io.readers import read_parquet_table

        table = take_rows(read_parquet_table(source), rows)
        try:
            return _python_records(table)
        except ValueError as exc:
            # Python's datetime and timedelta hold microseconds: an Arrow nanosecond value with a sub-µs part
            # has no Python form (without pandas). Arrow's message does not name the column.
            bad = next((n for n in table.column_names if _unconvertible(table.column(n))), "?")
            raise InputError(
                f"{source.name}: column {bad!r} holds a value with no Python form ({short_reason(exc, limit=80)}); "
                "export --format verl, which keeps it, or fix the column (a nanosecond time: store it in microseconds)"
            ) from None
    want = set(rows)
    got: dict[int, Any] = {}
    for r, rec in iter_records(source):
        if r in want:
            if isinstance(rec, BadRecord) or not isinstance(rec, dict):
                raise InputError(f"{source.name}: line {r + 1}: not a record; pass the dataset the plan was compiled from")
            got[r] = rec
    if length_field is not None and detect_format(source) == "csv":
        return [_csv_length(got[r], length_field) for r in rows]
    return [got[r] for r in rows]


def _csv_length(rec: dict[str, Any], length_field: str) -> dict[str, Any]:
    """``rec`` with its length cell as the number (or list of numbers) compile read from it (rows.parse_length)."""
    cell = rec.get(length_field)
    if not isinstance(cell, str):
        return rec
    try:
        value = json.loads(cell, parse_int=json_int)
    except (ValueError, RecursionError):  # compile refused the cell: not a plan row
        return rec
    if isinstance(value, bool) or not isinstance(value, (int, float, list)):
        return rec
    return {**rec, length_field: value}


def source_table(source: Path, rows: list[int]) -> pa.Table:
    """The source's rows as an Arrow table with the source's own column types (Parquet) or inferred ones."""
    if detect_format(source) == "parquet":
        from aspc.io.readers import read_parquet_table

        return take_rows(read_parquet_table(source), rows)
    recs = source_records(source, rows)
    # Every field any record has, null where a record lacks it (from_pylist takes its columns from the
    # first record alone and dropped reward_model when the first row had none), in the order the file
    # shows them: seen in dispatch order, the plan's schedule decided the exported schema.
    in_file = file_order(rows)
    names = list(dict.fromkeys(k for i in in_file for k in recs[i]))
    try:
        return pa.Table.from_pydict({k: _in_key_order([rec.get(k) for rec in recs], in_file) for k in names})
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        # Arrow's own message names neither the field nor the row, and JSON integers have no size limit.
        for r, rec in zip(rows, recs, strict=True):
            where = _wide_int(rec)
            if where is not None:
                raise InputError(
                    f"{source.name}: line {r + 1}: field {where!r} holds an integer outside the signed 64-bit range, "
                    "which a Parquet column cannot store; export --format jsonl, or store the field as a string"
                ) from None
        if isinstance(exc, OverflowError):  # not seen without a wide integer; kept one line all the same
            raise InputError(f"{source.name}: a value does not fit a Parquet column ({short_reason(exc, limit=100)}); "
                             "export --format jsonl, or fix the field") from None  # fmt: skip
        # Arrow's message does not name the field either (a prompt of text in some rows, a chat in others).
        name, why = _mixed_field(recs) or ("", short_reason(exc, limit=100))
        what = f"field {name!r}" if name else "a field"
        raise InputError(
            f"{source.name}: {what} mixes value types across rows ({why}); "
            "it cannot be a Parquet column: export --format jsonl, or fix the field"
        ) from None
    except UnicodeEncodeError:
        raise InputError(f"{source.name}: a field holds invalid Unicode (lone surrogates); "
                         "re-encode the data as UTF-8") from None  # fmt: skip


# export --format verl's note where holds_text_parts: the prompts it writes are not the source's cells.
PARTS_NOTE = ("the source's prompt messages give their content as text parts, which verl's chat templates (Qwen2.5's "
              "among them) cannot render; the export writes each as the parts' texts joined by a newline, as aspc "
              "read and counted it")  # fmt: skip


def holds_text_parts(t: pa.DataType) -> bool:
    """Whether a chat column of type ``t`` gives message content as a list (OpenAI-style text parts, read as
    their texts joined by a newline): verl renders the column with the tokenizer's chat template as it is."""
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_struct(t.value_type):
        return False
    at = t.value_type.get_field_index("content")
    c = t.value_type.field(at).type if at >= 0 else None
    return c is not None and (pa.types.is_list(c) or pa.types.is_large_list(c) or pa.types.is_fixed_size_list(c))


def ordered_type(values: list[Any]) -> pa.DataType | None:
    """The type ``pa.array(values)`` infers, with each struct's fields in first-seen key order, for ``type=``.

    pyarrow before 24 infers a struct's fields in sorted key order (``struct<content, role>`` for chat
    messages), later ones in first-seen order, so the written file depended on the pyarrow version; with
    the type given, inference never picks the order. ``None`` when no value holds a dict (no field order to
    pick), or when no one type holds the values: ``pa.array`` then infers, and raises its own error.
    """
    try:
        return _type_of(values) if any(_holds_dict(v) for v in values) else None
    except (_NoOneType, pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError, RecursionError):
        return None


class _NoOneType(Exception):
    """Dicts, lists and scalars mixed at one place: no one Arrow type holds them."""


def _holds_dict(v: Any) -> bool:
    if isinstance(v, dict):
        return True
    return isinstance(v, (list, tuple)) and any(_holds_dict(x) for x in v)


def _type_of(values: list[Any]) -> pa.DataType:
    present = [v for v in values if v is not None]
    if not present:
        return pa.null()
    if all(isinstance(v, dict) for v in present):
        keys = dict.fromkeys(k for v in present for k in v)  # first-seen order, as pyarrow >= 24 infers
        if not all(isinstance(k, str) for k in keys):
            raise _NoOneType
        return pa.struct([pa.field(k, _type_of([v.get(k) for v in present])) for k in keys])
    if all(isinstance(v, (list, tuple)) for v in present):
        return pa.list_(_type_of([x for v in present for x in v]))
    if any(isinstance(v, (dict, list, tuple)) for v in present):
        raise _NoOneType
    return pa.array(present).type


def _in_key_order(values: list[Any], order: list[int]) -> list[Any] | pa.Array:
    """``values`` as an Arrow array whose structs keep their keys in the order first seen over ``values[order]``;
    as they are when they hold no dict."""
    t = ordered_type([values[i] for i in order])
    return values if t is None else pa.array(values, t)


def file_order(rows: list[int]) -> list[int]:
    """Positions of ``rows`` (source rows, in the plan's dispatch order) taken in the source file's order."""
    return sorted(range(len(rows)), key=rows.__getitem__)


def _mixed_field(recs: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(name, Arrow's reason) of the first field, in order of appearance, whose values no one Arrow type holds."""
    for name in dict.fromkeys(k for rec in recs for k in rec):
        try:
            pa.array([rec.get(name) for rec in recs])
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            return str(name), short_reason(exc, limit=100)
    return None


def _python_records(table: pa.Table) -> list[dict[str, Any]]:
    """``table.to_pylist()``, with nanosecond timestamps and durations in their JSON form, made here.

    Python's datetime and timedelta stop at microseconds: Arrow hands a
    nanosecond value to pandas when it is installed and fails without it, so
    the output would depend on the environment. A timestamp becomes its
    ISO-8601 string with nine fraction digits (and its offset), a duration its
    seconds (an int when whole), as :func:`aspc.export._json_default` writes
    coarser ones.
    """
    import decimal

    import pyarrow.compute as pc

    names = table.column_names
    done: dict[str, list[Any]] = {}
    for field in table.schema:
        t = field.type
        if pa.types.is_timestamp(t) and t.unit == "ns":
            fmt = "%Y-%m-%dT%H:%M:%S" + ("%Ez" if t.tz else "")
            done[field.name] = pc.strftime(table.column(field.name), format=fmt).to_pylist()
        elif pa.types.is_duration(t) and t.unit == "ns":
            ns = table.column(field.name).cast(pa.int64()).to_pylist()
            done[field.name] = [None if v is None else v // 10**9 if v % 10**9 == 0 else
                                float(decimal.Decimal(v).scaleb(-9)) for v in ns]  # fmt: skip
    if not done:
        return table.to_pylist()
    rest = table.drop_columns(list(done)).to_pylist()
    return [{n: (done[n][i] if n in done else rec[n]) for n in names} for i, rec in enumerate(rest)]


def _unconvertible(column: pa.ChunkedArray) -> bool:
    t = column.type
    if (pa.types.is_timestamp(t) or pa.types.is_duration(t)) and t.unit == "ns":
        return False  # _python_records converts these itself: the culprit is another (a nested) column
    try:
        column.to_pylist()
    except ValueError:
        return True
    return False


def _wide_int(value: Any, path: str = "") -> str | None:
    """The dotted path of the first integer in ``value`` outside int64 (Arrow's widest signed integer), else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return path if not -(2**63) <= value < 2**63 else None
    if isinstance(value, dict):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for at, v in items:
        found = _wide_int(v, at)
        if found is not None:
            return found
    return None


def source_name(source: Path | None) -> str | None:
    return None if source is None else os.fspath(source)
