"""Numba kernel of the sim backend: minibatch durations and per-sample finish times.

No validation here; :func:`aspc.runtime.backends.sim.minibatch_times` is the checked wrapper.

For a minibatch sorted by length ``l_1 <= ... <= l_s``, between two distinct
lengths the active set is fixed, so the decode steps of that stretch sum in
closed form: ``Σ_t (a + b·active + c·(P_active + active·(t-1)))``. The cost is
O(s log s) per minibatch whatever the lengths, so a million-prompt plan costs
a fraction of a second; the event loop never iterates over tokens.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from aspc.numba_config import NJIT_FLAGS


@njit(**NJIT_FLAGS)
def _minibatch_times(
    offsets: np.ndarray,
    lens: np.ndarray,
    ptok: np.ndarray,
    prefill_tokens: np.ndarray,
    coef: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Durations (per minibatch) and finish offsets (per sample), seconds.

    ``offsets`` int64 (M+1) sample ranges; ``lens``/``ptok`` int64 per sample;
    ``prefill_tokens`` float64 per minibatch; ``coef`` = (a, b, c, p0, p1).
    """
    a, b, c, p0, p1 = coef[0], coef[1], coef[2], coef[3], coef[4]
    m = offsets.size - 1
    duration = np.empty(m, dtype=np.float64)
    finish = np.empty(lens.size, dtype=np.float64)
    for k in range(m):
        s0 = offsets[k]
        n = offsets[k + 1] - s0
        pre = p0 + p1 * prefill_tokens[k]
        seg = lens[s0 : s0 + n]
        order = np.argsort(seg, kind="mergesort")
        p_active = 0.0
        for j in range(n):
            p_active += ptok[s0 + j]
        cum = 0.0
        prev = 0
        for j in range(n):
            idx = s0 + order[j]
            length = seg[order[j]]
            if length > prev:
                active = n - j
                steps = length - prev
                # Σ_{t=prev+1..length} (t - 1): tokens already generated per active sequence.
                tri = (length * (length - 1) - prev * (prev - 1)) / 2.0
                cum += steps * (a + b * active + c * p_active) + c * active * tri
                prev = length
            finish[idx] = pre + cum
            p_active -= ptok[idx]
        duration[k] = pre + cum
    return duration, finish
