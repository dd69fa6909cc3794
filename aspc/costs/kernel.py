"""Numba kernels for minibatch cost models (no validation here; see the wrapper)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from aspc.numba_config import NJIT_FLAGS

# z-score of the 90th percentile of a standard normal: q90 = exp(mu + Z90*sigma).
Z90 = 1.2815515655446004
# Grid points for the expected-maximum integral; 256 keeps the relative error
# of E[max] well under 1e-3 for the spreads seen in real length data.
N_GRID = 256


@njit(**NJIT_FLAGS)
def _padded_costs(pred: np.ndarray, nseq: np.ndarray, starts: np.ndarray) -> np.ndarray:
    m = starts.size - 1
    out = np.empty(m, dtype=np.float64)
    for b in range(m):
        mx = 0.0
        s = 0.0
        for i in range(starts[b], starts[b + 1]):
            if pred[i] > mx:
                mx = pred[i]
            s += nseq[i]
        out[b] = s * mx
    return out


@njit(**NJIT_FLAGS)
def _norm_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


@njit(**NJIT_FLAGS)
def _expected_max_costs(
    mu: np.ndarray, sigma: np.ndarray, point: np.ndarray, nseq: np.ndarray, starts: np.ndarray
) -> np.ndarray:
    m = starts.size - 1
    out = np.empty(m, dtype=np.float64)
    for b in range(m):
        lo_i, hi_i = starts[b], starts[b + 1]
        s = 0.0
        upper = 0.0
        floor = 0.0
        for i in range(lo_i, hi_i):
            s += nseq[i]
            if sigma[i] == 0.0:
                if point[i] > floor:
                    floor = point[i]
                if point[i] > upper:
                    upper = point[i]
            else:
                # Six sigmas above the median: the max of a few thousand draws
                # essentially never goes further.
                u = math.exp(mu[i] + 6.0 * sigma[i])
                if u > upper:
                    upper = u
        if upper <= floor:
            out[b] = s * floor
            continue
        # E[max] = floor + integral_floor^upper (1 - prod_i F_i(x)^n_i) dx, since
        # point masses make the CDF zero below ``floor``.
        h = (upper - floor) / N_GRID
        acc = 0.0
        prev = 1.0
        for k in range(1, N_GRID + 1):
            x = floor + k * h
            logf = 0.0
            for i in range(lo_i, hi_i):
                if sigma[i] > 0.0:
                    c = _norm_cdf((math.log(x) - mu[i]) / sigma[i])
                    if c <= 0.0:
                        logf = -math.inf
                        break
                    logf += nseq[i] * math.log(c)
            cur = 1.0 - math.exp(logf)
            acc += 0.5 * (prev + cur) * h
            prev = cur
        out[b] = s * (floor + acc)
    return out
