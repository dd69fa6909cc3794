"""A :class:`~aspc.runtime.core.timeline.Timeline` written into a :class:`~aspc.runtime.record.recorder.Recorder`.

What the recorder's per-event methods (``on_dispatch``, ``on_train_start``,
``on_samples``, ``on_minibatch_done``, ``on_train_done``, ``on_queue``) would
have stored over a whole fresh run, stored in bulk: same arrays, same lists,
same flush order (minibatches as they finished, steps in order).
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np

from aspc.runtime.core.timeline import Timeline


def record_timeline(rec: Any, tl: Timeline) -> None:
    """Store ``tl`` in ``rec``, a fresh :class:`~aspc.runtime.record.recorder.Recorder` (nothing recorded yet)."""
    returned = tl.returned > 0
    for name in ("mb_worker", "mb_version", "mb_reload", "mb_dispatch", "mb_start", "mb_end", "finish_time"):
        getattr(rec, name)[:] = getattr(tl, name)
    rec.response_len[returned] = tl.response_len[returned]
    rec.generated += tl.returned
    rec.consumed_step[:] = tl.consumed_step
    decode = getattr(rec, "decode_time", None)  # per sample, the vllm3 branch's column (minibatch start to last token)
    if decode is not None:
        decode[:] = tl.finish_offset
    done = tl.mb_done_order.tolist()
    rec._new_mbs.extend(done)
    rec._unfeatured.extend(done)
    s = tl.n_steps
    b = tl.step_samples.size // s if s else 0
    rec.step_start.extend(tl.step_start.tolist())
    rec.step_end.extend(tl.step_end.tolist())
    rec.step_n.extend([b] * s)
    rec.step_tokens.extend(tl.step_tokens.tolist())
    # Σ lags / B is exactly np.mean's value: every partial sum is an integer below 2^53.
    rec.step_lag_mean.extend((tl.step_lag_sum.astype(np.float64) / max(b, 1)).tolist())
    rec.step_lag_max.extend(tl.step_lag_max.tolist())
    rec._step_ids.extend(tl.step_samples[k * b : (k + 1) * b] for k in range(s))
    rec._steps_done += s
    # A run's queue rows are ~10^5 tuples: built with the cyclic GC paused, or its collections
    # (each walking every object the process holds) cost ten times the building.
    enabled = gc.isenabled()
    gc.disable()
    try:
        rows = list(zip(tl.queue_time.tolist(), tl.queue_depth.tolist(), tl.queue_in_flight.tolist(), strict=True))
    finally:
        if enabled:
            gc.enable()
    # The kernel keeps a row only when (depth, in flight) changed, as on_queue does.
    if rows and rec.queue_rows and rec.queue_rows[-1][1:] == rows[0][1:]:
        rows = rows[1:]
    rec.queue_rows.extend(rows)
