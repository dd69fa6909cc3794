"""Private Numba kernels of :func:`aspc.anneal.order.dispatch_order`: the greedy line-tracking order.

Every function here takes validated contiguous arrays and never checks or
prints; :mod:`aspc.anneal.order` is the checked wrapper (it validates the
inputs, sorts them and checks the result is a permutation).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from aspc.numba_config import NJIT_FLAGS


@njit(**NJIT_FLAGS)
def _find(link, k):
    """Root of ``k`` in a "next free slot" forest, with path halving."""
    while link[k] != k:
        link[k] = link[link[k]]
        k = link[k]
    return k


@njit(**NJIT_FLAGS)
def _track_line(values, gap, picks):
    """Greedy order of ``values`` (sorted ascending) keeping ``|gap|`` small.

    Each step takes the unused value closest to ``-gap`` (ties: the larger
    value; among equal values, the sorted neighbour of ``-gap``) and adds it
    to ``gap``; writes positions into ``picks``, returns the final gap. Two
    union-find forests find the nearest unused neighbour on each side, so a
    step costs ``O(log n)`` amortised.
    """
    n = values.shape[0]
    up = np.arange(n + 1)  # up[k]: first unused position >= k (n: none)
    down = np.arange(n + 1)  # down[k]: 1 + last unused position < k (0: none)
    for step in range(n):
        pos = np.searchsorted(values, -gap)
        above = _find(up, pos)
        below = _find(down, pos) - 1
        if above == n or (below >= 0 and abs(gap + values[below]) < abs(gap + values[above])):
            pick = below
        else:
            pick = above
        picks[step] = pick
        gap += values[pick]
        up[pick] = pick + 1
        down[pick + 1] = pick
    return gap


@njit(**NJIT_FLAGS)
def _order_kernel(item_excess, item_ids, group_ptr, group_excess, group_ids):
    """Groups in greedy order, each group's items in greedy order, one gap throughout."""
    n_groups = group_ids.shape[0]
    group_picks = np.empty(n_groups, np.int64)
    _track_line(group_excess, 0.0, group_picks)
    order = np.empty(item_ids.shape[0], np.int64)
    gap = 0.0
    k = 0
    for t in range(n_groups):
        g = group_ids[group_picks[t]]
        lo = group_ptr[g]
        hi = group_ptr[g + 1]
        picks = np.empty(hi - lo, np.int64)
        gap = _track_line(item_excess[lo:hi], gap, picks)
        for p in picks:
            order[k] = item_ids[lo + p]
            k += 1
    return order
