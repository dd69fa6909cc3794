"""Export a plan's prompts, in dispatch order, for a trainer to consume.

Every column of the dataset the plan was compiled from passes through
unchanged (found by its hash, see :mod:`aspc.export.source`); aspc's schedule
goes under ``extra_info["aspc"]`` (``prompt_id``, ``minibatch``, ``group``,
``dispatch_rank``, ``n_samples``, ``predicted_len``), never over the user's keys.

Formats
-------
``verl``
    Parquet in the layout of verl's ``RLHFDataset``. ``prompt`` is a chat list
    (a text prompt, or a prompt field other than ``prompt``, becomes
    ``[{"role": "user", ...}]`` in a ``prompt`` column, which replaces a
    source column of that name, with a note; so does a chat whose content is
    text parts, written as the joined text aspc read). Without a source
    ``data_source`` column the rows carry ``--data-source`` (default
    ``aspc``); without a source ``extra_info`` it is ``{"index": source row,
    "aspc": ...}``. An id column is added only when ``aspc compile`` could not
    otherwise recover the plan's ids from the file.
``jsonl``
    The source records, one per line, with ``extra_info.aspc`` added (the
    prompt stays in the source's form), so a JSONL export compiles back to
    the very same prompts and ids.

One row per plan row, in dispatch order; see :mod:`aspc.export.overrides`
for the verl settings that keep that order.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from aspc.arrow_files import arrow_file
from aspc.atomic import atomic_path
from aspc.choices import EXPORT_FORMATS
from aspc.emit import Plan, read_plan
from aspc.emit import schema as S
from aspc.emit.check import verify_integrity
from aspc.errors import ConfigError, InputError, PlanError, short_reason
from aspc.export import source as sources
from aspc.export.overrides import order_notes, override_args, verl_settings
from aspc.export.source import check_rows, file_order, locate_source, ordered_type, source_records, source_table
from aspc.guards import check_output
from aspc.io.rows import chat_messages

FORMATS = EXPORT_FORMATS
OUTPUT_EXAMPLES = {"verl": "train.parquet", "jsonl": "train.jsonl"}  # -o advice: a name each format writes
DEFAULT_DATA_SOURCE = "aspc"  # verl picks the reward function by data_source; set yours with --data-source
ASPC_KEY = "aspc"  # extra_info key holding aspc's schedule fields

MESSAGE_TYPE = pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])
ASPC_FIELDS = (
    pa.field("prompt_id", pa.string()),  # aspc prompt id
    pa.field("minibatch", pa.int32()),  # aspc generation minibatch, dispatch order
    pa.field("group", pa.int32()),  # aspc dispatch group == one verl step with the printed batch size
    pa.field("dispatch_rank", pa.int64()),  # 0-based position in dispatch order == row number
    pa.field("n_samples", pa.int32()),  # responses to generate (verl: actor_rollout_ref.rollout.n)
    pa.field("predicted_len", pa.float64()),  # predicted mean response length, tokens (capped)
)
ASPC_TYPE = pa.struct(list(ASPC_FIELDS))
_ASPC_NAMES = {f.name for f in ASPC_TYPE}
_TAKEN = (f"the source's extra_info has an {ASPC_KEY!r} key that is not an aspc export's schedule; rename that key "
          "in the source (aspc writes its schedule there)")  # fmt: skip


@dataclass
class ExportResult:
    """What an export wrote and the trainer settings that keep its order."""

    path: Path  # file written
    format: str  # "verl" | "jsonl"
    rows: int  # rows written == plan rows
    n_groups: int  # plan dispatch groups
    group_prompts: list[int] = field(default_factory=list)  # prompts per group, in dispatch order
    train_batch_size: int | None = None  # prompts per group when every group has as many, else None
    n_samples: int | None = None  # responses per prompt when every row has as many, else None
    source: Path | None = None  # dataset whose columns were carried (None: --no-source)
    overrides: dict[str, Any] = field(default_factory=dict)  # verl config key -> value
    warnings: list[str] = field(default_factory=list)  # what else a verl user must set or know

    def verl_overrides(self) -> list[str]:
        """verl command-line overrides (``key=value``) that consume the rows in plan order, batch by group."""
        return override_args(self.overrides)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "format": self.format,
            "rows": self.rows,
            "n_groups": self.n_groups,
            "group_prompts": self.group_prompts,
            "groups_equal": self.train_batch_size is not None,
            "train_batch_size": self.train_batch_size,
            "n_samples": self.n_samples,
            "source": None if self.source is None else str(self.source),
            "overrides": self.overrides,
            "warnings": self.warnings,
            "verl_overrides": self.verl_overrides(),
        }


def _as_chat(stored: str) -> list[dict[str, str]]:
    msgs = chat_messages(stored)
    return msgs if msgs is not None else [{"role": "user", "content": stored}]


def _chat_column(chats: list[list[dict[str, Any]]], order: list[int]) -> pa.Array:
    """The chats as verl's list of message structs: role and content, and any other keys the messages have
    (name, tool_calls, tool_call_id: a tool-call conversation prompts the model with them), null where a
    message lacks one, as a Hugging Face dataset of such chats holds them. ``order``: the chats in the
    source's order, which orders the keys (not the plan's schedule)."""
    if not any(len(m) > 2 for c in chats for m in c):  # role and content only (compile checked them)
        return pa.array(chats, pa.list_(MESSAGE_TYPE))
    try:
        # First-seen key order whatever the pyarrow version.
        return pa.array(chats, ordered_type([chats[i] for i in order]))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InputError(f"the chats' message keys hold values of different types across messages "
                         f"({short_reason(exc, limit=100)}); export --format jsonl, which keeps each message "
                         "as it is") from None


def _aspc_rows(plan: Plan) -> list[dict[str, Any]]:
    cols = {f.name: plan.column(f.name).tolist() for f in ASPC_FIELDS}
    return [{k: v[i] for k, v in cols.items()} for i in range(plan.n_rows)]


# What each format writes, and the suffixes that name another format (any other suffix is left to the user).
_WRITES = {"verl": ("Parquet", (".jsonl", ".ndjson", ".json", ".csv")), "jsonl": ("JSON lines", (".parquet", ".pq", ".json"))}


def _check_suffix(out_path: Path, fmt: str) -> None:
    """Refuse an output named for another format: a JSONL file called x.parquet failed later in verl or compile."""
    what, wrong = _WRITES[fmt]
    if out_path.suffix.lower() in wrong:
        other = "jsonl" if fmt == "verl" else "verl"
        raise ConfigError(f"-o {out_path.name}: --format {fmt} writes {what}, not {out_path.suffix} data; "
                          f"name the output {'.parquet' if fmt == 'verl' else '.jsonl'}, or pass --format {other}")


def export_plan(
    plan_path: str | os.PathLike,
    out_path: str | os.PathLike,
    fmt: str = "verl",
    *,
    data_source: str | None = None,
    source: str | os.PathLike | None = None,
    use_source: bool = True,
) -> ExportResult:
    """Write the prompts of a plan, in dispatch order, as a trainer dataset.

    Parameters
    ----------
    plan_path
        A plan written by ``aspc compile``.
    out_path
        File to write (atomically: whole or nothing).
    fmt
        ``"verl"`` (Parquet) or ``"jsonl"``.
    data_source
        Replaces the ``data_source`` column (verl selects the reward function
        with it). ``None``: the source's own, else ``"aspc"``.
    source
        The dataset the plan was compiled from; ``None``: found next to the
        plan or in the working directory by the plan's recorded hash.
    use_source
        ``False``: export aspc's columns only (the dataset is not needed).

    Raises
    ------
    ConfigError
        Unknown format.
    PlanError
        Unreadable plan.
    InputError
        The source cannot be found, or is not the dataset the plan was compiled from.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    plan_path, out_path = Path(plan_path), Path(out_path)
    _check_suffix(out_path, fmt)
    plan = read_plan(plan_path)
    verify_integrity(plan, plan_path.name)  # a plan 'aspc check' refuses (rows edited by hand) is not exported
    if plan.config.get("scout_roll") or any(str(p).endswith(S.SCOUT_ID_SUFFIX) for p in plan.column(S.PROMPT_ID)):
        raise PlanError(f"{plan_path.name}: a rolling scout's plan (aspc run --scout-roll) is planned again inside "
                        "the run as its scouts return, so no static order stands for it; export the plan it "
                        "was built from")  # fmt: skip
    src = None
    if use_source:
        src = locate_source(plan, plan_path, None if source is None else Path(source))
        check_rows(plan, src)
        # The source found by hash is an input too: never write over it.
        check_output(out_path, inputs=[plan_path, src], example=OUTPUT_EXAMPLES.get(fmt, "train.parquet"))
    elif source is not None:
        raise ConfigError("give --source or --no-source, not both")
    inputs = plan.config.get("inputs") or {}
    prompt_field, id_field = inputs.get("prompt_field", "prompt"), inputs.get("id_field", "id")
    rows = plan.column(S.SOURCE_ROW).astype(np.int64).tolist()
    replaced: bool | str = False  # the source's 'prompt' column gave way to the chat built from another prompt field
    overrides: dict[str, Any] = {}
    warnings: list[str] = []
    if fmt == "verl":
        table, has_ds, replaced = _verl_table(plan, src, rows, prompt_field, id_field, data_source)
        # Before the file is written: a setting that cannot be made must leave no output behind.
        overrides, warnings = verl_settings(plan, str(out_path), has_ds)
        _write_parquet(out_path, table)
    else:
        _write_jsonl(out_path, plan, src, rows, id_field, data_source, inputs.get("length_field"))
    counts = np.bincount(plan.column(S.GROUP).astype(np.int64)).astype(int).tolist()
    if fmt != "verl":
        warnings = order_notes(counts)
    nseq = plan.column(S.N_SAMPLES)
    if replaced == "parts":
        warnings.insert(0, sources.PARTS_NOTE)
    elif replaced:
        # Said, not refused: the user's file keeps the column, and a renamed source would no longer match the plan.
        warnings.insert(0, f"the source's 'prompt' column is replaced by the chat built from {prompt_field!r}, the "
                           "plan's prompt field (verl reads data.prompt_key, 'prompt'); export --format jsonl keeps "
                           "every source field as it is")  # fmt: skip
    return ExportResult(
        path=out_path,
        format=fmt,
        rows=plan.n_rows,
        n_groups=len(counts),
        group_prompts=counts,
        train_batch_size=counts[0] if len(set(counts)) == 1 else None,
        n_samples=int(nseq[0]) if np.all(nseq == nseq[0]) else None,
        source=src,
        overrides=overrides,
        warnings=warnings,
    )


def _ids_recoverable(table: pa.Table | None, ids: list[str], id_field: str) -> bool:
    """True when compiling the export gives the plan's ids without an added id column."""
    if table is None:
        return False
    if id_field in table.column_names:
        return True
    if "extra_info" in table.column_names and pa.types.is_struct(table.schema.field("extra_info").type):
        info = table.column("extra_info").combine_chunks()
        if info.type.get_field_index("index") >= 0:
            index = info.field("index").to_pylist()
            return [None if v is None else str(v) for v in index] == ids
    return False


def _is_schedule(t: pa.DataType) -> bool:
    """Whether ``t`` is the type of an earlier export's schedule: its exact type from a verl export, or the one
    Arrow infers from a JSONL export's (integers as int64, any field order), as ``_write_jsonl`` compares keys."""
    if not pa.types.is_struct(t) or {f.name for f in t} != _ASPC_NAMES or t.num_fields != len(_ASPC_NAMES):
        return False
    for want in ASPC_FIELDS:
        got = t.field(want.name).type
        if pa.types.is_string(want.type):
            ok = pa.types.is_string(got) or pa.types.is_large_string(got)
        elif pa.types.is_integer(want.type):
            ok = pa.types.is_integer(got)
        else:  # predicted_len: a whole number written as 250.0 reads as a float, one as 250 (by hand) as an integer
            ok = pa.types.is_floating(got) or pa.types.is_integer(got)
        if not ok:
            return False
    return True


def _extra_info(table: pa.Table | None, plan: Plan) -> pa.Array:
    """The source's extra_info with an ``aspc`` child appended (or a new one: index + aspc)."""
    aspc = pa.array(_aspc_rows(plan), ASPC_TYPE)
    if table is None or "extra_info" not in table.column_names:
        index = pa.array(plan.column(S.SOURCE_ROW).astype(np.int64), pa.int64())
        return pa.StructArray.from_arrays([index, aspc], names=["index", ASPC_KEY])
    info = table.column("extra_info").combine_chunks()
    if pa.types.is_null(info.type):
        return pa.StructArray.from_arrays([aspc], names=[ASPC_KEY])
    if not pa.types.is_struct(info.type):
        raise InputError(
            f"the source's extra_info is {info.type}, not a struct; verl reads it as a dict: fix the column"
        )
    at = info.type.get_field_index(ASPC_KEY)
    if at >= 0 and not _is_schedule(info.type.field(at).type):
        raise InputError(_TAKEN)
    # An earlier export's schedule is aspc's own: the new schedule replaces it.
    keep = [i for i in range(info.type.num_fields) if i != at]
    names = [info.type.field(i).name for i in keep]
    children = [info.field(i) for i in keep]
    # A row whose extra_info is null stays null: the user's value is never replaced.
    return pa.StructArray.from_arrays(children + [aspc], names=names + [ASPC_KEY], mask=info.is_null())


def _verl_table(
    plan: Plan,
    src: Path | None,
    rows: list[int],
    prompt_field: str,
    id_field: str,
    data_source: str | None,
) -> tuple[pa.Table, bool, bool | str]:
    """The verl table; (it, rows have a data_source, the source's own 'prompt' column was replaced: True, or
    "parts" where only its messages' text parts were joined)."""
    n = plan.n_rows
    table = source_table(src, rows) if src is not None else None
    cols: dict[str, pa.Array | pa.ChunkedArray] = {}
    if table is not None:
        for name in table.column_names:
            cols[name] = table.column(name)
    kind = table.schema.field("prompt").type if table is not None and "prompt" in cols else None
    # large_list too: Arrow tools that default to large types write the same chats so. Content as text parts
    # is rebuilt from the plan (their texts joined, as aspc read them), every message key kept.
    parts = prompt_field == "prompt" and kind is not None and sources.holds_text_parts(kind)
    is_chat = kind is not None and (pa.types.is_list(kind) or pa.types.is_large_list(kind))
    keep_prompt = prompt_field == "prompt" and is_chat and not parts
    replaced = not keep_prompt and prompt_field != "prompt" and "prompt" in cols
    if not keep_prompt:
        # The plan stores a chat as compact JSON, so text that is exactly such JSON reads as a chat there;
        # the source says which it was: a string column holds text, each cell one user message.
        kind = table.schema.field(prompt_field).type if table is not None and prompt_field in cols else None
        if kind is not None and (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            # A row whose prompt came from its 'messages' chat has no text there: the plan holds its chat.
            stored = plan.column(S.PROMPT).tolist()
            chats = [[{"role": "user", "content": p}] if p is not None else _as_chat(q)
                     for p, q in zip(table.column(prompt_field).to_pylist(), stored, strict=True)]  # fmt: skip
        else:
            chats = [_as_chat(p) for p in plan.column(S.PROMPT).tolist()]
        cols["prompt"] = _chat_column(chats, file_order(rows))
    has_ds = "data_source" in cols
    if data_source is not None:
        cols["data_source"] = pa.array([data_source] * n, pa.string())
    elif not has_ds:
        cols["data_source"] = pa.array([DEFAULT_DATA_SOURCE] * n, pa.string())
    cols["extra_info"] = _extra_info(table, plan)
    ids = plan.column(S.PROMPT_ID).tolist()
    if not _ids_recoverable(table, ids, id_field):
        cols[id_field] = pa.array(ids, pa.string())
    return pa.table(cols), has_ds or data_source is not None, "parts" if parts else replaced


def _write_parquet(path: Path, table: pa.Table) -> None:
    try:
        with atomic_path(path) as tmp:
            with arrow_file(tmp, "wb") as fh:  # pyarrow refuses a str path that is not valid UTF-8
                pq.write_table(table, fh, compression="zstd")
            _share(tmp)
    except pa.ArrowNotImplementedError as exc:  # a JSON field that is {} in every row: a struct of no fields
        raise InputError(f"the export cannot be stored as Parquet ({short_reason(exc, limit=120)}); drop that "
                         "field from the source, or export --format jsonl") from None  # fmt: skip


def _write_jsonl(
    path: Path, plan: Plan, src: Path | None, rows: list[int], id_field: str, data_source: str | None,
    length_field: str | None = None,
) -> bool:
    # The source's records keep their prompt and ids as they were, so compile reads back the same ids
    # (and a CSV source's lengths as the numbers compile read: its cells are text).
    aspc = _aspc_rows(plan)
    ids = plan.column(S.PROMPT_ID).tolist()
    if src is not None:
        recs = source_records(src, rows, length_field)
    else:
        recs = []
        for pid, p, r in zip(ids, plan.column(S.PROMPT).tolist(), rows, strict=True):
            msgs = chat_messages(p)
            recs.append({id_field: pid, "prompt": p if msgs is None else msgs, "extra_info": {"index": r}})
    has_ds = all("data_source" in r for r in recs)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        for rec, extra in zip(recs, aspc, strict=True):
            rec = dict(rec)
            info = rec.get("extra_info")
            if info is None:
                info = {}
            if not isinstance(info, dict):
                raise InputError("the source's extra_info is not an object; verl reads it as a dict: fix the field")
            old = info.get(ASPC_KEY)
            if ASPC_KEY in info and not (isinstance(old, dict) and set(old) == _ASPC_NAMES):
                raise InputError(_TAKEN)
            rec["extra_info"] = {**info, ASPC_KEY: extra}  # an earlier export's schedule is replaced
            if data_source is not None:
                rec["data_source"] = data_source
            elif "data_source" not in rec:
                rec["data_source"] = DEFAULT_DATA_SOURCE
            fh.write(_json_line(rec))
        _share(tmp)
    return has_ds or data_source is not None


def _json_line(rec: dict) -> bytes:
    """One strict JSON line, UTF-8; a value strict readers reject is an InputError (the file is not kept)."""
    try:
        line = (json.dumps(rec, ensure_ascii=False, default=_json_default, allow_nan=False) + "\n").encode("utf-8")
    # UnicodeEncodeError first: it is a ValueError too.
    except UnicodeEncodeError:
        raise InputError("a field of the source holds invalid Unicode (lone surrogates); re-encode the data as UTF-8") from None
    except ValueError:
        raise InputError("a field of the source holds NaN or Infinity, which JSON has no value for (strict readers "
                         "refuse the line); fix the field, or export --format verl") from None  # fmt: skip
    except TypeError as exc:  # a value _json_default has no form for
        raise InputError(f"a field of the source holds a value JSON has no form for ({short_reason(exc, limit=80)}); "
                         "export --format verl, or fix the field") from None  # fmt: skip
    return line


def _share(path: Path) -> None:
    """Give the file the usual umask permissions: the atomic temporary file is private (0600),
    and a trainer often runs as another user."""
    from aspc.file_modes import current_umask

    os.chmod(path, 0o666 & ~current_umask())


def _json_default(o: Any) -> Any:
    """The JSON form of a Parquet source's non-JSON values.

    Dates, times and timestamps are ISO-8601 strings (a zone-aware timestamp keeps its offset), as JSON
    readers and pandas' ``date_format="iso"`` expect; a Decimal is its exact string ("1.10"), since a JSON
    number would round it through a float; a duration is its length in seconds (an int when whole), the unit
    of ``timedelta.total_seconds`` and the most common in JSON, computed exactly before the one rounding to float.
    Binary values that are UTF-8 text are that text; other bytes (images) have no JSON form and are refused.
    """
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, bytes):
        try:
            return o.decode("utf-8")  # text stored as binary: the string is exact
        except UnicodeDecodeError:
            # Image bytes and the like: a replaced character per bad byte lost them for good.
            raise TypeError("binary data that is not UTF-8 text, such as image bytes") from None
    if isinstance(o, (dt.date, dt.time)):  # datetime is a date
        return o.isoformat()
    if isinstance(o, decimal.Decimal):
        return str(o)
    if isinstance(o, dt.timedelta):
        whole = o.days * 86400 + o.seconds
        ns = o.microseconds * 1000 + getattr(o, "nanoseconds", 0)  # pandas' Timedelta keeps nanoseconds
        return whole if not ns else float(decimal.Decimal(whole) + decimal.Decimal(ns).scaleb(-9))
    if isinstance(o, uuid.UUID):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
