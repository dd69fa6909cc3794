"""What happened in a run, as NumPy arrays; flushed to the run log in parts.

The recorder is fed by :func:`aspc.runtime.loop.drive` with the scheduler's
decisions and the engine's events. It keeps per-sample and per-minibatch
arrays indexed by id (so a million-sample run costs a few vectorised writes,
not a million Python rows) and remembers which rows are new since the last
flush, so the run log grows append-only.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from aspc.errors import RunError
from aspc.runtime import runlog as R
from aspc.runtime.backend import TrainBatch
from aspc.runtime.engine import MinibatchFinished, SamplesReturned, TrainFinished
from aspc.runtime.scheduler import Dispatch, TrainStep
from aspc.runtime.work import WorkPlan


class Recorder:
    """Collects a run's timeline and writes it to an optional :class:`~aspc.runtime.runlog.RunLogWriter`.

    Parameters
    ----------
    work
        The expanded plan.
    writer
        Where parts go; ``None`` keeps everything in memory only.
    flush_seconds
        Wall seconds between flushes of new rows (a last flush happens at the end).
    """

    def __init__(self, work: WorkPlan, writer: R.RunLogWriter | None = None, flush_seconds: float = 10.0):
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
        self.mb_prompt_tokens = np.add.reduceat(work.prompt_tokens, work.row_offsets[:-1]).astype(np.int64)
        self.sample_mb = np.repeat(np.arange(m, dtype=np.int32), work.minibatch_sizes)
        self.sample_ptok = work.sample_prompt_tokens()
        # Per sample, indexed by global id.
        self.response_len = np.full(n, -1, dtype=np.int64)
        self.finish_time = np.full(n, np.nan)
        self.consumed_step = np.full(n, -1, dtype=np.int32)
        self.generated = np.zeros(n, dtype=np.int32)  # times each sample was returned (must end at 1)
        self._payload: dict[int, Any] = {}  # sample id -> backend output, until consumed
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
        self._new_samples: list[np.ndarray] = []
        self._new_steps_from = 0  # first finished step not yet flushed
        self._steps_done = 0
        self._new_queue_from = 0
        self._last_flush = time.monotonic()

    # ---- decisions -------------------------------------------------------------

    def on_dispatch(self, action: Dispatch, now: float) -> None:
        m = action.minibatch
        self.mb_worker[m] = action.worker
        self.mb_version[m] = action.weights_version
        self.mb_reload[m] = action.reload_version is not None
        self.mb_dispatch[m] = now

    def on_train_start(self, action: TrainStep, now: float) -> TrainBatch:
        """Record the step's start and build the batch the trainer receives."""
        self._apply_arrivals()
        ids = action.samples
        versions = self.mb_version[self.sample_mb[ids]].astype(np.int64)
        lags = action.step - versions
        self.consumed_step[ids] = action.step
        lens = self.response_len[ids]
        ptok = self.sample_ptok[ids]
        self.step_start.append(now)
        self.step_n.append(int(ids.size))
        self.step_tokens.append(int(lens.sum() + ptok.sum()))
        self.step_lag_mean.append(float(lags.mean()))
        self.step_lag_max.append(int(lags.max()))
        self._new_samples.append(ids)
        payload = None
        if self._payload:
            payload = [self._payload.pop(int(i), None) for i in ids]
        return TrainBatch(action.step, ids, lens, ptok, versions, payload)

    # ---- events ----------------------------------------------------------------

    def on_samples(self, ev: SamplesReturned) -> None:
        # Buffered and applied in bulk (continuous mode returns up to one event
        # per sample; a numpy scatter per event would dominate the run).
        self._arrivals.append(ev)
        if ev.payload is not None:
            self._payload.update(zip(ev.samples.tolist(), ev.payload, strict=True))

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
        self._new_mbs.append(m)
        self._unfeatured.append(m)

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

    def on_train_done(self, ev: TrainFinished) -> None:
        self.step_end.append(ev.end)
        self._steps_done += 1

    def on_queue(self, now: float, depth: int, in_flight: int) -> None:
        row = (now, depth, in_flight)
        if not self.queue_rows or self.queue_rows[-1][1:] != row[1:]:
            self.queue_rows.append(row)

    def step_wait(self, k: int) -> float:
        prev = self.step_end[k - 1] if k > 0 else 0.0
        return self.step_start[k] - prev

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
        self._new_samples.append(leftover)
        self.flush()

    # ---- output ----------------------------------------------------------------

    def maybe_flush(self) -> None:
        if self.writer is not None and time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        """Write every row new since the last flush as one part per kind."""
        self._last_flush = time.monotonic()
        self._apply_minibatch_features()
        if self.writer is None:
            return
        if self._new_samples:
            ids = np.concatenate(self._new_samples).astype(np.int64)
            self._new_samples = []
            self.writer.write_part(R.SAMPLES, self.sample_columns(ids))
        if self._new_mbs:
            mbs = np.asarray(self._new_mbs, dtype=np.int64)
            self._new_mbs = []
            self.writer.write_part(R.MINIBATCHES, self.minibatch_columns(mbs))
        if self._steps_done > self._new_steps_from:
            self.writer.write_part(R.STEPS, self.step_columns(self._new_steps_from, self._steps_done))
            self._new_steps_from = self._steps_done
        if len(self.queue_rows) > self._new_queue_from:
            rows = self.queue_rows[self._new_queue_from :]
            self._new_queue_from = len(self.queue_rows)
            self.writer.write_part(R.QUEUE, _queue_columns(rows))

    def sample_columns(self, ids: np.ndarray, *, with_ids: bool = True) -> dict[str, np.ndarray]:
        """Sample rows for global ids ``ids`` (``-1`` = null in consumed_step / policy_lag)."""
        mb = self.sample_mb[ids]
        version = self.mb_version[mb]
        step = self.consumed_step[ids]
        cols = {
            "sample_index": self.work.sample_index[ids],
            "response_len": self.response_len[ids],
            "prompt_tokens": self.sample_ptok[ids],
            "minibatch": mb,
            "worker": self.mb_worker[mb],
            "weights_version": version,
            "finish_time": self.finish_time[ids],
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
            R.QUEUE: _queue_columns(self.queue_rows),
        }


def _queue_columns(rows: list[tuple[float, int, int]]) -> dict[str, np.ndarray]:
    arr = np.asarray(rows, dtype=np.float64).reshape(-1, 3)
    return {"time": arr[:, 0], "depth": arr[:, 1].astype(np.int64), "in_flight": arr[:, 2].astype(np.int64)}
