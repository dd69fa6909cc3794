"""Private Numba kernels of :mod:`aspc.anneal.lpt`: upper quantiles of a minibatch's longest response, and the order.

Every function here takes validated contiguous arrays and never checks or
prints; :mod:`aspc.anneal.lpt` is the checked wrapper.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from aspc.numba_config import NJIT_FLAGS, NJIT_PARALLEL_FLAGS

# Bisection steps on log(length): 60 halvings of a bracket at most ~40 wide in
# log space leave an error far below one token.
_BISECT_STEPS = 60


@njit(**NJIT_FLAGS)
def _log_cdf_max(x, mu, sigma, point, nseq, lo, hi):
    """log P(max of the minibatch's sampled lengths <= exp(x)), rows lo..hi-1."""
    acc = 0.0
    for i in range(lo, hi):
        if sigma[i] > 0.0:
            z = (x - mu[i]) / sigma[i]
            c = 0.5 * math.erfc(-z / math.sqrt(2.0))
            if c <= 0.0:
                return -math.inf
            acc += nseq[i] * math.log(c)
        elif math.exp(x) < point[i]:
            return -math.inf
    return acc


@njit(**NJIT_FLAGS)
def _cdf_max_below(x, logq, mu, sigma, point, nseq, lo, hi):
    """``_log_cdf_max(x, ...) < logq``, decided with as few terms as that exact sum allows.

    Every term ``nseq * log(c)`` is <= 0 (``c <= 1``, ``nseq >= 0``) and
    rounding is monotone, so the running sum never rises: once it is below
    ``logq`` the full sum is too. A point mass above ``exp(x)`` makes the sum
    ``-inf`` wherever it sits, so those (compare-only) rows go first. The
    terms that are added are added in the same order, so when the sum is
    needed in full it is the same float.
    """
    ex = math.exp(x)
    for i in range(lo, hi):
        if sigma[i] <= 0.0 and ex < point[i]:
            return True
    acc = 0.0
    for i in range(lo, hi):
        if sigma[i] > 0.0:
            z = (x - mu[i]) / sigma[i]
            c = 0.5 * math.erfc(-z / math.sqrt(2.0))
            if c <= 0.0:
                return True
            acc += nseq[i] * math.log(c)
            if acc < logq:
                return True
    return acc < logq


@njit(**NJIT_PARALLEL_FLAGS)
def _max_quantiles(mu, sigma, point, nseq, starts, q):
    """Per minibatch, the ``q``-quantile of its longest sampled response (tokens).

    Minibatches are independent (one bisection each), so they run in parallel.
    """
    m = starts.size - 1
    out = np.empty(m, dtype=np.float64)
    logq = math.log(q)
    for b in prange(m):
        lo_i, hi_i = starts[b], starts[b + 1]
        lo = math.inf
        hi = -math.inf
        for i in range(lo_i, hi_i):
            if sigma[i] > 0.0:
                a, c = mu[i] - 8.0 * sigma[i], mu[i] + 8.0 * sigma[i]
            else:
                a = c = math.log(max(point[i], 1e-9))
            lo = min(lo, a)
            hi = max(hi, c)
        # The maximum is at least the largest point mass: start the bracket there.
        for i in range(lo_i, hi_i):
            if sigma[i] == 0.0:
                lo = max(lo, math.log(max(point[i], 1e-9)))
        if hi <= lo:
            out[b] = math.exp(lo)
            continue
        # Once the bracket is two adjacent floats, the midpoint is one of its
        # ends; if that end was itself a midpoint, its answer is known and
        # every remaining step repeats it, leaving (lo, hi) unchanged: stop.
        # (The initial ends were never evaluated, so they do not count.)
        lo_seen = False
        hi_seen = False
        for _ in range(_BISECT_STEPS):
            mid = 0.5 * (lo + hi)
            if (mid == lo and lo_seen) or (mid == hi and hi_seen):
                break
            if _cdf_max_below(mid, logq, mu, sigma, point, nseq, lo_i, hi_i):
                lo = mid
                lo_seen = True
            else:
                hi = mid
                hi_seen = True
        out[b] = math.exp(hi)
    return out


@njit(**NJIT_FLAGS)
def _lpt_group_order(key, tie, assignment, n_groups):
    """Groups by descending peak key, each group's minibatches by descending key; ties by ``tie``.

    ``tie`` is a permutation rank per minibatch (lower goes first among equal
    keys); a group's tie rank is its members' smallest.
    """
    m = key.shape[0]
    peak = np.full(n_groups, -np.inf)
    gtie = np.full(n_groups, m, dtype=np.int64)
    for k in range(m):
        g = assignment[k]
        if key[k] > peak[g]:
            peak[g] = key[k]
        if tie[k] < gtie[g]:
            gtie[g] = tie[k]
    # Stable sorts: first by tie rank, then by descending key, so equal keys keep tie order.
    g_by_tie = np.argsort(gtie, kind="mergesort")
    g_sorted = g_by_tie[np.argsort(-peak[g_by_tie], kind="mergesort")]
    k_by_tie = np.argsort(tie, kind="mergesort")
    k_sorted = k_by_tie[np.argsort(-key[k_by_tie], kind="mergesort")]
    # Bucket the key-sorted minibatches by group, then emit groups in their order.
    counts = np.zeros(n_groups + 1, dtype=np.int64)
    for k in range(m):
        counts[assignment[k] + 1] += 1
    for g in range(n_groups):
        counts[g + 1] += counts[g]
    fill = counts[:-1].copy()
    bucket = np.empty(m, dtype=np.int64)
    for k in k_sorted:
        g = assignment[k]
        bucket[fill[g]] = k
        fill[g] += 1
    order = np.empty(m, dtype=np.int64)
    pos = 0
    for g in g_sorted:
        for j in range(counts[g], counts[g + 1]):
            order[pos] = bucket[j]
            pos += 1
    return order
