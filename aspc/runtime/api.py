"""``run()``: execute a plan (dispatcher, bounded queue, workers, trainer, staggered reloads).

The runtime only executes; the plan already holds every scheduling decision
that can be made offline. :func:`run` builds the backend, trainer and engine
through :mod:`aspc.runtime.registry`, drives the pure
:class:`~aspc.runtime.core.scheduler.Scheduler` with
:func:`aspc.runtime.core.loop.drive`, and records the run with a
:class:`~aspc.runtime.record.recorder.Recorder` (the top layer of the runtime).

Example
-------
>>> from aspc.emit import read_plan                           # doctest: +SKIP
>>> result = run(read_plan("plan.parquet"), config=RunConfig(workers=8))  # doctest: +SKIP
>>> result.summary.mean_iteration_time                        # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from aspc.errors import AspcError, ConfigError, OutputError
from aspc.progress import NULL_PROGRESS, Progress
from aspc.runtime.backends.sim_cost import SimCostModel
from aspc.runtime.carry import carry_into, carry_record, check_carried, logged_versions, restore_carries
from aspc.runtime.config import RunConfig, check_staleness, parse_return_mode, resolve_queue_capacity
from aspc.runtime.contracts import BackendContext, Clock, GenerationBackend, Replanner, Trainer, trainer_hook
from aspc.runtime.core.batches import BatchBuilder
from aspc.runtime.core.loop import drive
from aspc.runtime.core.revise import revise_work
from aspc.runtime.core.scheduler import Scheduler
from aspc.runtime.hold import attach_holds, cut_scouts, held_record, left_over_without_held, work_extras
from aspc.runtime.lengths import SampleLengths, join_actual_lengths, lengths_info, sample_predicted_lengths
from aspc.runtime.record import resume as resume_log
from aspc.runtime.record.metrics import RunSummary, summarize
from aspc.runtime.record.payloads import restore_payloads
from aspc.runtime.record.recorder import Recorder
from aspc.runtime.record.replay import replay, restore_end
from aspc.runtime.record.runlog import STATUS_COMPLETE, read_meta, read_run_log
from aspc.runtime.record.runlog_writer import RunLogWriter
from aspc.runtime.registry import (
    BackendKind,
    make_backend,
    make_engine,
    make_trainer,
    parse_backend,
)
from aspc.runtime.shutdown import close_run, disk_full
from aspc.runtime.speed_probe import speed_probes
from aspc.runtime.work import work_from_table

__all__ = ["RunResult", "run"]


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
    sim_cost_model: SimCostModel | None = None,
    actual_lengths: dict[str, np.ndarray] | None = None,
    lengths_name: str = "",
    lengths_source: dict[str, Any] | None = None,
    backend: GenerationBackend | None = None,
    trainer: Trainer | None = None,
    log_dir: str | os.PathLike | None = None,
    overwrite: bool = False,
    resume: bool = False,
    replanner: Replanner | None = None,
    progress: Progress = NULL_PROGRESS,
    keep_open: bool = False,
    start_weights: Any = None,
    carried: np.ndarray | None = None,
    carry_through: int | None = None,
    part_of: dict[str, Any] | None = None,
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
    sim_cost_model
        Step-time coefficients of the ``sim`` backend and trainer
        (:class:`~aspc.runtime.backends.sim_cost.SimCostModel`; defaults when ``None``).
    actual_lengths
        Prompt id -> observed response lengths (as :func:`aspc.io.read_lengths`
        returns); sample ``i`` of a prompt replays its ``i``-th length. ``None``
        draws lengths from the plan's predictions (seeded; a note says so).
    lengths_name
        Name of the lengths source, for messages and the log metadata.
    lengths_source
        What else identifies the lengths source (the CLI passes the file's
        ``sha256``, ``length_field`` and ``id_field``). Recorded in the run
        log with a hash of the lengths themselves, so ``--resume`` refuses a
        same-named file with other contents or another length field.
    backend, trainer
        Instances to use instead of the ones ``config.backend`` names (tests,
        library users with their own trainer).
    log_dir
        Write the run log there (see :mod:`aspc.runtime.record.runlog`); ``None`` keeps
        it in memory only.
    overwrite
        Replace an existing aspc run log at ``log_dir``.
    resume
        Continue the run log at ``log_dir`` after a crash or a failure: what
        it holds durably is kept (see :mod:`aspc.runtime.record.runlog`), the rest is
        generated and trained; the plan and the configuration (all but
        ``log_flush_seconds``, ``max_retries`` and ``worker_timeout``) must be
        the log's. A complete log is returned as it is (with a note); no log
        at ``log_dir`` yet starts a fresh run.
    replanner
        Revises the undispatched remainder every ``replanner.every_steps``
        trainer steps (``aspc run --replan``, :mod:`aspc.replan`); the sim and
        model backends (hf, vllm) follow revisions. With ``resume`` its
        stored revisions are applied first (:meth:`Replanner.stored_revisions`).
        A rolling scout's (``holds_scouts``, :mod:`aspc.rolling_scout`) also
        holds the plan's scout responses for their groups and revises each
        window when its scout returns (:mod:`aspc.runtime.hold`).
    progress
        Progress sink (the CLI's bar).
    keep_open
        Leave ``backend`` and ``trainer`` open at the end (the caller closes
        them): the next :func:`run` with the same instances reuses the loaded
        models and continues training from the trainer's state
        (:func:`aspc.epochs.run_epochs` on real backends).
    start_weights
        A weights handle (as :attr:`TrainResult.weights`) every worker loads as its version 0 before the run's
        clock starts: the trainer's weights at the end of the previous epoch (on the Ray engine, through the
        object store into each actor; a replaced actor reloads it).
    carried, carry_through
        Per plan row, the length of a response generated before the run by its first weights (-1: none), kept
        as the row's last sample; and the newest weights version whose dispatches keep theirs (``None``: any; 0
        under ``max_staleness``). Sim backend, no replanner: :mod:`aspc.runtime.carry`.
    part_of
        The options of the run this log is one part of (an ``--epochs``/``--scout`` run's scout, whose own
        config differs), recorded in ``meta.json``: a resume given others is refused.

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
        The run failed part-way; its log is marked ``failed``. A full disk
        is a RunError too: the log keeps every committed part, resumable.
    LockError
        Another process is writing the run log at ``log_dir``.
    Interrupted
        SIGTERM/SIGINT under :func:`aspc.interrupt.handlers`: the commit in
        progress finished and the log is marked ``interrupted``, resumable.
    """
    config = config or RunConfig()
    config.validate()
    resume_log.check_log_options(log_dir, overwrite=overwrite, resume=resume)  # before a backend is built
    mode = parse_return_mode(config.return_mode)
    sim_cost_model = sim_cost_model or SimCostModel()
    table, plan_info = _plan_parts(plan)
    work = work_from_table(table, samples_per_prompt=config.samples_per_prompt)
    capacity = resolve_queue_capacity(config, int(work.minibatch_sizes.max()))
    largest = int(work.minibatch_sizes.max()) if replanner is None else replanner.largest_minibatch(work)
    check_staleness(config, largest, revised=replanner is not None)  # a revision too large never starts
    kind = parse_backend(config.backend)

    if carried is not None:
        check_carried(backend is None and kind is BackendKind.SIM, replanner)
    attach_holds(work, replanner, max_staleness=config.max_staleness)
    lengths: SampleLengths | None = None
    if backend is None and kind is BackendKind.SIM:
        if actual_lengths is not None:
            lengths = join_actual_lengths(
                work, actual_lengths, max_new_tokens=config.max_new_tokens, source_name=lengths_name
            )
        else:
            lengths = sample_predicted_lengths(work, seed=config.seed, max_new_tokens=config.max_new_tokens)
        cut_scouts(work, lengths.response_len)
    if carried is not None:
        carry_into(work, carried, config.max_new_tokens, config.max_staleness, carry_through)
    context = BackendContext(
        n_workers=config.workers,
        reload_time=config.reload_time,
        sim_cost_model=sim_cost_model,
        response_len=None if lengths is None else lengths.response_len,
    )
    # What run() builds it closes; what the caller hands in with keep_open, the caller closes.
    closes = (backend is None or not keep_open, trainer is None or not keep_open)
    backend = backend or make_backend(kind, context)
    trainer = trainer or make_trainer("sim", context)
    if config.speed_probe and backend.clock is Clock.VIRTUAL:
        raise ConfigError("--speed-probe times real generation; the sim backend has no machine speed to "
                          "probe: drop it, or use --backend hf|vllm")
    if replanner is not None and not hasattr(backend, "on_revision"):
        raise ConfigError(f"--replan needs a backend that follows plan revisions; {config.backend} does not yet (use sim)")
    writer = RunLogWriter(log_dir, overwrite=overwrite, resume=resume) if log_dir is not None else None
    if writer is not None:
        # Before the log's status is read: a second writer stops here.
        writer.acquire()
    try:
        result = _run_locked(
            plan_info, work, capacity, config, mode, sim_cost_model, lengths, backend, trainer,
            writer, log_dir, resuming=writer is not None and writer.resuming, progress=progress,
            lengths_info={**lengths_info(actual_lengths, lengths, lengths_name, lengths_source),
                          **({"part_of": part_of} if part_of else {})},  # fmt: skip
            replanner=replanner, closes=closes, start_weights=start_weights,
        )
        return result
    finally:
        if writer is not None:
            writer.release()


def _run_locked(
    plan_info: dict[str, Any],
    work: Any,
    capacity: int,
    config: RunConfig,
    mode: Any,
    sim_cost_model: SimCostModel,
    lengths: SampleLengths | None,
    backend: GenerationBackend,
    trainer: Trainer,
    writer: RunLogWriter | None,
    log_dir: str | os.PathLike | None,
    *,
    resuming: bool,
    progress: Progress,
    lengths_info: dict[str, Any],
    replanner: Replanner | None = None,
    closes: tuple[bool, bool] = (True, True),
    start_weights: Any = None,
) -> RunResult:
    """The body of :func:`run` once the log's writer lock is held."""
    run_info = {
        "samples_planned": work.n_total_samples,
        "n_minibatches": work.n_minibatches,
        "queue_capacity": capacity,
        "length_source": None if lengths is None else lengths.source,
        "work_hash": resume_log.work_hash(work),
        # Re-planning changes the schedule a resume must follow: None = off.
        "replan_every": None if replanner is None else int(replanner.every_steps or 0),
        **lengths_info,
    }
    run_info["trainer"] = resume_log.trainer_record(trainer)
    if (sampling := resume_log.sampling_record(backend)) is not None:  # a model backend's
        run_info["sampling"] = sampling
    if work.carried is not None:  # absent otherwise: earlier logs compare equal
        run_info["carried"] = carry_record(work)
    if work.holds is not None:
        run_info["held"] = held_record(work)
    new_meta = {
        "config": resume_log.config_record(config),
        "cost_model": sim_cost_model.to_dict(),  # the key run logs have always used
        "plan": plan_info,
        "run": run_info,
    }
    if resuming:
        assert log_dir is not None and writer is not None
        old = read_meta(log_dir)
        resume_log.check_resumable(Path(log_dir), old, new_meta)
        if old.get("status") == STATUS_COMPLETE:
            writer.tidy()
            summary, columns = resume_log.completed_run(Path(log_dir))
            if not closes[1]:  # an epoch read back: the trainer carried into the next one goes on from its end
                trainer_hook(trainer, "setup", work)  # the plan as the run was set up, before the revisions below
                restore_end(trainer, summary.n_trainer_steps, log_dir)
            if work.carried is not None:  # (never revised: carried responses refuse a replanner)
                restore_carries(work, logged_versions(work, columns["minibatches"]))
            if replanner is not None:  # the plan as the run ended: a rolling scout's revisions change its counts
                for first, tail in replanner.stored_revisions():
                    revise_work(work, first, tail)
                summary.samples_planned = work.n_total_samples
            if lengths is not None:  # as the run that completed it reported
                summary.extra["length_source"] = lengths.source
            stored = old.get("summary") if isinstance(old.get("summary"), dict) else {}  # older logs: the work now
            summary.extra.update({k: stored.get(k, v) for k, v in work_extras(work).items()})
            left_over_without_held(summary)
            return RunResult(
                summary=summary,
                columns=columns,
                lengths=lengths,
                notes=[f"{Path(log_dir)}: the run is already complete; nothing to resume"],
                log_dir=Path(log_dir),
            )
    engine = make_engine(config.engine, backend, trainer, mode, worker_timeout=config.worker_timeout)

    try:
        if isinstance(getattr(backend, "run_seed", None), int):  # a model backend: samples seeded per epoch
            backend.run_seed = config.seed  # type: ignore[attr-defined]
        backend.setup(work, config.workers)
        if getattr(backend, "prompt_token_counts", None):  # a model's tokenizer counted them: the plan estimated
            work.count_prompt_tokens(backend.prompt_token_counts)  # type: ignore[attr-defined]
        trainer_hook(trainer, "setup", work)
        if start_weights is not None:
            engine.load_start_weights(start_weights, config.workers)
        probes = speed_probes(engine, config.workers) if config.speed_probe else None
        # The clock starts at the first dispatch: loading in setup is no generation time (virtual clock: a no-op).
        engine.advance_clock(0.0)
        if writer is not None:
            writer.start(new_meta)
        recorder = Recorder(work, writer, flush_seconds=config.log_flush_seconds)
        recorder.payloads.durable = trainer.durable  # at each commit: what a resume would restore and replay
        revision = 0
        if resuming and replanner is not None:
            # The log numbers minibatches and samples as the last revision left them.
            for first, tail in replanner.stored_revisions():
                revision += 1
                new_to_old = revise_work(work, first, tail)
                backend.on_revision(work, first, new_to_old)  # type: ignore[attr-defined]
                recorder.on_revision(work, first, new_to_old, revision)
        scheduler = Scheduler(
            work.minibatch_sizes,
            config.workers,
            config.global_batch,
            capacity,
            max_retries=config.max_retries,
            max_staleness=config.max_staleness,
            holds=work.holds,
        )
        batches = BatchBuilder(work)
        weights = None
        steps_done = 0
        notes: list[str] = []
        refused = False  # a resume refused before any new work leaves the log as it found it
        open_log = writer  # the writer until the run's own failure marks the log
    except BaseException as exc:
        if writer is not None and writer.started:  # a signal once meta.json said "running": say what happened
            writer.abort(exc, lambda: None)
        # A vLLM engine left open kept the process waiting at exit for its engine-core process.
        close_run(engine, backend, trainer, closes, None, None)
        raise
    try:
        if resuming:
            assert log_dir is not None and writer is not None
            refused = True
            state = recorder.restore(log := read_run_log(log_dir, allow_incomplete=True))
            scheduler.restore(state.done, state.queued, state.next_step)
            batches.restore(state.response_len, state.minibatch_version)
            returns_payload = bool(getattr(getattr(backend, "options", None), "return_payload", False))
            notes += restore_payloads(Path(log_dir), work, state.queued, batches, recorder, returns_payload)
            restore_carries(work, state.minibatch_version)
            engine.advance_clock(state.clock)
            weights, replayed = replay(log, work, trainer, batches, recorder.payloads, state.next_step, returns_payload)
            steps_done = state.next_step
            notes.append(
                f"resumed {log_dir}: {int(state.done.sum())} of {work.n_minibatches} minibatches and "
                f"{state.next_step} trainer steps were durable; {state.queued.size} generated samples wait "
                f"for the trainer"
            )
            notes += replayed
            refused = False
        def on_revision(work_now, first, new_to_old, revision):  # noqa: ANN001 - see drive()
            backend.on_revision(work_now, first, new_to_old)  # type: ignore[union-attr]
            recorder.on_revision(work_now, first, new_to_old, revision)

        drive(
            work,
            scheduler,
            engine,
            recorder,
            progress,
            weights=weights,
            batches=batches,
            replanner=replanner,
            on_revision=on_revision if replanner is not None else None,
            steps_done=steps_done,
            revision=revision,
        )
        if probes is not None:
            probes = {"before": probes, "after": speed_probes(engine, config.workers, notes)}
        notes += (replanner.notes() if replanner is not None else []) + list(getattr(backend, "setup_notes", []))
    except BaseException as exc:
        open_log = None
        if writer is not None and refused and isinstance(exc, AspcError):
            writer.put_back()
        elif writer is not None:
            writer.abort(exc, recorder.flush)
            if isinstance(exc, OutputError):
                raise disk_full(exc, log_dir) from None
        raise
    finally:
        # The trainer's close() failure: raised once the log is whole. A Ctrl-C while Ray or vLLM shut down marks it.
        late = close_run(engine, backend, trainer, closes, open_log, recorder.flush)
    columns = recorder.all_columns()
    summary = summarize(
        columns, n_workers=config.workers, samples_planned=work.n_total_samples, queue_capacity=capacity
    )
    if lengths is not None:
        summary.extra["length_source"] = lengths.source
    if probes is not None:
        summary.extra["speed_probe_s"] = probes
    summary.extra.update(work_extras(work))
    left_over_without_held(summary)
    if recorder.n_faults:
        summary.extra["worker_faults"] = recorder.n_faults
        notes.append(f"{recorder.n_faults} worker faults: their minibatches were generated again")
    if writer is not None:
        try:
            writer.finish(summary.to_dict())
        except BaseException as exc:
            writer.abort(exc, lambda: None)
            if isinstance(exc, OutputError):
                raise disk_full(exc, log_dir) from None
            raise
    if late is not None:
        raise late
    return RunResult(
        summary=summary,
        columns=columns,
        lengths=lengths,
        notes=(list(lengths.notes) if lengths is not None else []) + notes,
        log_dir=None if log_dir is None else Path(log_dir),
    )

