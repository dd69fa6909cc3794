"""Private Numba kernel of :mod:`aspc.partition`: the boundary dynamic program.

Takes validated, contiguous float64 lengths sorted non-decreasing; never checks
or prints. See :func:`aspc.partition.partition` for the contract.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from aspc.numba_config import NJIT_FLAGS


@njit(**NJIT_FLAGS)
def _band_step(lengths, j, lo, hi, batch_size, overhead, penalty, cost, dev, base_cost, base_dev, lo_from):
    """Best way to end a prefix of length ``j`` with one minibatch.

    Sizes ``lo_from..hi`` are scanned in ascending order; a size below ``lo``
    closes a remainder minibatch and extends ``base_*`` (the band-only table),
    a size in the band extends ``cost``/``dev`` (the table being filled).
    Strict comparisons make the smallest size win exact ties.
    """
    best = np.inf
    best_dev = 0
    best_size = 0
    last = lengths[j - 1]
    top = min(hi, j)
    for s in range(lo_from, top + 1):
        if s < lo:
            prev = base_cost[j - s]
            cand_dev = base_dev[j - s] + (batch_size - s)
        else:
            prev = cost[j - s]
            cand_dev = dev[j - s] + abs(s - batch_size)
        if prev == np.inf:
            continue
        c = prev + (s + overhead) * last + penalty
        if c < best or (c == best and cand_dev < best_dev):
            best = c
            best_dev = cand_dev
            best_size = s
    return best, best_dev, best_size


@njit(**NJIT_FLAGS)
def _fill(lengths, lo, hi, batch_size, overhead, penalty, cost, dev, size, base_cost, base_dev, lo_from):
    """Fill one DP table (cost, total deviation, last size) for every prefix."""
    n = lengths.shape[0]
    for j in range(1, n + 1):
        c, d, s = _band_step(lengths, j, lo, hi, batch_size, overhead, penalty, cost, dev, base_cost, base_dev, lo_from)
        cost[j] = c
        dev[j] = d
        size[j] = s


@njit(**NJIT_FLAGS)
def _partition_kernel(lengths, batch_size, lo, hi, overhead, penalty):
    """Optimal boundaries of ``lengths`` into minibatches of size in ``[lo, hi]``.

    Each minibatch costs ``(size + overhead) * max + penalty``.
    Returns ``(boundaries, used_remainder)``. First a band-only table ``f``; if
    it cannot reach ``n``, a second table ``g`` (exactly one remainder
    minibatch of size ``1..lo-1`` already placed) built on top of ``f``.
    """
    n = lengths.shape[0]
    f_cost = np.full(n + 1, np.inf)
    f_dev = np.zeros(n + 1, np.int64)
    f_size = np.zeros(n + 1, np.int64)
    f_cost[0] = 0.0
    _fill(lengths, lo, hi, batch_size, overhead, penalty, f_cost, f_dev, f_size, f_cost, f_dev, lo)

    use_g = f_cost[n] == np.inf
    g_size = np.zeros(1, np.int64)
    if use_g:
        g_cost = np.full(n + 1, np.inf)
        g_dev = np.zeros(n + 1, np.int64)
        g_size = np.zeros(n + 1, np.int64)
        _fill(lengths, lo, hi, batch_size, overhead, penalty, g_cost, g_dev, g_size, f_cost, f_dev, 1)

    # Walk back from n, switching from g to f at the remainder minibatch.
    sizes = np.empty(n, np.int64)
    m = 0
    j = n
    in_g = use_g
    while j > 0:
        s = g_size[j] if in_g else f_size[j]
        if s < lo:
            in_g = False
        sizes[m] = s
        m += 1
        j -= s
    boundaries = np.empty(m + 1, np.int64)
    boundaries[0] = 0
    for k in range(m):
        boundaries[k + 1] = boundaries[k] + sizes[m - 1 - k]
    return boundaries, use_g
