"""Export a plan's prompts, in dispatch order, for a trainer to consume.

Formats
-------
``verl``
    A Parquet file in the layout of verl's ``RLHFDataset``: ``prompt`` is a
    chat list of ``{role, content}`` (a text prompt becomes one user
    message), ``data_source`` names the reward function, ``extra_info`` is a
    struct carrying aspc's schedule (``prompt_id``, ``minibatch``, ``group``,
    ``dispatch_rank``, ``n_samples``, ``predicted_len``, and verl's ``index``
    and ``split``), and ``id`` keeps the aspc prompt id so that ``aspc
    compile`` of the exported file keeps the same ids.
``jsonl``
    The same records, one JSON object per line, with ``prompt`` in the form
    the plan stored it (text stays text, a chat stays a chat list), so a
    JSONL export compiles back to byte-identical prompts.

One row per plan row, in dispatch order. A trainer keeps that order only if
it reads the rows sequentially and batches them by the plan's groups; for
verl that means ``data.shuffle=False`` and ``data.train_batch_size`` equal to
the prompts per group (see ``examples/verl_export.md``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from aspc.atomic import atomic_path
from aspc.emit import Plan, read_plan
from aspc.emit import schema as S
from aspc.errors import ConfigError, InputError

FORMATS = ("verl", "jsonl")
DEFAULT_DATA_SOURCE = "aspc"  # verl picks the reward function by data_source; set yours with --data-source
ID_COLUMN = "id"  # read back by ``aspc compile`` (its default --id-field)
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")

MESSAGE_TYPE = pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])
EXTRA_INFO_FIELDS = (
    # verl's RLHFDataset reads extra_info.index into each sample's "index".
    pa.field("index", pa.int64()),  # == dispatch_rank
    pa.field("split", pa.string()),  # "train"
    pa.field("prompt_id", pa.string()),  # aspc prompt id
    pa.field("minibatch", pa.int32()),  # aspc generation minibatch, dispatch order
    pa.field("group", pa.int32()),  # aspc dispatch group == trainer batch when batch size matches
    pa.field("dispatch_rank", pa.int64()),  # 0-based position in dispatch order == row number
    pa.field("n_samples", pa.int32()),  # responses to generate (verl: actor_rollout_ref.rollout.n)
    pa.field("predicted_len", pa.float64()),  # predicted mean response length, tokens
)


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

    def verl_overrides(self) -> list[str]:
        """verl command-line overrides that consume the rows in plan order, batch by group."""
        out = [f"data.train_files={self.path}", "data.shuffle=False"]
        if self.train_batch_size is not None:
            out.append(f"data.train_batch_size={self.train_batch_size}")
        if self.n_samples is not None:
            out.append(f"actor_rollout_ref.rollout.n={self.n_samples}")
        out += ["data.filter_overlong_prompts=False", "data.train_max_samples=-1"]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "format": self.format,
            "rows": self.rows,
            "n_groups": self.n_groups,
            "groups_equal": self.train_batch_size is not None,
            "train_batch_size": self.train_batch_size,
            "n_samples": self.n_samples,
            "verl_overrides": self.verl_overrides() if self.format == "verl" else [],
        }


def chat_messages(stored: str) -> list[dict[str, str]] | None:
    """The chat messages of a plan ``prompt`` cell, or ``None`` when it holds plain text.

    ``aspc.io`` stores a chat as compact JSON (``separators=(",", ":")``,
    keys ``role`` then ``content``); only a cell that parses to such a list
    and re-serialises to the very same string is a chat, so text that merely
    looks like JSON stays text.
    """
    if not stored.startswith('[{"role":'):
        return None
    try:
        value = json.loads(stored)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, list) or not value:
        return None
    for m in value:
        if not isinstance(m, dict) or list(m) != ["role", "content"]:
            return None
        if m["role"] not in CHAT_ROLES or not isinstance(m["content"], str):
            return None
    if json.dumps(value, ensure_ascii=False, separators=(",", ":")) != stored:
        return None
    return value


def _as_chat(stored: str) -> list[dict[str, str]]:
    msgs = chat_messages(stored)
    return msgs if msgs is not None else [{"role": "user", "content": stored}]


def _source_fields(plan: Plan, source: Path) -> dict[str, list[Any]]:
    """Columns of the original dataset for each plan row (joined on source_row, ids checked).

    Everything except the prompt and id fields is carried over (e.g. verl's
    ``reward_model``, ``ability``, ``data_source``, ``extra_info``).
    """
    from aspc.io import read_prompts
    from aspc.io.readers import iter_records

    inputs = plan.config.get("inputs") or {}
    prompt_field = inputs.get("prompt_field", "prompt")
    id_field = inputs.get("id_field", "id")
    table = read_prompts(
        source, prompt_field=prompt_field, id_field=id_field, on_bad_line=inputs.get("on_bad_line", "error")
    )
    id_of_row = dict(zip(table.source_rows.tolist(), table.ids, strict=True))
    rows = plan.column(S.SOURCE_ROW).astype(np.int64)
    ids = plan.column(S.PROMPT_ID)
    for r, pid in zip(rows.tolist(), ids.tolist(), strict=True):
        if id_of_row.get(r) != pid:
            raise InputError(
                f"--source {source.name}: row {r + 1} does not hold plan prompt {pid!r}; "
                "pass the dataset the plan was compiled from"
            )
    where = {r: i for i, r in enumerate(rows.tolist())}
    # The prompt and id columns are aspc's own; a source field of the same name is not carried.
    skip = {prompt_field, id_field, "messages", "prompt", ID_COLUMN}
    cols: dict[str, list[Any]] = {}
    for r, rec in iter_records(source):
        i = where.get(r)
        if i is None or not isinstance(rec, dict):
            continue
        for k, v in rec.items():
            if k in skip:
                continue
            cols.setdefault(k, [None] * len(rows))[i] = v
    return cols


def _extra_info(plan: Plan, source_extra: list[Any] | None) -> list[dict[str, Any]]:
    n = plan.n_rows
    rank = plan.column(S.DISPATCH_RANK).tolist()
    aspc = {
        "index": rank,
        "split": ["train"] * n,
        "prompt_id": plan.column(S.PROMPT_ID).tolist(),
        "minibatch": plan.column(S.MINIBATCH).tolist(),
        "group": plan.column(S.GROUP).tolist(),
        "dispatch_rank": rank,
        "n_samples": plan.column(S.N_SAMPLES).tolist(),
        "predicted_len": plan.column(S.PREDICTED_LEN).tolist(),
    }
    out = []
    for i in range(n):
        base = dict(source_extra[i]) if source_extra is not None and isinstance(source_extra[i], dict) else {}
        # aspc's schedule fields win over same-named fields of the source's extra_info.
        base.update({k: v[i] for k, v in aspc.items()})
        out.append(base)
    return out


def _summary(plan: Plan, path: Path, fmt: str) -> ExportResult:
    grp = plan.column(S.GROUP).astype(np.int64)
    counts = np.bincount(grp).astype(int).tolist()
    nseq = plan.column(S.N_SAMPLES)
    return ExportResult(
        path=path,
        format=fmt,
        rows=plan.n_rows,
        n_groups=len(counts),
        group_prompts=counts,
        train_batch_size=counts[0] if len(set(counts)) == 1 else None,
        n_samples=int(nseq[0]) if np.all(nseq == nseq[0]) else None,
    )


def export_plan(
    plan_path: str | os.PathLike,
    out_path: str | os.PathLike,
    fmt: str = "verl",
    *,
    data_source: str | None = None,
    source: str | os.PathLike | None = None,
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
        Value of the ``data_source`` column (verl selects the reward function
        with it). ``None``: the source dataset's own ``data_source`` field when
        ``source`` has one, else ``"aspc"``.
    source
        The dataset the plan was compiled from. Its other fields (e.g.
        ``reward_model``, ``ability``, ``extra_info``) are carried into each
        row, joined on the plan's ``source_row`` and checked against the ids.

    Returns
    -------
    ExportResult
        Rows written and the verl settings that keep the plan's order.

    Raises
    ------
    ConfigError
        Unknown format.
    PlanError
        Unreadable plan.
    InputError
        ``source`` is not the dataset the plan was compiled from.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    plan = read_plan(plan_path)
    out_path = Path(out_path)
    extra = _source_fields(plan, Path(source)) if source is not None else {}
    n = plan.n_rows
    if data_source is not None:
        ds_col = [data_source] * n
    elif "data_source" in extra:
        ds_col = [DEFAULT_DATA_SOURCE if v is None else str(v) for v in extra["data_source"]]
    else:
        ds_col = [DEFAULT_DATA_SOURCE] * n
    info = _extra_info(plan, extra.get("extra_info"))
    carried = {k: v for k, v in extra.items() if k not in ("data_source", "extra_info")}
    ids = plan.column(S.PROMPT_ID).tolist()
    prompts = plan.column(S.PROMPT).tolist()
    if fmt == "verl":
        _write_verl(out_path, ids, prompts, ds_col, info, carried)
    else:
        _write_jsonl(out_path, ids, prompts, ds_col, info, carried)
    return _summary(plan, out_path, fmt)


def _write_verl(
    path: Path,
    ids: list[str],
    prompts: list[str],
    data_source: list[str],
    info: list[dict[str, Any]],
    carried: dict[str, list[Any]],
) -> None:
    aspc_info = pa.struct(list(EXTRA_INFO_FIELDS))
    extra_keys = sorted({k for d in info for k in d} - set(aspc_info.names))
    if extra_keys:
        # The source's own extra_info fields: types inferred, appended after aspc's.
        inferred = pa.array([{k: d.get(k) for k in extra_keys} for d in info]).type
        info_type = pa.struct(list(EXTRA_INFO_FIELDS) + list(inferred))
    else:
        info_type = aspc_info
    columns: dict[str, pa.Array] = {
        "data_source": pa.array(data_source, pa.string()),
        "prompt": pa.array([_as_chat(p) for p in prompts], pa.list_(MESSAGE_TYPE)),
    }
    for k in sorted(carried):
        try:
            columns[k] = pa.array(carried[k])
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            raise InputError(
                f"--source field {k!r} mixes value types across rows; it cannot be a Parquet column"
            ) from None
    columns["extra_info"] = pa.array(info, info_type)
    columns[ID_COLUMN] = pa.array(ids, pa.string())
    table = pa.table(columns)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
        _share(tmp)


def _write_jsonl(
    path: Path,
    ids: list[str],
    prompts: list[str],
    data_source: list[str],
    info: list[dict[str, Any]],
    carried: dict[str, list[Any]],
) -> None:
    keys = sorted(carried)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for i, (pid, p) in enumerate(zip(ids, prompts, strict=True)):
            msgs = chat_messages(p)
            rec: dict[str, Any] = {ID_COLUMN: pid, "data_source": data_source[i], "prompt": p if msgs is None else msgs}
            for k in keys:
                rec[k] = carried[k][i]
            rec["extra_info"] = info[i]
            fh.write(json.dumps(rec, ensure_ascii=False, default=_json_default) + "\n")
        _share(tmp)


def _share(path: Path) -> None:
    """Give the file the usual umask permissions: the atomic temporary file is private (0600),
    and a trainer often runs as another user."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, bytes):
        return o.decode("utf-8", errors="replace")
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
