"""What happened in a run, as NumPy arrays; flushed to the run log in parts.

The recorder observes :func:`aspc.runtime.core.loop.drive`: it is told the
scheduler's decisions, the batches the loop hands the trainer, and the
engine's events, and changes none of them. It keeps per-sample and per-minibatch
arrays indexed by id (so a million-sample run costs a few vectorised writes,
not a million Python rows) and remembers which rows are new since the last
flush, so the run log grows append-only.

Each flush is one commit (see :mod:`aspc.runtime.record.runlog` for what is durable
when): finished minibatches with their sample rows, then the trainer steps
whose consumption can be committed, then queue rows. :meth:`Recorder.restore`
loads a committed log back into the arrays to resume a run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from aspc import interrupt
from aspc.errors import RunError
from aspc.runtime.contracts import TrainBatch
from aspc.runtime.core.events import MinibatchFailed, MinibatchFinished, SamplesReturned, TrainFinished
from aspc.runtime.core.scheduler import Dispatch
from aspc.runtime.core.timeline import Timeline
from aspc.runtime.hold import queued_on_resume
from aspc.runtime.record import runlog as R
from aspc.runtime.record.payloads import PendingPayloads
from aspc.runtime.record.restore_checks import check_restored, sorted_steps
from aspc.runtime.record.runlog_writer import RunLogWriter
from aspc.runtime.record.timeline import record_timeline
from aspc.runtime.work import WorkPlan

MAX_FAULTS_KEPT = 100  # worker faults listed in meta.json (all are counted)


@dataclass
class ResumeState:
    """Where a resumed run starts, as read from its log by :meth:`Recorder.restore`."""

    done: np.ndarray  # bool per minibatch: generated, durable
    queued: np.ndarray  # int64 sample ids generated but not consumed, oldest first
    next_step: int  # trainer steps durable; the newest weights version
    clock: float  # seconds: the latest time in the log, where the resumed timeline starts
    response_len: np.ndarray  # int64 per sample: tokens generated, -1 where not durable
    minibatch_version: np.ndarray  # int32 per minibatch: weights version that generated it, -1 if none


class Recorder:
    """Collects a run's timeline and writes it to an optional :class:`~aspc.runtime.record.runlog_writer.RunLogWriter`.

    Parameters
    ----------
    work
        The expanded plan.
    writer
        Where parts go; ``None`` keeps everything in memory only.
    flush_seconds
        Wall seconds between flushes of new rows (a last flush happens at the end).
    """

    def __init__(self, work: WorkPlan, writer: RunLogWriter | None = None, flush_seconds: float = 10.0):
        self.work = work
        self.writer = writer
        self.flush_seconds = flush_seconds
        m, n = work.n_minibatches, work.n_total_samples
        # Per minibatch, indexed by id; -1 / NaN until known.
        self.mb_worker = np.full(m, -1, dtype=np.int32)
        self.mb_version = np.full(m, -1, dtype=np.int32)
        self.mb_reload = np.zeros(m, dtype=bool)
        self.mb_dispatch = np.full(m, np.nan)
        self.mb_start = np.full(m, np.nan)
        self.mb_end = np.full(m, np.nan)
        self.mb_tokens = np.zeros(m, dtype=np.int64)
        self.mb_max_len = np.zeros(m, dtype=np.int64)
        self.mb_context = np.zeros(m, dtype=np.float64)
        self.mb_revision = np.zeros(m, dtype=np.int32)  # plan revision that defined the minibatch (0 = the plan)
        self.mb_prompt_tokens = np.add.reduceat(work.prompt_tokens, work.row_offsets[:-1]).astype(np.int64)
        self.sample_mb = np.repeat(np.arange(m, dtype=np.int32), work.minibatch_sizes)
        self.sample_ptok = work.sample_prompt_tokens()
        # Per sample, indexed by global id.
        self.response_len = np.full(n, -1, dtype=np.int64)
        self.finish_time = np.full(n, np.nan)
        self.decode_time = np.full(n, np.nan)  # seconds from its minibatch's start to its last token (calibration)
        self.consumed_step = np.full(n, -1, dtype=np.int32)
        self.generated = np.zeros(n, dtype=np.int32)  # times each sample was returned (must end at 1)
        self._arrivals: list[SamplesReturned] = []  # returned samples not yet written into the arrays
        self._unfeatured: list[int] = []  # finished minibatches whose token features are not computed yet
        # Per trainer step, appended in step order.
        self.step_start: list[float] = []
        self.step_end: list[float] = []
        self.step_n: list[int] = []
        self.step_tokens: list[int] = []
        self.step_lag_mean: list[float] = []
        self.step_lag_max: list[int] = []
        # Queue depth after every change: (time, depth, in flight).
        self.queue_rows: list[tuple[float, int, int]] = []
        self.leftover = np.empty(0, dtype=np.int64)
        # Rows not yet flushed.
        self._new_mbs: list[int] = []
        self._step_ids: list[np.ndarray | None] = []  # per step, sample ids consumed (None once committed)
        self._new_steps_from = 0  # first finished step not yet flushed
        self._steps_done = 0
        self._new_queue_from = 0
        self._last_flush = time.monotonic()
        self.n_faults = 0  # worker faults (failed minibatch attempts) over the run
        self.faults: list[dict[str, Any]] = []  # the first MAX_FAULTS_KEPT, for meta.json
        self.payloads = PendingPayloads()  # of samples whose consumption is not yet durable (--resume needs them)

    def on_revision(self, work: WorkPlan, first: int, new_to_old: np.ndarray, revision: int) -> None:
        """Minibatches ``>= first`` were replaced by revision ``revision`` (none dispatched yet)."""
        self._apply_minibatch_features()
        m = work.n_minibatches
        for name, fill in (
            ("mb_worker", -1), ("mb_version", -1), ("mb_reload", False), ("mb_dispatch", np.nan),
            ("mb_start", np.nan), ("mb_end", np.nan), ("mb_tokens", 0), ("mb_max_len", 0),
            ("mb_context", 0.0), ("mb_revision", revision),
        ):
            old = getattr(self, name)
            new = np.full(m, fill, dtype=old.dtype)
            new[:first] = old[:first]
            setattr(self, name, new)
        self.mb_prompt_tokens = np.add.reduceat(work.prompt_tokens, work.row_offsets[:-1]).astype(np.int64)
        self.sample_mb = np.repeat(np.arange(m, dtype=np.int32), work.minibatch_sizes)
        self.sample_ptok = work.sample_prompt_tokens()
        for name in ("response_len", "finish_time", "decode_time", "consumed_step", "generated"):
            setattr(self, name, getattr(self, name)[new_to_old])

    # ---- decisions -------------------------------------------------------------

    def on_dispatch(self, action: Dispatch, now: float) -> None:
        m = action.minibatch
        self.mb_worker[m] = action.worker
        self.mb_version[m] = action.weights_version
        self.mb_reload[m] = action.reload_version is not None
        self.mb_dispatch[m] = now

    def on_train_start(self, batch: TrainBatch, now: float) -> None:
        """Record the start of a trainer step and what it consumes."""
        ids = batch.samples
        lags = batch.step - batch.weights_version
        self.consumed_step[ids] = batch.step
        self.step_start.append(now)
        self.step_n.append(int(ids.size))
        self.step_tokens.append(int(batch.response_len.sum() + batch.prompt_tokens.sum()))
        self.step_lag_mean.append(float(lags.mean()))
        self.step_lag_max.append(int(lags.max()))
        self._step_ids.append(ids)

    # ---- events ----------------------------------------------------------------

    def on_samples(self, ev: SamplesReturned) -> None:
        # Buffered and applied in bulk (continuous mode returns up to one event
        # per sample; a numpy scatter per event would dominate the run).
        self._arrivals.append(ev)
        self.payloads.add(ev.samples, None if self.writer is None else ev.payload)  # for the log's payload parts

    def _apply_arrivals(self) -> None:
        if not self._arrivals:
            return
        evs, self._arrivals = self._arrivals, []
        ids = np.concatenate([ev.samples for ev in evs])
        self.response_len[ids] = np.concatenate([ev.response_len for ev in evs])
        self.finish_time[ids] = np.repeat([ev.time for ev in evs], [ev.samples.size for ev in evs])
        np.add.at(self.generated, ids, 1)

    def on_minibatch_done(self, ev: MinibatchFinished) -> None:
        m = ev.minibatch
        self.mb_start[m] = ev.start
        self.mb_end[m] = ev.end
        self.decode_time[self.work.sample_offsets[m] : self.work.sample_offsets[m + 1]] = ev.result.finish_offset
        self._new_mbs.append(m)
        self._unfeatured.append(m)

    def on_minibatch_failed(self, ev: MinibatchFailed) -> None:
        self.n_faults += 1
        if len(self.faults) < MAX_FAULTS_KEPT:
            self.faults.append(
                {"time": ev.time, "worker": ev.worker, "minibatch": ev.minibatch, "error": ev.error, "lost": ev.lost}
            )

    def _apply_minibatch_features(self) -> None:
        """Token features of finished minibatches, from their samples' lengths, in bulk."""
        self._apply_arrivals()
        if not self._unfeatured:
            return
        mbs = np.asarray(self._unfeatured, dtype=np.int64)
        self._unfeatured = []
        lens = self.response_len
        starts = self.work.sample_offsets[:-1]
        self.mb_tokens[mbs] = np.add.reduceat(lens, starts)[mbs]
        self.mb_max_len[mbs] = np.maximum.reduceat(lens, starts)[mbs]
        # Σ over decode steps of the active sequences' context: each sequence
        # contributes p·l + l(l-1)/2 (prompt plus tokens so far, at each of its steps).
        ctx = self.sample_ptok * lens + lens * (lens - 1) / 2.0
        self.mb_context[mbs] = np.add.reduceat(ctx, starts)[mbs]

    @property
    def takes_whole_run(self) -> bool:
        """Not a log committed every loop turn (flush 0); a one-call run commits once, well under 1 s in."""
        return self.writer is None or self.flush_seconds > 0

    def on_timeline(self, tl: Timeline) -> None:
        """A whole fresh run at once (an engine's ``run_all``): the same rows its events would have left."""
        record_timeline(self, tl)

    def on_train_done(self, ev: TrainFinished) -> None:
        self.step_end.append(ev.end)
        self._steps_done += 1

    def on_queue(self, now: float, depth: int, in_flight: int) -> None:
        row = (now, depth, in_flight)
        if not self.queue_rows or self.queue_rows[-1][1:] != row[1:]:
            self.queue_rows.append(row)

    def step_wait(self, k: int) -> float:
        return self.step_start[k] - (self.step_end[k - 1] if k > 0 else 0.0)

    def finish(self, leftover: np.ndarray) -> None:
        """Record the samples left over, check conservation, and flush everything.

        Raises
        ------
        RunError
            A planned sample was generated zero or several times, or consumed
            and left over at once: the run cannot be trusted.
        """
        self.leftover = leftover
        self._apply_arrivals()
        bad = np.flatnonzero(self.generated != 1)
        if bad.size:
            raise RunError(
                f"{bad.size} planned samples were generated {int(self.generated[bad[0]])} times instead of once "
                f"(e.g. sample {int(bad[0])}); the run log is inconsistent"
            )
        if leftover.size and np.any(self.consumed_step[leftover] >= 0):
            raise RunError("a sample was both consumed and left over; the run log is inconsistent")
        self.flush()

    # ---- output ----------------------------------------------------------------

    def maybe_flush(self) -> None:
        if self.writer is not None and time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        """Write every row new since the last flush (one part per kind) and commit them together.

        Finished minibatches go with their sample rows (``consumed_step``
        null). A finished trainer step goes with its ``consumed`` rows, in
        step order, once every sample it consumed is in a finished minibatch
        (in continuous mode a step can consume samples of a minibatch still
        running; such a step waits for a later flush).
        """
        self._last_flush = time.monotonic()
        self._apply_minibatch_features()
        if self.writer is None:
            return
        # SIGTERM/SIGINT wait until this flush has committed (aspc.interrupt).
        with interrupt.deferred():
            self._flush()

    def _flush(self) -> None:
        if self._new_mbs:
            mbs = np.asarray(self._new_mbs, dtype=np.int64)
            self._new_mbs = []
            offs = self.work.sample_offsets
            ids = np.concatenate([np.arange(offs[m], offs[m + 1], dtype=np.int64) for m in mbs.tolist()])
            self.writer.write_part(R.SAMPLES, self.sample_columns(ids, consumed=False))
            self.writer.write_part(R.MINIBATCHES, self.minibatch_columns(mbs))
        a = b = self._new_steps_from
        durable = np.empty(0, dtype=np.int64)  # samples whose consumption this commit makes durable
        while b < self._steps_done:
            ids = self._step_ids[b]
            assert ids is not None
            if np.isnan(self.mb_end[self.sample_mb[ids]]).any():
                break
            b += 1
        if b > a:
            ids = durable = np.concatenate([self._step_ids[k] for k in range(a, b)])  # type: ignore[misc]
            self.writer.write_part(
                R.CONSUMED,
                {
                    "prompt_id": self.work.prompt_ids[self.work.sample_row[ids]],
                    "sample_index": self.work.sample_index[ids],
                    "consumed_step": self.consumed_step[ids],
                },
            )
            self.writer.write_part(R.STEPS, self.step_columns(a, b))
            for k in range(a, b):
                self._step_ids[k] = None
            self._new_steps_from = b
        if len(self.queue_rows) > self._new_queue_from:
            rows = self.queue_rows[self._new_queue_from :]
            self._new_queue_from = len(self.queue_rows)
            self.writer.write_part(R.QUEUE, R.queue_columns(rows))
        if not self.payloads.idle:  # before the commit: the parts hold what it commits (see payloads)
            self.payloads.write(self.writer.path, ~np.isnan(self.mb_end)[self.sample_mb], self.work)
        self.writer.commit(faults={"count": self.n_faults, "first": self.faults})
        self.payloads.release(durable, self.consumed_step[durable], self._new_steps_from)

    def restore(self, log: R.RunLog) -> ResumeState:
        """Load the committed rows of ``log`` (a run of this same plan) and say where to resume.

        Raises
        ------
        RunError
            The log's rows do not fit this plan or contradict each other.
        """
        work = self.work
        where = f"{log.path}: cannot resume"
        smp = log.tables[R.SAMPLES]
        row_of = {pid: r for r, pid in enumerate(work.prompt_ids.tolist())}
        try:
            rows = np.fromiter((row_of[p] for p in smp.column("prompt_id").to_pylist()), np.int64, smp.num_rows)
        except KeyError as exc:
            raise RunError(f"{where}: its samples name prompt {exc} that this plan does not have") from None
        cols = R.to_columns(smp.drop_columns(["prompt_id"]))
        idx = cols["sample_index"].astype(np.int64)
        if np.any(idx < 0) or np.any(idx >= work.n_samples[rows]):
            raise RunError(f"{where}: its samples have indices beyond this plan's n_samples")
        gid = work.row_first_samples()[rows] + idx
        if np.unique(gid).size != gid.size:
            raise RunError(f"{where}: a sample appears twice in its samples parts")
        self.response_len[gid] = cols["response_len"]
        self.finish_time[gid] = cols["finish_time"]
        self.decode_time[gid] = cols["decode_time"]  # NaN where a log before format 1.2 has none
        self.generated[gid] = 1
        self.consumed_step[gid] = cols["consumed_step"]
        mbc = R.to_columns(log.tables[R.MINIBATCHES])
        st, q = sorted_steps(where, log), R.to_columns(log.tables[R.QUEUE])
        n = int(st["step"].size)
        check_restored(where, work, log, mbc, st, q["time"], cols["consumed_step"])
        m = mbc["minibatch"].astype(np.int64)
        done = np.zeros(work.n_minibatches, dtype=bool)
        done[m] = True
        for name, col in (("worker", self.mb_worker), ("weights_version", self.mb_version), ("reload", self.mb_reload),
                          ("dispatch_time", self.mb_dispatch), ("start", self.mb_start), ("end", self.mb_end),
                          ("tokens", self.mb_tokens), ("max_len", self.mb_max_len),
                          ("context_tokens", self.mb_context)):
            col[m] = mbc[name]
        per_mb = np.bincount(self.sample_mb[gid], minlength=work.n_minibatches)
        if m.size != np.unique(m).size or np.any(per_mb != np.where(done, work.minibatch_sizes, 0)):
            raise RunError(f"{where}: its minibatch rows and sample rows disagree")
        consumed = self.consumed_step[gid]
        used = np.bincount(consumed[consumed >= 0], minlength=n)
        if used.size != n or np.any(used != st["n_samples"]):
            raise RunError(f"{where}: its consumed samples do not match its trainer steps")
        self.step_start = st["start"].tolist()
        self.step_end = st["end"].tolist()
        self.step_n = st["n_samples"].tolist()
        self.step_tokens = st["tokens"].tolist()
        self.step_lag_mean = st["lag_mean"].tolist()
        self.step_lag_max = st["lag_max"].tolist()
        self._step_ids = [None] * n
        self._steps_done = self._new_steps_from = n
        self.queue_rows = list(zip(q["time"].tolist(), q["depth"].tolist(), q["in_flight"].tolist(), strict=True))
        self._new_queue_from = len(self.queue_rows)
        waiting = queued_on_resume(work, gid[consumed < 0], self.generated, self.finish_time)
        times = [0.0, *st["end"].tolist(), *mbc["end"].tolist(), *q["time"].tolist()]
        return ResumeState(
            done=done,
            queued=waiting.astype(np.int64),
            next_step=n,
            clock=float(max(times)),
            response_len=self.response_len.copy(),
            minibatch_version=self.mb_version.copy(),
        )

    def sample_columns(self, ids: np.ndarray, *, with_ids: bool = True, consumed: bool = True) -> dict[str, np.ndarray]:
        """Sample rows for global ids ``ids`` (``-1`` = null in consumed_step / policy_lag).

        ``consumed=False`` writes every ``consumed_step`` as null (rows written
        at generation time; consumption is recorded apart).
        """
        mb = self.sample_mb[ids]
        version = self.mb_version[mb]
        if self.work.carried is not None:
            version = np.where(self.work.carried[ids], 0, version).astype(np.int32)
        step = self.consumed_step[ids] if consumed else np.full(ids.size, -1, dtype=np.int32)
        cols = {
            "sample_index": self.work.sample_index[ids],
            "response_len": self.response_len[ids],
            "prompt_tokens": self.sample_ptok[ids],
            "minibatch": mb,
            "worker": self.mb_worker[mb],
            "weights_version": version,
            "finish_time": self.finish_time[ids],
            "decode_time": self.decode_time[ids],
            "consumed_step": step,
            "policy_lag": np.where(step >= 0, step - version, -1).astype(np.int32),
        }
        if with_ids:
            cols["prompt_id"] = self.work.prompt_ids[self.work.sample_row[ids]]
        return cols

    def minibatch_columns(self, mbs: np.ndarray) -> dict[str, np.ndarray]:
        sizes = self.work.minibatch_sizes[mbs]
        return {
            "minibatch": mbs.astype(np.int32),
            "group": self.work.group[mbs],
            "worker": self.mb_worker[mbs],
            "reload": self.mb_reload[mbs],
            "dispatch_time": self.mb_dispatch[mbs],
            "start": self.mb_start[mbs],
            "end": self.mb_end[mbs],
            "weights_version": self.mb_version[mbs],
            "n_prompts": np.diff(self.work.row_offsets)[mbs].astype(np.int32),
            "n_sequences": sizes.astype(np.int32),
            "tokens": self.mb_tokens[mbs],
            "padded_tokens": sizes * self.mb_max_len[mbs],
            "max_len": self.mb_max_len[mbs],
            "prompt_tokens": self.mb_prompt_tokens[mbs],
            "context_tokens": self.mb_context[mbs],
            "plan_revision": self.mb_revision[mbs],
        }

    def step_columns(self, a: int = 0, b: int | None = None) -> dict[str, np.ndarray]:
        b = self._steps_done if b is None else b
        steps = np.arange(a, b, dtype=np.int32)
        return {
            "step": steps,
            "start": np.asarray(self.step_start[a:b], dtype=np.float64),
            "end": np.asarray(self.step_end[a:b], dtype=np.float64),
            "wait": np.asarray([self.step_wait(k) for k in range(a, b)], dtype=np.float64),
            "n_samples": np.asarray(self.step_n[a:b], dtype=np.int32),
            "tokens": np.asarray(self.step_tokens[a:b], dtype=np.int64),
            "lag_mean": np.asarray(self.step_lag_mean[a:b], dtype=np.float64),
            "lag_max": np.asarray(self.step_lag_max[a:b], dtype=np.int32),
            "version": steps + 1,
        }

    def all_columns(self) -> dict[str, dict[str, np.ndarray]]:
        """Every row of the run (no prompt ids), as the metrics read them."""
        self._apply_minibatch_features()
        done = np.flatnonzero(~np.isnan(self.mb_end))
        return {
            R.SAMPLES: self.sample_columns(np.arange(self.response_len.size), with_ids=False),
            R.MINIBATCHES: self.minibatch_columns(done),
            R.STEPS: self.step_columns(),
            R.QUEUE: R.queue_columns(self.queue_rows),
        }

