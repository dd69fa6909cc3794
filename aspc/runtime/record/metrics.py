"""Run metrics, computed from the run log's columns (or the same columns in memory).

Names match DESIGN.md "Metrics". Times are seconds on the engine's clock.

- ``iteration_time`` of step k = end_k − end_{k−1} (end_{−1} = run start);
  ``trainer_wait`` = start_k − end_{k−1}.
- The *steady* steps are those that end while the dispatcher still had
  minibatches to hand out (no later than the last dispatch). After that the
  run drains: workers fall idle one by one and the last steps wait for the
  slowest minibatches, a single-pass artifact that a longer run would not
  show. ``steady_iteration_time`` and the trend (last quarter / first quarter
  of the steady steps, > 1 = iterations slow down: the sorting bubble) use
  them; mean / p50 / p95 use every step.
- ``makespan`` = when the last minibatch finished; ``lower_bound`` =
  max(Σ minibatch generation time / W, longest minibatch): no dispatch order
  can finish these minibatches on W workers sooner (reloads excluded).
- ``policy_lag`` of a consumed sample = consuming step − weights version that
  generated it.
- Bubbles: ``padding`` and ``skew`` are fractions of decode slot-steps
  (sequence × step) spent idle inside minibatches: ``skew`` is the idle time
  after only a minibatch's longest 10% of sequences are still decoding
  (at least one), ``padding`` the rest. ``backpressure`` and ``drain`` are
  fractions of worker time (W × makespan) idle while minibatches remained
  undispatched (the queue was full) and after the last dispatch;
  ``trainer_starvation`` is the trainer's wait fraction.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aspc.errors import RunError
from aspc.runtime.contracts import STEP_ELAPSED_MAX
from aspc.runtime.record import runlog as R

# An older aspc let a trainer's huge elapsed push the clock to inf: such a log cannot be measured.
NONFINITE_LOG = ("the run log holds a time that is not finite ({bad}): a trainer's elapsed overflowed its clock "
                 f"(a step may now report at most {STEP_ELAPSED_MAX:g} s); run the plan again")  # fmt: skip

# Fraction of a minibatch's sequences that form its "tail" for the skew bubble.
SKEW_TAIL_FRACTION = 0.1


@dataclass
class RunSummary:
    """The numbers ``aspc run`` prints; None where undefined (e.g. no trainer step)."""

    n_workers: int  # W
    n_minibatches: int  # minibatches generated
    samples_planned: int  # Σ n_samples over the plan
    samples_generated: int  # samples returned by workers (== planned on success)
    samples_consumed: int  # samples in trainer steps (== n_trainer_steps × global batch)
    samples_left_over: int  # generated, never consumed (< one global batch); run() leaves held scouts out
    n_trainer_steps: int  # trainer steps run
    mean_iteration_time: float | None  # seconds per trainer step, mean
    p50_iteration_time: float | None  # seconds, median
    p95_iteration_time: float | None  # seconds, 95th percentile
    steady_iteration_time: float | None  # mean over the steady steps (before the drain), seconds
    n_steady_steps: int  # steps that ended no later than the last dispatch
    iteration_time_first_quarter: float | None  # mean over the first quarter of steady steps, seconds
    iteration_time_last_quarter: float | None  # mean over the last quarter of steady steps, seconds
    iteration_time_trend: float | None  # last / first quarter of steady steps; > 1 = iterations slow down
    trainer_wait_fraction: float | None  # Σ trainer wait / end of the last step
    worker_busy_fraction: float  # Σ generation time / (W × makespan)
    worker_reload_fraction: float  # Σ reload time / (W × makespan)
    n_reloads: int  # weight reloads across all workers
    tokens_per_s_per_worker: float  # mean over workers of response tokens / makespan
    worker_tokens_per_s: list[float]  # per worker, response tokens / makespan
    bubbles: dict[str, float]  # padding, skew, backpressure, drain, trainer_starvation (fractions)
    policy_lag_mean: float | None  # mean over consumed samples, trainer steps
    policy_lag_max: int | None  # max over consumed samples
    makespan: float  # seconds until the last minibatch finished
    lower_bound: float  # max(Σ generation time / W, longest minibatch), seconds
    makespan_over_lower_bound: float | None  # makespan / lower_bound (>= 1)
    run_time: float  # seconds until the last minibatch or trainer step finished
    queue_depth_max: int  # most samples ever queued
    queue_capacity: int | None  # the high-water mark used, samples
    extra: dict[str, Any] = field(default_factory=dict)  # run context (length source, ...)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        extra = d.pop("extra")
        return {**_clean(d), **extra}


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return None if not math.isfinite(float(obj)) else float(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def _opt(x: float) -> float | None:
    return float(x) if math.isfinite(float(x)) else None


def slot_bubbles(response_len: np.ndarray, minibatch: np.ndarray) -> tuple[float, float]:
    """(padding, skew) idle decode slot-steps as fractions of all padded slot-steps."""
    lens = np.asarray(response_len, dtype=np.int64)
    mb = np.asarray(minibatch, dtype=np.int64)
    if lens.size == 0:
        return 0.0, 0.0
    sl, smb = _sorted_by_minibatch(lens, mb)
    starts = np.flatnonzero(np.r_[True, smb[1:] != smb[:-1]])
    ends = np.r_[starts[1:], sl.size]
    s = ends - starts
    lmax = sl[ends - 1]
    k = np.maximum(1, np.floor(SKEW_TAIL_FRACTION * s).astype(np.int64))
    cs = np.r_[0, np.cumsum(sl)]
    tail_sum = cs[ends] - cs[ends - k]
    head = s - k
    # Longest non-tail sequence: from it on only the tail is decoding.
    l_tail = np.where(head > 0, sl[np.maximum(ends - k - 1, 0)], 0)
    skew = head * (lmax - l_tail) + (k * lmax - tail_sum)
    padded = s * lmax
    idle = padded - (cs[ends] - cs[starts])
    total = float(padded.sum())
    if total == 0:
        return 0.0, 0.0
    return float((idle - skew).sum()) / total, float(skew.sum()) / total


def _sorted_by_minibatch(lens: np.ndarray, mb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lens, mb) sorted by minibatch, then length: what ``lexsort((lens, mb))`` orders them into.

    One sort of a combined int64 key (mb · (max len + 1) + len) when it fits,
    several times faster than the two-key lexsort on a million samples.
    """
    base = int(lens.max()) + 1
    lo, hi = int(mb.min()), int(mb.max())
    if lens.min() >= 0 and lo >= 0 and hi < (2**62) // base:
        key = np.sort(mb * base + lens)
        return key % base, key // base
    order = np.lexsort((lens, mb))
    return lens[order], mb[order]


def summarize(
    columns: dict[str, dict[str, np.ndarray]],
    *,
    n_workers: int,
    samples_planned: int | None = None,
    queue_capacity: int | None = None,
) -> RunSummary:
    """Compute a :class:`RunSummary` from run-log columns (see :mod:`aspc.runtime.record.runlog`).

    Parameters
    ----------
    columns
        kind -> column name -> NumPy array, as :func:`aspc.runtime.record.runlog.to_columns`
        gives for a log read back (nullable integers as -1).
    n_workers
        W (workers that never ran a minibatch still count as capacity).
    samples_planned
        Σ n_samples of the plan; defaults to the samples generated.
    queue_capacity
        The queue high-water mark, reported as is.
    """
    bad = nonfinite_time(columns)
    if bad is not None:  # numpy's warnings and null metrics said it only in passing, under a 'complete' run
        raise RunError(f"the run's clock is not finite: {bad}; a trainer or backend reported a time too large to "
                       "add up: fix it and rerun")  # fmt: skip
    smp, mbs, stp, que = (columns[k] for k in (R.SAMPLES, R.MINIBATCHES, R.STEPS, R.QUEUE))
    # Minibatch rows in id order: a log read back holds them in completion order,
    # and float sums must not depend on which.
    by_id = np.argsort(np.asarray(mbs["minibatch"]), kind="stable")
    mbs = {k: np.asarray(v)[by_id] for k, v in mbs.items()}
    generated_mask = smp["response_len"] >= 0
    consumed = smp["consumed_step"] >= 0
    n_generated = int(generated_mask.sum())
    w = int(n_workers)

    # Workers.
    dispatch, start, end = mbs["dispatch_time"], mbs["start"], mbs["end"]
    dur = end - start
    makespan = float(end.max()) if end.size else 0.0
    capacity = w * makespan
    lb = float(max(dur.sum() / w, dur.max())) if dur.size else 0.0
    t_last_dispatch = float(dispatch.max()) if dispatch.size else 0.0
    occupied_before = np.clip(np.minimum(end, t_last_dispatch) - dispatch, 0.0, None).sum()
    occupied_after = np.clip(end - np.maximum(dispatch, t_last_dispatch), 0.0, None).sum()
    # Idle areas: a difference of sums can round to -1e-17, never below zero.
    backpressure = max(0.0, w * t_last_dispatch - occupied_before)
    drain = max(0.0, w * (makespan - t_last_dispatch) - occupied_after)

    # Trainer.
    order = np.argsort(stp["step"], kind="stable")
    starts, ends = stp["start"][order], stp["end"][order]
    n_steps = int(ends.size)
    it = np.diff(np.r_[0.0, ends]) if n_steps else np.empty(0)
    waits = starts - np.r_[0.0, ends[:-1]] if n_steps else np.empty(0)
    steady = it[ends <= t_last_dispatch]
    first = last = mean_it = p50 = p95 = wait_frac = trend = steady_mean = math.nan
    if n_steps:
        mean_it, p50, p95 = float(it.mean()), float(np.percentile(it, 50)), float(np.percentile(it, 95))
        wait_frac = float(waits.sum() / ends[-1]) if ends[-1] > 0 else 0.0
    if steady.size:
        q = max(1, steady.size // 4)
        first, last, steady_mean = float(steady[:q].mean()), float(steady[-q:].mean()), float(steady.mean())
        trend = last / first if first > 0 else math.nan

    ids = mbs["worker"].astype(np.int64)
    mine = ids < w  # ids beyond (a log without config.workers reads as one worker) sized the counts, then were cut
    tokens_w = np.bincount(ids[mine], weights=mbs["tokens"][mine], minlength=w)[:w]
    tok_s = tokens_w / makespan if makespan > 0 else np.zeros(w)
    padding, skew = slot_bubbles(smp["response_len"][generated_mask], smp["minibatch"][generated_mask])

    lags = smp["policy_lag"][consumed]
    depth = que["depth"]
    return RunSummary(
        n_workers=w,
        n_minibatches=int(end.size),
        samples_planned=int(samples_planned if samples_planned is not None else n_generated),
        samples_generated=n_generated,
        samples_consumed=int(consumed.sum()),
        samples_left_over=int((generated_mask & ~consumed).sum()),
        n_trainer_steps=n_steps,
        mean_iteration_time=_opt(mean_it),
        p50_iteration_time=_opt(p50),
        p95_iteration_time=_opt(p95),
        steady_iteration_time=_opt(steady_mean),
        n_steady_steps=int(steady.size),
        iteration_time_first_quarter=_opt(first),
        iteration_time_last_quarter=_opt(last),
        iteration_time_trend=_opt(trend),
        trainer_wait_fraction=_opt(wait_frac),
        worker_busy_fraction=float(dur.sum() / capacity) if capacity > 0 else 0.0,
        worker_reload_fraction=float((start - dispatch).sum() / capacity) if capacity > 0 else 0.0,
        n_reloads=int(np.count_nonzero(mbs["reload"])),
        tokens_per_s_per_worker=float(tok_s.mean()),
        worker_tokens_per_s=[float(x) for x in tok_s],
        bubbles={
            "padding": padding,
            "skew": skew,
            "backpressure": float(backpressure / capacity) if capacity > 0 else 0.0,
            "drain": float(drain / capacity) if capacity > 0 else 0.0,
            "trainer_starvation": _opt(wait_frac) if n_steps else 0.0,
        },
        policy_lag_mean=float(lags.mean()) if lags.size else None,
        policy_lag_max=int(lags.max()) if lags.size else None,
        makespan=makespan,
        lower_bound=lb,
        makespan_over_lower_bound=makespan / lb if lb > 0 else None,
        run_time=float(max(makespan, ends.max() if n_steps else 0.0)),
        queue_depth_max=int(depth.max()) if depth.size else 0,
        queue_capacity=queue_capacity,
    )


# Engine-clock columns every row has (a sample's finish_time is NaN until it returns).
_TIMES = {R.MINIBATCHES: ("dispatch_time", "start", "end"), R.STEPS: ("start", "end")}


def nonfinite_time(columns: dict[str, dict[str, np.ndarray]]) -> str | None:
    """The first minibatch or step time that is NaN or infinite, as "step 3 end is inf"; ``None`` if all are finite."""
    for kind, names in _TIMES.items():
        cols = columns.get(kind) or {}
        for name in names:
            t = np.asarray(cols.get(name, ()), dtype=np.float64)
            bad = np.flatnonzero(~np.isfinite(t))
            if bad.size:
                key = "minibatch" if kind == R.MINIBATCHES else "step"
                ids = cols.get(key)
                row = int(ids[bad[0]]) if ids is not None and len(ids) == t.size else int(bad[0])
                return f"{key} {row} {name} is {t[bad[0]]}"
    return None


def summarize_log(log: R.RunLog) -> RunSummary:
    """Recompute the summary of a run log read back from disk.

    Raises
    ------
    RunError
        ``meta.json``'s ``config`` or ``run`` is not what ``aspc run`` writes
        (a damaged or hand-edited log): workers not an integer in range, say.
    """
    cols, workers, run = check_log(log)
    summary = summarize(
        cols,
        n_workers=workers,
        samples_planned=run.get("samples_planned"),
        queue_capacity=run.get("queue_capacity"),
    )
    if isinstance(run.get("held"), dict) and log.meta.get("status") != "complete":
        # A rolling scout's log stopped early: its scout responses not consumed are held (for their
        # groups, or cut), not left over, as a complete run reports them (``hold.left_over_without_held``).
        import pyarrow.compute as pc

        from aspc.emit.schema import SCOUT_ID_SUFFIX

        table, smp = log.tables.get(R.SAMPLES), cols.get(R.SAMPLES) or {}
        if table is not None and "prompt_id" in table.column_names and "response_len" in smp:
            waiting = (smp["response_len"] >= 0) & (smp["consumed_step"] < 0)
            scouts = pc.ends_with(table.column("prompt_id"), SCOUT_ID_SUFFIX).to_numpy(zero_copy_only=False)
            summary.samples_left_over -= int(np.count_nonzero(waiting & np.asarray(scouts, dtype=bool)))
    return summary


def check_log(log: R.RunLog) -> tuple[dict[str, dict[str, np.ndarray]], int, dict[str, Any]]:
    """The columns, worker count and ``meta.json`` ``run`` of ``log``, checked as :func:`summarize_log` needs them.

    Raises
    ------
    RunError
        A time that is not finite, a worker id outside the run's workers, a policy lag that is not its
        consumed_step - weights_version, a sample consumed by a step the log lacks, or a damaged meta.json.
    """
    from aspc.guards import MAX_WORKERS

    cols = {k: R.to_columns(t) for k, t in log.tables.items()}
    bad = nonfinite_time(cols)
    if bad is not None:
        raise RunError(f"{log.path}: {NONFINITE_LOG.format(bad=bad)}")
    # A failed or killed run's meta.json is read as it was left; a damaged field is one line, not a
    # TypeError (null), ValueError ("x"), numpy's minlength error (-3) or a 0-worker division later.
    config, run = _meta_object(log, "config"), _meta_object(log, "run")
    workers = config.get("workers", 1)
    if type(workers) is not int or not 1 <= workers <= MAX_WORKERS:
        raise _damaged(log, f"config.workers must be an integer from 1 to {MAX_WORKERS}, got {_shown(workers)}")
    for key in ("samples_planned", "queue_capacity"):
        value = run.get(key)
        if value is not None and (type(value) is not int or value < 0):
            raise _damaged(log, f"run.{key} must be a non-negative integer, got {_shown(value)}")
    _check_rows(log, cols, workers, bounded="workers" in config)
    return cols, workers, run


def _check_rows(log: R.RunLog, cols: dict[str, dict[str, np.ndarray]], workers: int, *, bounded: bool) -> None:
    """Worker ids and policy lags, which size arrays and figures: a damaged value is refused, not drawn.

    ``bounded``: meta.json names the workers (a log without config.workers reads as one, its ids unchecked above).
    """
    advice = "the run log is damaged: run the plan again with a new --log"
    mbs = cols.get(R.MINIBATCHES) or {}
    w = np.asarray(mbs.get("worker", ()), dtype=np.int64)
    if (bad := np.flatnonzero((w < 0) | ((w >= workers) & bounded))).size:
        mb = np.asarray(mbs.get("minibatch", np.arange(w.size)), dtype=np.int64)[bad[0]]
        raise RunError(f"{log.path}: minibatch {int(mb)} ran on worker {int(w[bad[0]])}, outside the run's workers "
                       f"0..{workers - 1} (config.workers {workers}); {advice}")  # fmt: skip
    smp = cols.get(R.SAMPLES) or {}
    if "policy_lag" not in smp:
        return
    n_steps = int(np.asarray((cols.get(R.STEPS) or {}).get("step", ())).size)
    step, lag = smp["consumed_step"].astype(np.int64), smp["policy_lag"].astype(np.int64)
    want = np.where(step >= 0, step - smp["weights_version"].astype(np.int64), -1)
    # Consumed by a step the log holds, generated by weights no newer than that step's: 0 <= lag <= step.
    if (bad := np.flatnonzero((step < -1) | (step >= n_steps) | (lag != want) | ((step >= 0) & (lag < 0)))).size:
        i = int(bad[0])
        raise RunError(f"{log.path}: sample row {i} has consumed_step {int(step[i])}, weights_version "
                       f"{int(smp['weights_version'][i])} and policy_lag {int(lag[i])}: its lag is not consumed_step - "
                       f"weights_version >= 0 for a step among the log's {n_steps}; {advice}")  # fmt: skip


def _meta_object(log: R.RunLog, key: str) -> dict[str, Any]:
    """``meta.json``'s ``key`` section; absent or null reads as empty, as resuming reads it."""
    value = log.meta.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _damaged(log, f"{key} must be an object, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    """``value`` as meta.json spells it (null, not None), cut short."""
    return json.dumps(value)[:40]


def _damaged(log: R.RunLog, what: str) -> RunError:
    # Worded as a damaged part range is (aspc.io.runlog_meta.part_ranges).
    return RunError(f"{log.path}: meta.json {what}; the run log is damaged")
