"""The run log: a directory of append-only Parquet parts plus ``meta.json``.

Layout::

    RUN/meta.json                  format, version, status, config, summary
    RUN/samples/part-000000.parquet     one row per generated sample
    RUN/minibatches/part-*.parquet      one row per finished minibatch
    RUN/steps/part-*.parquet            one row per trainer step
    RUN/queue/part-*.parquet            queue depth after every change
    RUN/consumed/part-*.parquet         (prompt_id, sample_index, consumed_step) per
                                        consumed sample, while the run is not finished
    RUN/payloads/part-*.parquet         the tokens of samples a resume may hand to the
                                        trainer, while the run is not finished (not a
                                        kind: :mod:`aspc.runtime.record.payloads`)

Every part is written whole or not at all (temp file + fsync + rename);
``meta.json`` says ``running`` until the run completes (``complete``) or
fails (``failed``, with the error), so a reader never mistakes a partial log
for a finished one.

Durability (what a crash keeps; ``aspc run --resume`` continues from it):

- A *flush* writes new parts, then *commits* them by rewriting ``meta.json``
  with each kind's live part range (``parts``: kind -> [first, end)). Parts
  outside the committed ranges (a flush cut short by a crash, or parts
  replaced by compaction) are ignored by readers and deleted on resume.
- A minibatch is durable once its row and all its sample rows are committed;
  they are written in the same flush, when it finished. Sample rows are
  written at generation time with ``consumed_step`` null.
- A trainer step is durable once its ``steps`` row and its ``consumed`` rows
  are committed: written together after the step published its version, and
  only once every sample it consumed is durable too.
- Everything else (minibatches in flight, finished but not yet flushed, a
  trainer step under way) is lost at a crash and redone on resume: a lost
  minibatch is generated again from scratch, a lost step runs again.
- When the run ends (``complete`` or ``failed``) the sample parts are
  compacted into one part with ``consumed_step`` filled in, in sample order,
  so ``pyarrow.dataset.dataset("RUN/samples")`` holds one row per generated
  sample with its fate (null = left over, or queued when a run failed).
  Before that (a crashed run), :func:`read_run_log` joins the two. A failed
  or interrupted run keeps its ``consumed`` parts live as well: they alone
  hold the order each step took its samples in, which a resume that replays
  steps needs (``Trainer.durable``).

This module is the format and its reader;
:class:`~aspc.runtime.record.runlog_writer.RunLogWriter` writes it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aspc.arrow_files import empty_table, read_parquet_parts
from aspc.atomic import pid_alive
from aspc.errors import RunError, epochs_root_hint, short_reason
from aspc.io.runlog_meta import check_runlog_version, committed, is_runlog_meta, part_ranges
from aspc.io.table import arrow_array, arrow_scalar, column_numpy, string_column
from aspc.runtime.record.lock import LOCK_FILE

META_FILE = "meta.json"

STATUS_RUNNING = "running"
STATUS_COMPLETE = "complete"
STATUS_FAILED = "failed"
# SIGTERM/SIGINT: the commit in progress finished, then the run stopped; resumable.
STATUS_INTERRUPTED = "interrupted"

SAMPLES, MINIBATCHES, STEPS, QUEUE, CONSUMED = "samples", "minibatches", "steps", "queue", "consumed"

SCHEMAS: dict[str, pa.Schema] = {
    SAMPLES: pa.schema(
        [
            pa.field("prompt_id", pa.string(), nullable=False),  # plan prompt id
            pa.field("sample_index", pa.int32(), nullable=False),  # 0..n_samples-1 within the prompt
            pa.field("response_len", pa.int64(), nullable=False),  # tokens generated
            pa.field("prompt_tokens", pa.int64(), nullable=False),  # tokens of the prompt
            pa.field("minibatch", pa.int32(), nullable=False),  # plan minibatch that generated it
            pa.field("worker", pa.int32(), nullable=False),  # worker that generated it
            pa.field("weights_version", pa.int32(), nullable=False),  # version that generated it
            pa.field("finish_time", pa.float64(), nullable=False),  # seconds since start, entered the queue
            # Seconds from its minibatch's generation start to its last token, as the backend saw it
            # (in static return mode it enters the queue later, with the minibatch); null in logs before 1.2.
            pa.field("decode_time", pa.float64()),
            pa.field("consumed_step", pa.int32()),  # trainer step that consumed it; null = left over
            pa.field("policy_lag", pa.int32()),  # consumed_step - weights_version; null = left over
        ]
    ),
    MINIBATCHES: pa.schema(
        [
            pa.field("minibatch", pa.int32(), nullable=False),  # plan minibatch id
            pa.field("group", pa.int32(), nullable=False),  # plan dispatch group
            pa.field("worker", pa.int32(), nullable=False),  # worker that ran it
            pa.field("reload", pa.bool_(), nullable=False),  # weights reloaded right before it
            pa.field("dispatch_time", pa.float64(), nullable=False),  # seconds; a reload starts here
            pa.field("start", pa.float64(), nullable=False),  # seconds; generation begins (after reload)
            pa.field("end", pa.float64(), nullable=False),  # seconds; longest sequence finished
            pa.field("weights_version", pa.int32(), nullable=False),  # version that generated it
            pa.field("n_prompts", pa.int32(), nullable=False),  # plan rows
            pa.field("n_sequences", pa.int32(), nullable=False),  # samples generated
            pa.field("tokens", pa.int64(), nullable=False),  # Σ response_len
            pa.field("padded_tokens", pa.int64(), nullable=False),  # n_sequences * max_len
            pa.field("max_len", pa.int64(), nullable=False),  # longest response = decode steps
            pa.field(
                "prompt_tokens", pa.int64(), nullable=False
            ),  # Σ prompt tokens over its prompts (prefill)
            pa.field("context_tokens", pa.float64(), nullable=False),  # Σ over steps of Σ context (attention)
            pa.field("plan_revision", pa.int32()),  # plan revision that defined it (0 = the plan; aspc run --replan)
        ]
    ),
    STEPS: pa.schema(
        [
            pa.field("step", pa.int32(), nullable=False),  # trainer step index
            pa.field("start", pa.float64(), nullable=False),  # seconds; batch taken from the queue
            pa.field("end", pa.float64(), nullable=False),  # seconds; version step+1 published
            pa.field("wait", pa.float64(), nullable=False),  # seconds idle before it: start - previous end
            pa.field("n_samples", pa.int32(), nullable=False),  # == global batch
            pa.field("tokens", pa.int64(), nullable=False),  # Σ prompt + response tokens
            pa.field("lag_mean", pa.float64(), nullable=False),  # mean policy lag of its samples
            pa.field("lag_max", pa.int32(), nullable=False),  # max policy lag of its samples
            pa.field("version", pa.int32(), nullable=False),  # version it published (step + 1)
        ]
    ),
    QUEUE: pa.schema(
        [
            pa.field("time", pa.float64(), nullable=False),  # seconds since start
            pa.field("depth", pa.int64(), nullable=False),  # samples queued for the trainer
            pa.field("in_flight", pa.int64(), nullable=False),  # samples dispatched, not yet returned
        ]
    ),
    CONSUMED: pa.schema(
        [
            pa.field("prompt_id", pa.string(), nullable=False),  # plan prompt id
            pa.field("sample_index", pa.int32(), nullable=False),  # 0..n_samples-1 within the prompt
            pa.field("consumed_step", pa.int32(), nullable=False),  # trainer step that consumed it
        ]
    ),
}
KINDS = tuple(SCHEMAS)
# Integer columns whose null means "not applicable"; in memory they hold -1.
NULLABLE_INT = {"consumed_step", "policy_lag"}
# Float columns whose null means "not recorded"; in memory they hold NaN.
NULLABLE_FLOAT = {"decode_time"}


def to_table(kind: str, columns: dict[str, np.ndarray]) -> pa.Table:
    """A part's columns (NumPy, -1 for null) as an Arrow table of the kind's schema."""
    schema = SCHEMAS[kind]
    arrays = []
    for f in schema:
        v = columns[f.name]
        # arrow_array and string_column, not pa.array: that imports pandas (~0.4 s of every run).
        if f.name in NULLABLE_INT:
            v = np.asarray(v)
            arrays.append(arrow_array(v, f.type, mask=v < 0))
        elif f.name in NULLABLE_FLOAT:
            v = np.asarray(v, dtype=np.float64)
            arrays.append(arrow_array(v, f.type, mask=np.isnan(v)))
        elif pa.types.is_string(f.type):
            arrays.append(string_column(list(v)))
        else:
            arrays.append(arrow_array(np.asarray(v), f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def to_columns(table: pa.Table) -> dict[str, np.ndarray]:
    """An Arrow table as NumPy columns, nulls in nullable integer columns as -1."""
    out = {}
    for name in table.column_names:
        col = table.column(name)
        if name in NULLABLE_INT:
            col = col.fill_null(arrow_scalar(-1, col.type))  # a Python -1 imports pandas
        out[name] = column_numpy(col)
    return out


def is_run_log(path: str | os.PathLike) -> bool:
    return (Path(path) / META_FILE).is_file()


# aspc.atomic's temporaries (.NAME.PID.X.tmp) of a run log's own files, and the folders a writer makes
# before its first meta.json.
_TEMP = re.compile(
    r"^\.(?:meta\.json|plan\.parquet|(?:part-\d{6}|epoch-\d+|revision-\d+)\.parquet)\.(\d+)\.[A-Za-z0-9_]+\.tmp$"
)
_SKELETON_DIRS = frozenset({*SCHEMAS, "plans", "payloads"})


def never_started(path: str | os.PathLike) -> bool:
    """``path`` is a directory holding only what a log's writers make before its first ``meta.json``.

    That is the lock file, temporaries, and part (or ``plans/``) folders
    holding nothing else: what a writer killed, or out of disk space, while it
    created the log leaves. It is no run and none of the user's files, so a
    rerun, ``--resume`` or ``--overwrite`` starts the log there afresh (before,
    all three refused it and only ``rm -rf`` went on, losing an epochs run's
    finished epochs with it).
    """
    p = Path(path)
    if not p.is_dir() or is_run_log(p):
        return False
    for e in p.iterdir():
        if e.name == LOCK_FILE or _leftover_temp(e):
            continue
        if e.name in _SKELETON_DIRS and e.is_dir() and not e.is_symlink() and all(map(_leftover_temp, e.iterdir())):
            continue
        return False
    return True


def _leftover_temp(e: Path) -> bool:
    """A temporary of a run log's own file whose writer is gone (a live one's is its writer's, not a leftover)."""
    m = _TEMP.match(e.name)
    return m is not None and e.is_file() and not e.is_symlink() and not pid_alive(int(m.group(1)))




@dataclass
class RunLog:
    """A run log read back."""

    path: Path  # the run directory
    meta: dict[str, Any]  # meta.json: format, status, config, summary, ...
    tables: dict[str, pa.Table]  # kind -> all its parts concatenated (empty table if none)

    @property
    def status(self) -> str:
        return str(self.meta.get("status"))


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """``meta.json`` of the run log at ``path``, checked for format and major version.

    Raises
    ------
    RunError
        Not a run log, or a corrupt ``meta.json``.
    SchemaVersionError
        A log written with another major format version.
    """
    p = Path(path)
    meta_path = p / META_FILE
    if not meta_path.is_file():
        if not os.path.lexists(p):
            raise RunError(f"{p}: no such directory; pass the directory given to 'aspc run --log'")
        hint = epochs_root_hint(p) or "; pass the directory given to 'aspc run --log'"
        raise RunError(f"{p}: not an aspc run log (no {META_FILE}){hint}")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
        raise RunError(f"{p}: corrupt {META_FILE}; the run log cannot be read") from None
    if not is_runlog_meta(meta):
        raise RunError(f"{p}: {META_FILE} is not an aspc run log's")
    check_runlog_version(meta, p, RunError)
    return meta


def live_tables(p: Path, meta: dict[str, Any]) -> dict[str, pa.Table]:
    """Every kind's committed parts concatenated (all parts for a log without ``parts``)."""
    ranges = part_ranges(meta, p, RunError)
    tables = {}
    for kind, schema in SCHEMAS.items():
        d = p / kind
        files = committed(sorted(d.glob("part-*.parquet")) if d.is_dir() else [], kind, ranges, p, RunError)
        if not files:
            tables[kind] = empty_table(schema)  # schema.empty_table() imports pandas
            continue
        try:
            tables[kind] = read_parquet_parts(files, schema=schema)
        except (pa.ArrowInvalid, OSError) as exc:
            raise RunError(
                f"{p}: unreadable {kind} parts ({short_reason(exc, limit=120)}); the run log is damaged: "
                "run the plan again with a new --log"
            ) from None
        _check_required(p, kind, files, tables[kind])
    return tables


def _check_required(p: Path, kind: str, files: list[Path], table: pa.Table) -> None:
    """Refuse nulls in a column the format requires: the reader fills a part's missing column with them."""
    for f in SCHEMAS[kind]:
        if f.nullable or not table.column(f.name).null_count:
            continue
        import pyarrow.parquet as pq

        lacking = [x for x in files if f.name not in pq.read_schema(x).names]
        what = f"{kind} part {lacking[0].name} lacks" if lacking else f"{kind} parts hold nulls in"
        raise RunError(f"{p}: {what} the column {f.name}, which the run log format requires; the run log is "
                       "damaged: run the plan again with a new --log")  # fmt: skip


def join_consumed(samples: pa.Table, consumed: pa.Table) -> pa.Table:
    """``samples`` (row order kept) with ``consumed_step`` and ``policy_lag`` filled in from ``consumed``."""
    if consumed.num_rows == 0:
        return samples
    # Matched on one string key, not with Table.join: that imports pyarrow.dataset, and pandas with it
    # (~0.4 s of every report and resume). The index's digits follow a separator that is no digit, so
    # no two (prompt_id, sample_index) pairs share a key.
    sep = arrow_scalar("/", pa.string())
    done = pc.binary_join_element_wise(consumed.column("prompt_id"), consumed.column("sample_index").cast(pa.string()), sep)
    if pc.count_distinct(done).as_py() < consumed.num_rows:
        return _joined(samples, consumed)  # a sample consumed twice: the join gives a row for each
    key = pc.binary_join_element_wise(samples.column("prompt_id"), samples.column("sample_index").cast(pa.string()), sep)
    step = pc.coalesce(samples.column("consumed_step"), consumed.column("consumed_step").take(pc.index_in(key, done)))
    return _with_steps(samples, step.cast(pa.int32())).combine_chunks()  # one chunk, as the join gave


def _joined(samples: pa.Table, consumed: pa.Table) -> pa.Table:
    """:func:`join_consumed` by a left outer join."""
    t = samples.append_column("__row", arrow_array(np.arange(samples.num_rows, dtype=np.int64), pa.int64()))
    c = consumed.rename_columns(["prompt_id", "sample_index", "__step"])
    j = t.join(c, keys=["prompt_id", "sample_index"], join_type="left outer").sort_by("__row")
    return _with_steps(j, pc.coalesce(j.column("consumed_step"), j.column("__step")).cast(pa.int32()))


def _with_steps(samples: pa.Table, step: Any) -> pa.Table:
    """``samples`` with ``step`` as its consumed_step, and the policy lag it gives."""
    lag = pc.subtract(step, samples.column("weights_version")).cast(pa.int32())
    cols = {name: samples.column(name) for name in SCHEMAS[SAMPLES].names}
    cols["consumed_step"], cols["policy_lag"] = step, lag
    return pa.Table.from_arrays([cols[f.name] for f in SCHEMAS[SAMPLES]], schema=SCHEMAS[SAMPLES])


def read_run_log(path: str | os.PathLike, *, allow_incomplete: bool = False) -> RunLog:
    """Read a run log directory: its committed parts, samples joined with their consumption.

    Raises
    ------
    RunError
        Not a run log, unreadable parts, or (unless ``allow_incomplete``) a
        run that did not complete.
    SchemaVersionError
        A log written with another major format version.
    """
    p = Path(path)
    meta = read_meta(p)
    if not allow_incomplete and meta.get("status") != STATUS_COMPLETE:
        raise RunError(
            f"{p}: run log status is {meta.get('status')!r}, not complete"
            + (f" ({meta['error']})" if meta.get("error") else "")
            + "; rerun it, or read it with allow_incomplete"
        )
    tables = live_tables(p, meta)
    tables[SAMPLES] = join_consumed(tables[SAMPLES], tables[CONSUMED])
    return RunLog(path=p, meta=meta, tables=tables)


def queue_columns(rows: list[tuple[float, int, int]]) -> dict[str, np.ndarray]:
    """The ``queue`` kind's columns from (time, depth, in flight) rows."""
    arr = np.asarray(rows, dtype=np.float64).reshape(-1, 3)
    return {"time": arr[:, 0], "depth": arr[:, 1].astype(np.int64), "in_flight": arr[:, 2].astype(np.int64)}
