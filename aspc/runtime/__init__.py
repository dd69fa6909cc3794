"""Execute a plan: dispatcher, bounded queue, workers, trainer, staggered reloads.

The runtime only executes; the plan already holds every scheduling decision
that can be made offline. One loop (:func:`aspc.runtime.loop.drive`) runs the
pure :class:`~aspc.runtime.scheduler.Scheduler` against an
:class:`~aspc.runtime.engine.Engine`: the ``sim`` backend on a virtual clock,
real backends (later) on the wall clock.

Example
-------
>>> from aspc.emit import read_plan                           # doctest: +SKIP
>>> result = run(read_plan("plan.parquet"), config=RunConfig(workers=8))  # doctest: +SKIP
>>> result.summary.mean_iteration_time                        # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from aspc.errors import ConfigError
from aspc.progress import NULL_PROGRESS, Progress
from aspc.runtime.backend import (
    BACKENDS,
    BackendContext,
    BackendKind,
    Clock,
    GenerationBackend,
    GenerationResult,
    TrainBatch,
    Trainer,
    TrainResult,
    make_backend,
    make_trainer,
    parse_backend,
)
from aspc.runtime.config import (
    OPERATIONAL_KEYS,
    RETURN_MODES,
    ReturnMode,
    RunConfig,
    parse_return_mode,
    resolve_queue_capacity,
)
from aspc.runtime.engine import ENGINES, Engine, EngineKind, make_engine, parse_engine
from aspc.runtime.lengths import SampleLengths, join_actual_lengths, sample_predicted_lengths
from aspc.runtime.loop import drive
from aspc.runtime.metrics import RunSummary, summarize, summarize_log
from aspc.runtime.recorder import Recorder
from aspc.runtime.runlog import STATUS_COMPLETE, RunLog, RunLogWriter, is_run_log, read_meta, read_run_log
from aspc.runtime.runlog import to_columns as R_to_columns
from aspc.runtime.scheduler import Scheduler
from aspc.runtime.sim.cost import CostModel, load_cost_model
from aspc.runtime.work import MinibatchWork, WorkPlan, work_from_table

__all__ = [
    "BACKENDS",
    "ENGINES",
    "RETURN_MODES",
    "BackendContext",
    "BackendKind",
    "Clock",
    "CostModel",
    "Engine",
    "EngineKind",
    "GenerationBackend",
    "GenerationResult",
    "MinibatchWork",
    "ReturnMode",
    "RunConfig",
    "RunLog",
    "RunResult",
    "RunSummary",
    "SampleLengths",
    "Scheduler",
    "TrainBatch",
    "TrainResult",
    "Trainer",
    "WorkPlan",
    "load_cost_model",
    "read_run_log",
    "resume_status",
    "run",
    "summarize_log",
    "work_from_table",
]


@dataclass
class RunResult:
    """What :func:`run` returns."""

    summary: RunSummary  # the metrics ``aspc run`` prints
    columns: dict[str, dict[str, np.ndarray]]  # every run-log row in memory (no prompt ids)
    lengths: SampleLengths | None  # lengths the sim replayed and their source; None for real backends
    notes: list[str] = field(default_factory=list)  # diagnostics for stderr
    log_dir: Path | None = None  # where the run log was written, if anywhere


def _plan_parts(plan: Any) -> tuple[pa.Table, dict[str, Any]]:
    """Accept a :class:`aspc.emit.Plan` or a bare plan table."""
    if isinstance(plan, pa.Table):
        return plan, {}
    info = {
        "input_hash": getattr(plan, "input_hash", ""),
        "rows_hash": getattr(plan, "stored_rows_hash", ""),
        "schema_version": getattr(plan, "schema_version", ""),
        "strategy": (getattr(plan, "config", None) or {}).get("strategy"),
    }
    return plan.table, info


def run(
    plan: Any,
    *,
    config: RunConfig | None = None,
    cost_model: CostModel | None = None,
    actual_lengths: dict[str, np.ndarray] | None = None,
    lengths_name: str = "",
    backend: GenerationBackend | None = None,
    trainer: Trainer | None = None,
    log_dir: str | os.PathLike | None = None,
    overwrite: bool = False,
    resume: bool = False,
    progress: Progress = NULL_PROGRESS,
) -> RunResult:
    """Execute ``plan`` and return its metrics.

    Parameters
    ----------
    plan
        An :class:`aspc.emit.Plan` (as :func:`aspc.emit.read_plan` returns) or
        a plan table with the PLAN_SCHEMA columns in dispatch order.
    config
        Workers, global batch, queue capacity, reload time, return mode, seed,
        backend and engine names. Defaults to :class:`RunConfig()`.
    cost_model
        Step-time coefficients of the ``sim`` backend and trainer.
    actual_lengths
        Prompt id -> observed response lengths (as :func:`aspc.io.read_lengths`
        returns); sample ``i`` of a prompt replays its ``i``-th length. ``None``
        draws lengths from the plan's predictions (seeded; a note says so).
    lengths_name
        Name of the lengths source, for messages and the log metadata.
    backend, trainer
        Instances to use instead of the ones ``config.backend`` names (tests,
        library users with their own trainer).
    log_dir
        Write the run log there (see :mod:`aspc.runtime.runlog`); ``None`` keeps
        it in memory only.
    overwrite
        Replace an existing aspc run log at ``log_dir``.
    resume
        Continue the run log at ``log_dir`` after a crash or a failure: what
        it holds durably is kept (see :mod:`aspc.runtime.runlog`), the rest is
        generated and trained; the plan and the configuration (all but
        ``log_flush_seconds``, ``max_retries`` and ``worker_timeout``) must be
        the log's. A complete log is returned as it is (with a note); no log
        at ``log_dir`` yet starts a fresh run.
    progress
        Progress sink (the CLI's bar).

    Raises
    ------
    ConfigError
        Invalid options (W = 0, a queue smaller than one global batch, ...),
        checked before anything is written.
    InputError
        Actual lengths missing for some prompts.
    BackendError
        A backend or engine that cannot run here.
    RunError
        The run failed part-way; its log is marked ``failed``.
    """
    config = config or RunConfig()
    config.validate()
    mode = parse_return_mode(config.return_mode)
    cost_model = cost_model or CostModel()
    table, plan_info = _plan_parts(plan)
    work = work_from_table(table, samples_per_prompt=config.samples_per_prompt)
    capacity = resolve_queue_capacity(config, int(work.minibatch_sizes.max()))
    kind = parse_backend(config.backend)
    parse_engine(config.engine)

    lengths: SampleLengths | None = None
    if backend is None and kind is BackendKind.SIM:
        if actual_lengths is not None:
            lengths = join_actual_lengths(
                work, actual_lengths, max_new_tokens=config.max_new_tokens, source_name=lengths_name
            )
        else:
            lengths = sample_predicted_lengths(work, seed=config.seed, max_new_tokens=config.max_new_tokens)
    context = BackendContext(
        n_workers=config.workers,
        reload_time=config.reload_time,
        cost_model=cost_model,
        response_len=None if lengths is None else lengths.response_len,
    )
    backend = backend or make_backend(kind, context)
    trainer = trainer or make_trainer("sim", context)
    if resume and log_dir is None:
        raise ConfigError("--resume continues a run log: pass the run's --log directory")
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; pass one of them")
    writer = RunLogWriter(log_dir, overwrite=overwrite, resume=resume) if log_dir is not None else None
    if writer is not None:
        writer.check()
    run_info = {
        "samples_planned": work.n_total_samples,
        "n_minibatches": work.n_minibatches,
        "queue_capacity": capacity,
        "length_source": None if lengths is None else lengths.source,
        "lengths_name": lengths_name or None,
        "work_hash": work_hash(work),
    }
    new_meta = {
        "config": _config_record(config),
        "cost_model": cost_model.to_dict(),
        "plan": plan_info,
        "run": run_info,
    }
    resuming = writer is not None and writer.resuming
    if resuming:
        assert log_dir is not None
        old = read_meta(log_dir)
        _check_resumable(Path(log_dir), old, new_meta)
        if old.get("status") == STATUS_COMPLETE:
            writer.tidy()
            return _completed_result(Path(log_dir), lengths)
    engine = make_engine(config.engine, backend, trainer, mode, worker_timeout=config.worker_timeout)

    backend.setup(work, config.workers)
    trainer.setup(work)
    # The run's clock starts at the first dispatch: model loading in setup is
    # not generation time (a no-op on the virtual clock).
    engine.advance_clock(0.0)
    if writer is not None:
        writer.start(new_meta)
    recorder = Recorder(work, writer, flush_seconds=config.log_flush_seconds)
    scheduler = Scheduler(
        work.minibatch_sizes, config.workers, config.global_batch, capacity, max_retries=config.max_retries
    )
    weights = None
    notes: list[str] = []
    try:
        if resuming:
            assert log_dir is not None
            state = recorder.restore(read_run_log(log_dir, allow_incomplete=True))
            scheduler.restore(state.done, state.queued, state.next_step)
            engine.advance_clock(state.clock)
            weights = trainer.restore(state.next_step)
            notes.append(
                f"resumed {log_dir}: {int(state.done.sum())} of {work.n_minibatches} minibatches and "
                f"{state.next_step} trainer steps were durable; {state.queued.size} generated samples wait "
                f"for the trainer"
            )
        drive(work, scheduler, engine, recorder, progress, weights=weights)
    except BaseException as exc:
        if writer is not None:
            try:
                recorder.flush()
            finally:
                writer.fail(" ".join(str(exc).split()) or type(exc).__name__)
        raise
    finally:
        engine.close()
        backend.close()
        trainer.close()
    columns = recorder.all_columns()
    summary = summarize(
        columns, n_workers=config.workers, samples_planned=work.n_total_samples, queue_capacity=capacity
    )
    if lengths is not None:
        summary.extra["length_source"] = lengths.source
    if recorder.n_faults:
        summary.extra["worker_faults"] = recorder.n_faults
        notes.append(f"{recorder.n_faults} worker faults: their minibatches were generated again")
    if writer is not None:
        writer.finish(summary.to_dict())
    return RunResult(
        summary=summary,
        columns=columns,
        lengths=lengths,
        notes=(list(lengths.notes) if lengths is not None else []) + notes,
        log_dir=None if log_dir is None else Path(log_dir),
    )


def work_hash(work: WorkPlan) -> str:
    """Hash of what a run generates: prompt ids, minibatch boundaries, samples per prompt."""
    h = hashlib.sha256()
    h.update("\x00".join(str(p) for p in work.prompt_ids.tolist()).encode())
    h.update(np.ascontiguousarray(work.row_offsets, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(work.n_samples, dtype=np.int64).tobytes())
    return h.hexdigest()


def resume_status(log_dir: str | os.PathLike) -> str | None:
    """Status of the run log at ``log_dir`` (``running``, ``failed``, ``complete``), or None if there is none."""
    if not is_run_log(log_dir):
        return None
    return str(read_meta(log_dir).get("status"))


def _check_resumable(path: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` unless the log at ``path`` ran this plan with this configuration."""
    diffs = []
    if (old.get("run") or {}).get("work_hash") != new["run"]["work_hash"]:
        diffs.append("the plan (prompts, minibatches or samples per prompt)")
    for key in ("input_hash", "rows_hash"):
        a, b = (old.get("plan") or {}).get(key), new["plan"].get(key)
        if a and b and a != b:
            diffs.append(f"the plan's {key}")
            break
    oc, nc = old.get("config") or {}, new["config"]
    diffs += [
        f"--{k.replace('_', '-')} ({oc.get(k)!r} in the log, {nc.get(k)!r} now)"
        for k in sorted(set(oc) | set(nc))
        if k not in OPERATIONAL_KEYS and oc.get(k) != nc.get(k)
    ]
    if (old.get("cost_model") or {}) != new["cost_model"]:
        diffs.append("the cost model")
    old_len = (old.get("run") or {}).get("lengths_name")
    if old_len != new["run"]["lengths_name"]:
        diffs.append(f"--actual-lengths ({old_len!r} in the log, {new['run']['lengths_name']!r} now)")
    if diffs:
        raise ConfigError(
            f"--resume {path}: this run differs from the logged one in {'; '.join(diffs)}; "
            "resume with the original options, or start a new run"
        )


def _completed_result(path: Path, lengths: SampleLengths | None) -> RunResult:
    log = read_run_log(path)
    summary = summarize_log(log)
    cols = {k: R_to_columns(t) for k, t in log.tables.items()}
    return RunResult(
        summary=summary,
        columns=cols,
        lengths=lengths,
        notes=[f"{path}: the run is already complete; nothing to resume"],
        log_dir=path,
    )


def _config_record(config: RunConfig) -> dict[str, Any]:
    d = dataclasses.asdict(config)
    d["return_mode"] = ReturnMode(config.return_mode).value
    return d
