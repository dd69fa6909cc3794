"""Private Numba kernel of :mod:`aspc.partition`: the boundary dynamic program.

Takes validated, contiguous float64 lengths sorted non-decreasing; never checks
or prints. See :func:`aspc.partition.partition` for the contract.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from aspc.numba_config import NJIT_FLAGS


@njit(**NJIT_FLAGS)
def _fill(lengths, lo, hi, batch_size, overhead, penalty, cost, dev, size, base_cost, base_dev, lo_from, base_prev):
    """Fill one DP table (cost, total deviation, last size) for every prefix.

    For each prefix ``j`` the sizes ``lo_from..min(hi, j)`` are scanned in
    ascending order: a size below ``lo`` closes a remainder minibatch and
    extends ``base_*`` (the band-only table), a size in the band extends
    ``cost``/``dev`` (the table being filled). Strict comparisons make the
    smallest size win exact ties. An unreachable prefix (cost ``inf``) needs
    no test: its candidate costs ``inf``, which never beats ``best`` (a tie at
    ``inf`` would need a negative deviation), so the loops are branch-free
    selects (the comparisons are data-dependent and mispredict as branches).

    The remainder sizes visit only reachable prefixes of ``base_*``:
    ``base_prev[i]`` is the largest reachable prefix ``<= i`` (-1: none). With a
    narrow band few prefixes are reachable (slack 0: the multiples of B), and
    scanning all ``lo - 1`` sizes made a remainder cost O(n B): 79 s for a
    million prompts at B = 16384. Sizes are still visited in ascending order
    and an unreachable one could never win, so the table is the same.
    """
    n = lengths.shape[0]
    rem_top = lo - 1
    for j in range(1, n + 1):
        best = np.inf
        best_dev = 0
        best_size = 0
        last = lengths[j - 1]
        top = min(hi, j)
        stop = j - min(rem_top, top)  # smallest prefix a remainder size may start from
        p = j - lo_from
        while p >= stop:
            p = base_prev[p]  # skip to the next reachable prefix below (sizes ascending)
            while p >= stop and base_cost[p] < np.inf:  # a run of reachable prefixes
                s = j - p
                c = base_cost[p] + (s + overhead) * last + penalty
                cand_dev = base_dev[p] + (batch_size - s)
                better = (c < best) | ((c == best) & (cand_dev < best_dev))
                best = c if better else best
                best_dev = cand_dev if better else best_dev
                best_size = s if better else best_size
                p -= 1
        for s in range(max(lo, lo_from), top + 1):
            c = cost[j - s] + (s + overhead) * last + penalty
            cand_dev = dev[j - s] + abs(s - batch_size)
            better = (c < best) | ((c == best) & (cand_dev < best_dev))
            best = c if better else best
            best_dev = cand_dev if better else best_dev
            best_size = s if better else best_size
        cost[j] = best
        dev[j] = best_dev
        size[j] = best_size


@njit(**NJIT_FLAGS)
def _partition_kernel(lengths, batch_size, lo, hi, overhead, penalty):
    """Optimal boundaries of ``lengths`` into minibatches of size in ``[lo, hi]``.

    Each minibatch costs ``(size + overhead) * max + penalty``.
    Returns ``(boundaries, used_remainder)``. First a band-only table ``f``; if
    it cannot reach ``n``, a second table ``g`` (exactly one remainder
    minibatch of size ``1..lo-1`` already placed) built on top of ``f``.
    """
    n = lengths.shape[0]
    f = (np.empty(n + 1), np.empty(n + 1, np.int64), np.empty(n + 1, np.int64))
    g = (np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64))  # allocated inside if needed
    return _partition_tables(lengths, batch_size, lo, hi, overhead, penalty, f, g, np.empty(n, np.int64))


@njit(**NJIT_FLAGS)
def _partition_tables(lengths, batch_size, lo, hi, overhead, penalty, f, g, sizes):
    """:func:`_partition_kernel` in tables the caller allocated: ``f`` and ``g`` are
    (cost, deviation, size) triples of ``n + 1`` entries (``g`` may be empty
    when the band alone reaches ``n``; it is allocated here if not), ``sizes``
    has ``n``. A caller on another thread passes tables from its own, so the
    large temporaries go back to the allocator they came from.
    """
    n = lengths.shape[0]
    f_cost, f_dev, f_size = f
    f_cost[:] = np.inf
    f_dev[:] = 0
    f_size[:] = 0
    f_cost[0] = 0.0
    # lo_from = lo: no remainder sizes, so the band-only table needs no reachable-prefix index.
    _fill(lengths, lo, hi, batch_size, overhead, penalty, f_cost, f_dev, f_size, f_cost, f_dev, lo, f_size[:0])

    use_g = f_cost[n] == np.inf
    g_size = np.zeros(1, np.int64)
    if use_g:
        g_cost, g_dev, g_size = g
        if g_cost.shape[0] != n + 1:
            g_cost = np.empty(n + 1)
            g_dev = np.empty(n + 1, np.int64)
            g_size = np.empty(n + 1, np.int64)
        g_cost[:] = np.inf
        g_dev[:] = 0
        g_size[:] = 0
        f_prev = np.empty(n + 1, np.int64)
        reach = -1
        for i in range(n + 1):
            reach = i if f_cost[i] < np.inf else reach
            f_prev[i] = reach
        _fill(lengths, lo, hi, batch_size, overhead, penalty, g_cost, g_dev, g_size, f_cost, f_dev, 1, f_prev)

    # Walk back from n, switching from g to f at the remainder minibatch.
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
