"""Numba kernels for minibatch cost models (no validation here; see the wrapper)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from aspc.numba_config import NJIT_FLAGS, parallel_njit

# z-score of the 90th percentile of a standard normal: q90 = exp(mu + Z90*sigma).
Z90 = 1.2815515655446004
# Simpson panels (even) for the expected-maximum integral over [floor, upper],
# at a cost that compiles a million prompts in about a second. 32 keep E[max]
# within 1% of Monte Carlo for narrow bands (tests/test_costs.py). Wide bands
# with no cap (the default predictor's, no --max-response-length) put upper
# ~130 medians out, and a minibatch's E[max] is then -4% to +2% off a fine
# grid: a known error, kept because a log-spaced grid changes every plan's bytes.
N_GRID = 32


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


@parallel_njit
def _expected_max_costs(
    mu: np.ndarray, sigma: np.ndarray, point: np.ndarray, nseq: np.ndarray, starts: np.ndarray, cap: float
) -> np.ndarray:
    m = starts.size - 1
    out = np.empty(m, dtype=np.float64)
    for b in prange(m):
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
                # Five sigmas above the median (tail mass 3e-7 per draw): the
                # max of a few hundred draws essentially never goes further.
                u = math.exp(mu[i] + 5.0 * sigma[i])
                if u > upper:
                    upper = u
                # Below three sigmas under some prompt's median its CDF is
                # < 0.0014, so the product of CDFs is ~0 and the integrand ~1:
                # integrate from there, adding the stretch below exactly.
                f = math.exp(mu[i] - 3.0 * sigma[i])
                if f > floor:
                    floor = f
        # Generation stops at `cap` tokens: E[min(max, cap)] integrates only up to it.
        upper = min(upper, cap)
        floor = min(floor, cap)
        if upper <= floor:
            out[b] = s * floor
            continue
        # E[max] = floor + integral_floor^upper (1 - prod_i F_i(x)^n_i) dx.
        h = (upper - floor) / N_GRID
        acc = 0.0
        for k in range(0, N_GRID + 1):
            x = floor + k * h
            logf = 0.0
            for i in range(lo_i, hi_i):
                if sigma[i] > 0.0:
                    c = _norm_cdf((math.log(x) - mu[i]) / sigma[i])
                    if c <= 0.0:
                        logf = -math.inf
                        break
                    logf += nseq[i] * math.log(c)
                elif x < point[i]:
                    logf = -math.inf
                    break
            cur = 1.0 - math.exp(logf)
            # Composite Simpson weights 1, 4, 2, 4, ..., 2, 4, 1 (N_GRID even).
            w = 1.0 if k == 0 or k == N_GRID else (4.0 if k % 2 == 1 else 2.0)
            acc += w * cur
        out[b] = s * (floor + acc * h / 3.0)
    return out
