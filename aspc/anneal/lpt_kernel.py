"""Private Numba kernels of :mod:`aspc.anneal.lpt`: upper quantiles of a minibatch's longest response, and the order.

Every function here takes validated contiguous arrays and never checks or
prints; :mod:`aspc.anneal.lpt` is the checked wrapper.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from aspc.numba_config import NJIT_FLAGS, parallel_njit

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


@njit(**NJIT_FLAGS)
def _initial_bracket(mu, sigma, point, lo_i, hi_i):
    """Bisection bracket (log tokens) of one minibatch's quantile: below every row's 8-sigma band, above all."""
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
    return lo, hi


@njit(**NJIT_FLAGS)
def _bisect(logq, mu, sigma, point, nseq, lo_i, hi_i, lo, hi, lo_seen, hi_seen, steps):
    """``steps`` more bisection steps from the state ``(lo, hi, lo_seen, hi_seen)``; the state after, and whether it stopped.

    Once the bracket is two adjacent floats, the midpoint is one of its
    ends; if that end was itself a midpoint, its answer is known and every
    remaining step repeats it, leaving (lo, hi) unchanged: stop. (The
    initial ends were never evaluated, so they do not count.) Running ``k``
    steps and then the rest from the returned state is the same computation
    as running them all at once.
    """
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if (mid == lo and lo_seen) or (mid == hi and hi_seen):
            return lo, hi, lo_seen, hi_seen, True
        if _cdf_max_below(mid, logq, mu, sigma, point, nseq, lo_i, hi_i):
            lo = mid
            lo_seen = True
        else:
            hi = mid
            hi_seen = True
    return lo, hi, lo_seen, hi_seen, False


@parallel_njit
def _max_quantiles(mu, sigma, point, nseq, starts, q):
    """Per minibatch, the ``q``-quantile of its longest sampled response (tokens).

    Minibatches are independent (one bisection each), so they run in parallel.
    """
    m = starts.size - 1
    out = np.empty(m, dtype=np.float64)
    logq = math.log(q)
    for b in prange(m):
        lo_i, hi_i = starts[b], starts[b + 1]
        lo, hi = _initial_bracket(mu, sigma, point, lo_i, hi_i)
        if hi <= lo:
            out[b] = math.exp(lo)
            continue
        lo, hi, _, _, _ = _bisect(logq, mu, sigma, point, nseq, lo_i, hi_i, lo, hi, False, False, _BISECT_STEPS)
        out[b] = math.exp(hi)
    return out


# Bisection steps a minibatch takes before the order is checked where Newton's method does not
# vouch for its answer: a bracket ~40 wide in log space is then ~4e-8 wide, so few brackets meet.
_COARSE_STEPS = 30
# Newton steps at most, and the half-width (relative, log tokens) of the interval around Newton's
# root that two exact comparisons must confirm before the root stands for the bisection's answer.
_NEWTON_STEPS = 40
_NEWTON_HALF = 1e-9
# ... widened where the log CDF is flat, so that it moves over the half-width by at least this
# much per sampled response: 1e4 times the ~1.1e-16 a response's term can be off by in rounding
# (its CDF, near 1, is stored to an absolute 1.1e-16).
_NEWTON_MARGIN = 1e-12


@njit(**NJIT_FLAGS)
def _newton_root(logq, mu, sigma, nseq, lo_i, hi_i):
    """The root of ``log P(max <= exp(x)) = logq`` by Newton's method from its left (NaN if none), and the slope there.

    Each row's ``log Phi((x - mu) / sigma)`` is concave in x, so their sum is:
    from a point left of the root every Newton step lands left of it again and
    moves right (the tangent lies above the curve), converging quadratically.
    The start, the largest row median, puts every row's CDF at >= 1/2; NaN when
    it is already right of the root (a low ``q``), when every row is a point
    mass or when the steps do not settle: the bisection answers those
    minibatches. Point masses are left out: they only make the comparison
    true below the largest of them, which the caller's check covers.
    """
    x = -math.inf
    for i in range(lo_i, hi_i):
        if sigma[i] > 0.0:
            x = max(x, mu[i])
    if x == -math.inf:
        return math.nan, 0.0
    for k in range(_NEWTON_STEPS):
        g = -logq
        dg = 0.0
        for i in range(lo_i, hi_i):
            if sigma[i] <= 0.0:
                continue
            z = (x - mu[i]) / sigma[i]
            c = 0.5 * math.erfc(-z / math.sqrt(2.0))
            g += nseq[i] * math.log(c)
            dg += nseq[i] * math.exp(-0.5 * z * z) / (math.sqrt(2.0 * math.pi) * sigma[i] * c)
        if g >= 0.0 or not dg > 0.0:
            return (math.nan if k == 0 else x), dg
        step = -g / dg
        x += step
        if step <= 1e-13 * (1.0 + abs(x)):
            return x, dg
    return math.nan, 0.0


@parallel_njit
def _coarse_quantiles(mu, sigma, point, nseq, starts, q, lo, hi, seen, exact, blo, bhi, left):
    """Per minibatch, an interval holding :func:`_max_quantiles`' answer, and a bisection state to finish it from.

    Newton's root r (:func:`_newton_root`) stands where the comparison the
    bisection makes is confirmed on both sides of it, at r - h and r + h:
    below the quantile at r - h, not below at r + h. The sum the comparison
    adds up is off by rounding only, at most ~1.1e-16 per sampled response,
    while over h it moves by the slope times h; h is :data:`_NEWTON_HALF`
    (1 + |r|), or wider where the slope is small, so that this move is at
    least :data:`_NEWTON_MARGIN` per sampled response (1e4 times the
    rounding). So every midpoint the bisection would evaluate outside
    [r - h, r + h] compares as those two do: its answer's log lies in
    [r - h, r + h]. Those minibatches keep their
    initial bracket as the state to finish from (``left`` = all
    :data:`_BISECT_STEPS`). Point masses keep this true: below their largest,
    P, every comparison is true, and the check at r + h passes only where
    exp(r + h) >= P, so every larger midpoint clears them too. The others take
    :data:`_COARSE_STEPS` bisection steps and keep that state.

    Fills ``blo``, ``bhi`` (log tokens: the answer's log is in [blo, bhi]),
    the bracket ``(lo, hi]``, ``seen`` (bit 0: lo was a midpoint, bit 1: hi
    was), ``left`` (bisection steps still to take) and ``exact`` (1 when the
    bisection already stopped: then ``exp(hi)`` is :func:`_max_quantiles`'
    answer; 2 when there was no bracket: then ``exp(lo)`` is).
    """
    logq = math.log(q)
    for b in prange(starts.size - 1):
        lo_i, hi_i = starts[b], starts[b + 1]
        a, c = _initial_bracket(mu, sigma, point, lo_i, hi_i)
        if c <= a:
            lo[b], hi[b], seen[b], exact[b], left[b] = a, a, 0, 2, 0
            blo[b], bhi[b] = a, a
            continue
        r, slope = _newton_root(logq, mu, sigma, nseq, lo_i, hi_i)
        if not math.isnan(r) and slope > 0.0:
            draws = 1.0
            for i in range(lo_i, hi_i):
                draws += nseq[i]
            h = max(_NEWTON_HALF * (1.0 + abs(r)), _NEWTON_MARGIN * draws / slope)
            if (a < r - h and r + h < c and _cdf_max_below(r - h, logq, mu, sigma, point, nseq, lo_i, hi_i)
                    and not _cdf_max_below(r + h, logq, mu, sigma, point, nseq, lo_i, hi_i)):  # fmt: skip
                lo[b], hi[b], seen[b], exact[b], left[b] = a, c, 0, 0, _BISECT_STEPS
                blo[b], bhi[b] = r - h, r + h
                continue
        a, c, ls, hs, stopped = _bisect(logq, mu, sigma, point, nseq, lo_i, hi_i, a, c, False, False, _COARSE_STEPS)
        lo[b], hi[b] = a, c
        blo[b], bhi[b] = a, c
        seen[b] = (1 if ls else 0) + (2 if hs else 0)
        exact[b] = 1 if stopped else 0
        left[b] = _BISECT_STEPS - _COARSE_STEPS


@parallel_njit
def _finish_quantiles(mu, sigma, point, nseq, starts, q, lo, hi, seen, left, which):
    """The exact answers of minibatches ``which``: their bisections resumed from :func:`_coarse_quantiles`' state."""
    out = np.empty(which.size, dtype=np.float64)
    logq = math.log(q)
    for k in prange(which.size):
        b = which[k]
        _, c, _, _, _ = _bisect(
            logq, mu, sigma, point, nseq, starts[b], starts[b + 1], lo[b], hi[b],
            (seen[b] & 1) != 0, (seen[b] & 2) != 0, left[b],
        )  # fmt: skip
        out[k] = math.exp(c)
    return out


@njit(**NJIT_FLAGS)
def _exp_bounds(blo, bhi, hi, exact):
    """Closed intervals (tokens) holding each minibatch's exact answer (a point where it is known)."""
    m = blo.size
    elo = np.empty(m, dtype=np.float64)
    ehi = np.empty(m, dtype=np.float64)
    for b in range(m):
        if exact[b] == 2:
            elo[b] = ehi[b] = math.exp(blo[b])
        elif exact[b] == 1:
            elo[b] = ehi[b] = math.exp(hi[b])
        else:
            # The answer's log is in [blo, bhi] and exp never decreases (rounding
            # included), so the answer is in [exp(blo), exp(bhi)].
            elo[b] = math.exp(blo[b])
            ehi[b] = math.exp(bhi[b])
    return elo, ehi


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
