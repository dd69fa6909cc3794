"""Numba kernels over ragged float64 segments (no validation here; see aspc.io.ragged).

Each segment's mean and linear quantiles are computed exactly as NumPy's
``x.mean()`` and ``np.quantile(x, q)`` compute them for that segment alone
(same summation order, same interpolation formula), so plans compiled from
known lengths stay byte-identical to the per-row NumPy code they replace.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from aspc.numba_config import NJIT_FLAGS, parallel_njit
from aspc.portable_math_kernel import pairwise_sum  # NumPy's pairwise order, step for step


@njit(**NJIT_FLAGS)
def _lerp(a: float, b: float, t: float) -> float:
    # numpy.lib._function_base_impl._lerp: the upper half interpolates from b.
    d = b - a
    if t >= 0.5:
        return b - d * (1.0 - t)
    return a + d * t


# Segments of up to this many values (sampled lengths: a few per prompt) are
# sorted by insertion in one scratch buffer per chunk of segments, instead of
# an array allocated per segment; longer ones by np.sort. 15 is Numba's own
# insertion-sort cutoff (numba.misc.quicksort.SMALL_QUICKSORT). A length has
# no sign: -0.0 is read as 0.0 (x + 0.0), since where equal values 0.0 and -0.0
# land depends on the sort or selection algorithm (np.quantile partitions).
_INSERTION_MAX = 15
# Chunks of segments per kernel call: each runs on one thread with its own buffer.
_CHUNKS = 64


@njit(**NJIT_FLAGS)
def _sorted_into(values: np.ndarray, lo: int, m: int, buf: np.ndarray) -> np.ndarray:
    if m > _INSERTION_MAX:
        return np.sort(values[lo : lo + m] + 0.0)
    for i in range(m):
        v = values[lo + i] + 0.0
        j = i
        while j > 0 and buf[j - 1] > v:
            buf[j] = buf[j - 1]
            j -= 1
        buf[j] = v
    return buf


@parallel_njit
def _segment_stats(values: np.ndarray, offsets: np.ndarray, qs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = offsets.size - 1
    k = qs.size
    mean = np.empty(n, dtype=np.float64)
    quant = np.empty((n, k), dtype=np.float64)
    per = (n + _CHUNKS - 1) // _CHUNKS
    for c in prange(_CHUNKS):
        buf = np.empty(_INSERTION_MAX, dtype=np.float64)
        for s in range(c * per, min(n, (c + 1) * per)):
            lo = offsets[s]
            m = offsets[s + 1] - lo
            # NumPy's add.reduce starts from the identity 0.0.
            mean[s] = (0.0 + pairwise_sum(values, lo, m)) / m
            if m == 1:
                for j in range(k):
                    quant[s, j] = values[lo] + 0.0
                continue
            x = _sorted_into(values, lo, m, buf)
            for j in range(k):
                v = (m - 1) * qs[j]
                if v >= m - 1:
                    quant[s, j] = x[m - 1]
                    continue
                p = np.floor(v)
                i = int(p)
                quant[s, j] = _lerp(x[i], x[i + 1], v - p)
    return mean, quant
