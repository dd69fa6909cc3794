"""A virtual-clock run played in one compiled call, when every duration is known up front.

The event loop (:func:`aspc.runtime.core.loop.drive`) costs tens of
microseconds of Python per minibatch, trainer step and queue change: seconds
for a million-prompt plan, most of ``aspc run`` and ``aspc simulate``. With the
``sim`` backend and trainer nothing in the run depends on anything but the
lengths and the cost model, so the scheduler's decisions and the event heap
can be replayed in one Numba pass (:mod:`aspc.runtime.engines.virtual_kernel`)
that returns a :class:`~aspc.runtime.core.timeline.Timeline`: the same
records, bit for bit (``tests/test_runtime_virtual_batch.py`` runs both on
random plans and compares every column).
"""

from __future__ import annotations

import numpy as np

from aspc.runtime.config import ReturnMode
from aspc.runtime.core.timeline import Timeline
from aspc.runtime.engines.virtual_kernel import STALLED, VirtualRun, _run_virtual

__all__ = ["run_virtual"]


def run_virtual(
    sample_offsets: np.ndarray,
    duration: np.ndarray,
    finish_offset: np.ndarray,
    response_len: np.ndarray,
    sample_prompt_tokens: np.ndarray,
    *,
    n_workers: int,
    global_batch: int,
    queue_capacity: int,
    max_staleness: int | None,
    reload_time: float,
    train_base: float,
    train_per_token: float,
    return_mode: ReturnMode,
    clock: float = 0.0,
) -> Timeline | None:
    """The whole run of a plan whose generation and trainer times are known.

    Parameters
    ----------
    sample_offsets
        int64 (M+1,): minibatch ``m`` owns samples ``sample_offsets[m]:[m+1]``,
        dispatched in plan order (a fresh run: nothing generated yet).
    duration, finish_offset
        float64 seconds per minibatch (generation start to its last token)
        and per sample (start to the sample's last token), as
        :func:`aspc.runtime.backends.sim.minibatch_times` gives them.
    response_len, sample_prompt_tokens
        int64 tokens per sample.
    n_workers, global_batch, queue_capacity, max_staleness
        The :class:`~aspc.runtime.core.scheduler.Scheduler`'s parameters.
    reload_time
        Seconds per weight reload.
    train_base, train_per_token
        A trainer step takes ``train_base + train_per_token·tokens`` seconds.
    return_mode
        ``static`` (samples return with their minibatch) or ``continuous``.
    clock
        The engine's clock at the start.

    Returns
    -------
    Timeline or None
        ``None`` when the run would stall (nothing running, work left): the
        event loop then runs it and reports the stall as it always has.

    Raises
    ------
    ValueError
        Arrays of the wrong shape or sign, or parameters out of range.
    """
    offsets = np.ascontiguousarray(sample_offsets, dtype=np.int64)
    n = int(offsets[-1]) if offsets.size else 0
    arrays = {
        "duration": np.ascontiguousarray(duration, dtype=np.float64),
        "finish_offset": np.ascontiguousarray(finish_offset, dtype=np.float64),
        "response_len": np.ascontiguousarray(response_len, dtype=np.int64),
        "sample_prompt_tokens": np.ascontiguousarray(sample_prompt_tokens, dtype=np.int64),
    }
    m = offsets.size - 1
    if m < 1 or offsets[0] != 0 or np.any(np.diff(offsets) < 1):
        raise ValueError("sample_offsets must start at 0 and rise by >= 1 per minibatch (M >= 1)")
    for name, a in arrays.items():
        want = m if name == "duration" else n
        if a.shape != (want,):
            raise ValueError(f"{name} has shape {a.shape}, expected ({want},)")
        if a.size and not (np.all(np.isfinite(a)) and a.min() >= 0):
            raise ValueError(f"{name} must be finite and >= 0")
    if n_workers < 1 or global_batch < 1 or queue_capacity < global_batch:
        raise ValueError("need n_workers >= 1, global_batch >= 1 and queue_capacity >= global_batch")
    if max_staleness is not None and max_staleness < 1:
        raise ValueError("max_staleness must be >= 1 or None")
    for name, v in (("reload_time", reload_time), ("train_base", train_base), ("train_per_token", train_per_token)):
        if not (np.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
    run = VirtualRun(
        sizes=np.diff(offsets),
        offsets=offsets,
        duration=arrays["duration"],
        finish=arrays["finish_offset"],
        lens=arrays["response_len"],
        ptok=arrays["sample_prompt_tokens"],
        n_workers=int(n_workers),
        global_batch=int(global_batch),
        capacity=int(queue_capacity),
        max_staleness=-1 if max_staleness is None else int(max_staleness),
        reload_time=float(reload_time),
        train_base=float(train_base),
        train_per_token=float(train_per_token),
        continuous=ReturnMode(return_mode) is ReturnMode.CONTINUOUS,
        clock=float(clock),
    )
    (status, mb_worker, mb_version, mb_reload, mb_dispatch, mb_start, mb_end, done_order, finish_time, returned,
     consumed, step_samples, step_start, step_end, step_tokens, step_lag_sum, step_lag_max, q_time, q_depth, q_fly,
     leftover, end_clock) = _run_virtual(run)
    if status == STALLED:
        return None
    # What a finished run must satisfy whatever the schedule: every minibatch ran once,
    # every sample reached the queue once and was consumed or left over.
    s = step_start.size
    assert done_order.size == m and np.all(returned == 1), "virtual run: a minibatch or sample went missing"
    assert step_samples.size == s * global_batch and leftover.size < global_batch
    assert step_samples.size + leftover.size == n
    return Timeline(
        mb_worker=mb_worker,
        mb_version=mb_version,
        mb_reload=mb_reload,
        mb_dispatch=mb_dispatch,
        mb_start=mb_start,
        mb_end=mb_end,
        mb_done_order=done_order,
        response_len=arrays["response_len"],
        finish_offset=arrays["finish_offset"],
        finish_time=finish_time,
        returned=returned,
        consumed_step=consumed,
        step_samples=step_samples,
        step_start=step_start,
        step_end=step_end,
        step_tokens=step_tokens,
        step_lag_sum=step_lag_sum,
        step_lag_max=step_lag_max,
        queue_time=q_time,
        queue_depth=q_depth,
        queue_in_flight=q_fly,
        leftover=leftover,
        clock=float(end_clock),
    )
