"""Private Numba kernel of :mod:`aspc.partition`: the boundary dynamic program.

Takes validated, contiguous float64 lengths sorted non-decreasing; never checks
or prints. See :func:`aspc.partition.partition` for the contract.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from aspc.numba_config import NJIT_FLAGS


@njit(**NJIT_FLAGS)
def _fill(lengths, lo, hi, batch_size, overhead, penalty, cost, dev, size, base_cost, base_dev, lo_from, base_prev, halt):
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
        if halt[0]:  # the caller gave up (Ctrl-C in a notebook): the tables are thrown away
            return
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
        best, best_dev, best_size = _band_scan(
            cost, dev, j, max(lo, lo_from), top, last, overhead, penalty, batch_size, best, best_dev, best_size
        )
        cost[j] = best
        dev[j] = best_dev
        size[j] = best_size


@njit(**NJIT_FLAGS)
def _band_scan(cost, dev, j, s0, s1, last, overhead, penalty, batch_size, best, best_dev, best_size):
    """The best of ``best`` and the band sizes ``s0..s1`` at prefix ``j``: least (cost, deviation, size).

    Four lanes (sizes s0 + k mod 4) each keep their own best, so the compare-and-select chains run side by side
    instead of each size waiting on the last (the scan is O(n (B + slack)) and the DP's whole cost at a large
    B). Each lane keeps its smallest size among exact ties, and the merge orders by size last, so the answer is
    the first size of the least (cost, deviation), as one scan in ascending order gives.
    """
    inf = np.inf
    c0, c1, c2, c3 = inf, inf, inf, inf
    d0, d1, d2, d3 = 0, 0, 0, 0
    z0, z1, z2, z3 = 0, 0, 0, 0
    s = s0
    while s + 3 <= s1:
        a = cost[j - s] + (s + overhead) * last + penalty
        b = cost[j - s - 1] + (s + 1 + overhead) * last + penalty
        c = cost[j - s - 2] + (s + 2 + overhead) * last + penalty
        d = cost[j - s - 3] + (s + 3 + overhead) * last + penalty
        ea = dev[j - s] + abs(s - batch_size)
        eb = dev[j - s - 1] + abs(s + 1 - batch_size)
        ec = dev[j - s - 2] + abs(s + 2 - batch_size)
        ed = dev[j - s - 3] + abs(s + 3 - batch_size)
        t = (a < c0) | ((a == c0) & (ea < d0))
        c0, d0, z0 = (a if t else c0), (ea if t else d0), (s if t else z0)
        t = (b < c1) | ((b == c1) & (eb < d1))
        c1, d1, z1 = (b if t else c1), (eb if t else d1), (s + 1 if t else z1)
        t = (c < c2) | ((c == c2) & (ec < d2))
        c2, d2, z2 = (c if t else c2), (ec if t else d2), (s + 2 if t else z2)
        t = (d < c3) | ((d == c3) & (ed < d3))
        c3, d3, z3 = (d if t else c3), (ed if t else d3), (s + 3 if t else z3)
        s += 4
    while s <= s1:
        a = cost[j - s] + (s + overhead) * last + penalty
        ea = dev[j - s] + abs(s - batch_size)
        t = (a < c0) | ((a == c0) & (ea < d0))
        c0, d0, z0 = (a if t else c0), (ea if t else d0), (s if t else z0)
        s += 1
    # A lane still at inf found nothing reachable; inf never wins (see _fill).
    for c, d, z in ((c0, d0, z0), (c1, d1, z1), (c2, d2, z2), (c3, d3, z3)):
        t = (c < best) | ((c == best) & ((d < best_dev) | ((d == best_dev) & (z < best_size))))
        if c < inf and t:
            best, best_dev, best_size = c, d, z
    return best, best_dev, best_size


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
    sizes, stop = np.empty(n, np.int64), np.zeros(1, np.int64)
    return _partition_tables(lengths, batch_size, lo, hi, overhead, penalty, f, g, sizes, stop)


@njit(**NJIT_FLAGS)
def _partition_tables(lengths, batch_size, lo, hi, overhead, penalty, f, g, sizes, stop):
    """:func:`_partition_kernel` in tables the caller allocated: ``f`` and ``g`` are
    (cost, deviation, size) triples of ``n + 1`` entries (``g`` may be empty
    when the band alone reaches ``n``; it is allocated here if not), ``sizes``
    has ``n``. A caller on another thread passes tables from its own, so the
    large temporaries go back to the allocator they came from. ``stop``: one
    int64 the caller sets to 1 to end the solve early (no boundaries then).
    """
    n = lengths.shape[0]
    f_cost, f_dev, f_size = f
    f_cost[:] = np.inf
    f_dev[:] = 0
    f_size[:] = 0
    f_cost[0] = 0.0
    # lo_from = lo: no remainder sizes, so the band-only table needs no reachable-prefix index.
    _fill(lengths, lo, hi, batch_size, overhead, penalty, f_cost, f_dev, f_size, f_cost, f_dev, lo, f_size[:0], stop)

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
        # The reachable-prefix index lives in ``sizes`` (free until the walk back below; a remainder starts
        # from a prefix <= n - 1, so n entries do): an array of its own, allocated on the solving thread, would
        # stay in that thread's malloc arena (16 MB at a million prompts).
        f_prev = sizes
        reach = -1
        for i in range(n):
            reach = i if f_cost[i] < np.inf else reach
            f_prev[i] = reach
        _fill(lengths, lo, hi, batch_size, overhead, penalty, g_cost, g_dev, g_size, f_cost, f_dev, 1, f_prev, stop)

    if stop[0]:
        return np.zeros(1, np.int64), use_g
    # Walk back from n, switching from g to f at the remainder minibatch.
    m = 0
    j = n
    in_g = use_g
    while j > 0:
        s = g_size[j] if in_g else f_size[j]
        if s < 1:  # n unreachable (costs overflowed to inf): stop; the caller's size check reports it
            break
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
