"""Private Numba kernels of :mod:`aspc.anneal`: starts (KK, LPT) and SA sweeps.

Every function here takes validated contiguous arrays and never checks or
prints; :mod:`aspc.anneal.balance` is the checked wrapper and drives the loop.
Only integer shifts, xors, ``+``, ``*`` and ``/`` touch the random stream and
the acceptance test, so a seed gives the same plan compiled or interpreted
(``NUMBA_DISABLE_JIT=1``) and on every IEEE-754 machine.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from aspc.numba_config import NJIT_FLAGS

_S13 = np.uint64(13)
_S7 = np.uint64(7)
_S17 = np.uint64(17)
_S11 = np.uint64(11)
_TWO_M53 = 1.0 / 9007199254740992.0


@njit(**NJIT_FLAGS)
def _next(rng):
    """Advance a xorshift64 state (Marsaglia 2003) held in ``rng[0]``.

    Shifts and xors only: NumPy scalars would warn on a wrapping multiply
    when the kernel runs interpreted.
    """
    x = rng[0]
    x ^= x << _S13
    x ^= x >> _S7
    x ^= x << _S17
    rng[0] = x
    return x


@njit(**NJIT_FLAGS)
def _below(rng, n):
    """Uniform integer in ``[0, n)`` from the top 53 bits (bias < n / 2**53)."""
    return np.int64((_next(rng) >> _S11) % np.uint64(n))


@njit(**NJIT_FLAGS)
def _unit(rng):
    """Uniform float in ``[0, 1)``."""
    return np.float64(_next(rng) >> _S11) * _TWO_M53


@njit(**NJIT_FLAGS)
def _exp_neg(z):
    """``exp(-z)`` for ``z >= 0`` from ``+``/``*`` only.

    libm's ``exp`` may differ by an ulp between machines and between Numba and
    CPython; a Taylor step on ``z / 1024`` squared ten times (relative error
    < 1e-8, irrelevant to annealing) keeps the Metropolis test bit-reproducible.
    """
    if z > 40.0:
        return 0.0
    y = z * (1.0 / 1024.0)
    p = 1.0 - y * (1.0 - y * (0.5 - y * (1.0 / 6.0 - y * (1.0 / 24.0 - y * (1.0 / 120.0)))))
    for _ in range(10):
        p = p * p
    return p


# ---------------------------------------------------------------- binary heap
# A min-heap of ids ordered by (k1[id], k2[id], id): the id makes ties
# deterministic. Keys live outside the heap; an id's keys may only change
# while it is popped.


@njit(**NJIT_FLAGS)
def _before(a, b, k1, k2):
    if k1[a] != k1[b]:
        return k1[a] < k1[b]
    if k2[a] != k2[b]:
        return k2[a] < k2[b]
    return a < b


@njit(**NJIT_FLAGS)
def _heap_push(heap, n, item, k1, k2):
    pos = n
    heap[pos] = item
    while pos > 0:
        parent = (pos - 1) // 2
        if not _before(heap[pos], heap[parent], k1, k2):
            break
        heap[pos], heap[parent] = heap[parent], heap[pos]
        pos = parent
    return n + 1


@njit(**NJIT_FLAGS)
def _heap_pop(heap, n, k1, k2):
    top = heap[0]
    n -= 1
    heap[0] = heap[n]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        if child + 1 < n and _before(heap[child + 1], heap[child], k1, k2):
            child += 1
        if not _before(heap[child], heap[pos], k1, k2):
            break
        heap[pos], heap[child] = heap[child], heap[pos]
        pos = child
    return top, n


# ------------------------------------------------------------------- starts


@njit(**NJIT_FLAGS)
def _lpt_kernel(order, w1, w2, caps):
    """Greedy list scheduling: each item, in ``order``, to the group with room
    whose running ``(sum w1, sum w2)`` is least.

    With ``w1 = cost`` and ``order`` by cost descending this is LPT (Graham
    1969) under cardinality caps; with ``w1 = samples``, ``w2 = cost`` it
    balances sample counts first.
    """
    n_groups = caps.shape[0]
    group_of = np.empty(order.shape[0], np.int32)
    k1 = np.zeros(n_groups)
    k2 = np.zeros(n_groups)
    room = caps.copy()
    heap = np.empty(n_groups, np.int64)
    n = 0
    for g in range(n_groups):
        if room[g] > 0:
            n = _heap_push(heap, n, g, k1, k2)
    for it in order:
        g, n = _heap_pop(heap, n, k1, k2)
        group_of[it] = g
        k1[g] += w1[it]
        k2[g] += w2[it]
        room[g] -= 1
        if room[g] > 0:
            n = _heap_push(heap, n, g, k1, k2)
    return group_of


@njit(**NJIT_FLAGS)
def _spread(row):
    hi = row[0]
    lo = row[0]
    for v in row:
        hi = max(hi, v)
        lo = min(lo, v)
    return hi - lo


@njit(**NJIT_FLAGS)
def _kk_kernel(costs, order, n_groups):
    """Balanced largest differencing (Karmarkar & Karp 1982; Michiels et al. 2003).

    ``order`` lists items by cost descending. Items are padded with zero-cost
    dummies to ``L * G`` and cut into ``L`` layers of ``G``; each layer is a
    partial solution with one item per group. The two partial solutions of
    largest spread are merged, largest subset with smallest, until one is
    left; every group then holds one item (or dummy) per layer, so group
    sizes are ``ceil(M / G)`` or one less.
    """
    m = costs.shape[0]
    g = n_groups
    n_layers = (m + g - 1) // g
    sums = np.zeros((n_layers, g))
    head = np.full((n_layers, g), -1, np.int64)
    tail = np.full((n_layers, g), -1, np.int64)
    nxt = np.full(m, -1, np.int64)
    for r in range(m):
        item = order[r]
        sums[r // g, r % g] = costs[item]
        head[r // g, r % g] = item
        tail[r // g, r % g] = item

    neg_spread = np.zeros(n_layers)
    zeros = np.zeros(n_layers)
    heap = np.empty(n_layers, np.int64)
    n = 0
    for layer in range(n_layers):
        neg_spread[layer] = -_spread(sums[layer])
        n = _heap_push(heap, n, layer, neg_spread, zeros)

    new_sums = np.empty(g)
    new_head = np.empty(g, np.int64)
    new_tail = np.empty(g, np.int64)
    while n > 1:
        a, n = _heap_pop(heap, n, neg_spread, zeros)
        b, n = _heap_pop(heap, n, neg_spread, zeros)
        order_a = np.argsort(-sums[a], kind="mergesort")
        order_b = np.argsort(sums[b], kind="mergesort")
        for k in range(g):
            sa = order_a[k]
            sb = order_b[k]
            new_sums[k] = sums[a, sa] + sums[b, sb]
            h, t = head[a, sa], tail[a, sa]
            if h < 0:
                h, t = head[b, sb], tail[b, sb]
            elif head[b, sb] >= 0:
                nxt[t] = head[b, sb]
                t = tail[b, sb]
            new_head[k] = h
            new_tail[k] = t
        sums[a] = new_sums
        head[a] = new_head
        tail[a] = new_tail
        neg_spread[a] = -_spread(new_sums)
        n = _heap_push(heap, n, a, neg_spread, zeros)

    final = heap[0]
    group_of = np.empty(m, np.int32)
    for k in range(g):
        item = head[final, k]
        while item >= 0:
            group_of[item] = k
            item = nxt[item]
    return group_of


# ------------------------------------------------------- simulated annealing


class AnnealState(NamedTuple):
    """Mutable arrays one SA run works on; built by the driver, G groups, M items."""

    costs: np.ndarray  # float64[M], cost of each minibatch
    group_of: np.ndarray  # int32[M], current group of each minibatch
    slot: np.ndarray  # int64[M], position of each minibatch in members
    members: np.ndarray  # int64[M], group g's minibatches at group_start[g]..group_start[g+1]
    group_start: np.ndarray  # int64[G+1], CSR offsets into members; fixed, as swaps keep sizes
    loads: np.ndarray  # float64[G], current sum of costs per group
    tree_max: np.ndarray  # float64[2P], tournament tree of max load, leaves at P + g, padding -inf
    tree_arg: np.ndarray  # int64[2P], the group holding tree_max (lowest index on ties)
    class_of: np.ndarray  # int64[M], swap class: only minibatches of one class swap
    class_start: np.ndarray  # int64[C+1], CSR offsets into class_members
    class_members: np.ndarray  # int64[M], minibatches by class, then cost ascending, then index
    rank: np.ndarray  # int64[M], position of each minibatch within its class's run of class_members
    snapshot: np.ndarray  # int32[M], an earlier assignment; best = snapshot + journal[:marks[1]]
    journal: np.ndarray  # int64[J, 2], accepted swaps since the snapshot, in order
    marks: np.ndarray  # int64[2], [swaps in journal (-1: overflowed), swaps up to the best state]
    best_max: np.ndarray  # float64[1], best max load seen
    rng: np.ndarray  # uint64[1], xorshift64 state, never 0


@njit(**NJIT_FLAGS)
def _tree_set(tree_max, tree_arg, g, load):
    """Set group ``g``'s load in the tournament tree and repair the path to the root."""
    node = tree_max.shape[0] // 2 + g
    tree_max[node] = load
    node //= 2
    while node >= 1:
        left = 2 * node
        if tree_max[left] >= tree_max[left + 1]:
            tree_max[node] = tree_max[left]
            tree_arg[node] = tree_arg[left]
        else:
            tree_max[node] = tree_max[left + 1]
            tree_arg[node] = tree_arg[left + 1]
        node //= 2


@njit(**NJIT_FLAGS)
def _tree_build(tree_max, tree_arg, loads):
    half = tree_max.shape[0] // 2
    tree_max[:] = -np.inf
    tree_arg[:] = -1
    for g in range(loads.shape[0]):
        tree_arg[half + g] = g
        _tree_set(tree_max, tree_arg, g, loads[g])


@njit(**NJIT_FLAGS)
def _replay(assignment, journal, n):
    for k in range(n):
        i = journal[k, 0]
        j = journal[k, 1]
        assignment[i], assignment[j] = assignment[j], assignment[i]


@njit(**NJIT_FLAGS)
def _record(journal, marks, snapshot, i, j):
    """Log an accepted swap so the best state can be rebuilt without copies.

    Copying the assignment at every new best would cost O(M) a step; the
    journal is folded into the snapshot only when full, O(1) amortised.
    """
    n = marks[0]
    if n < 0:
        return
    if n == journal.shape[0]:
        b = marks[1]
        if b == 0:
            # The best is the snapshot itself; later swaps matter only if a
            # new best appears, and that copies the current state instead.
            marks[0] = -1
            return
        _replay(snapshot, journal, b)
        for k in range(n - b):
            journal[k, 0] = journal[b + k, 0]
            journal[k, 1] = journal[b + k, 1]
        n -= b
        marks[1] = 0
    journal[n, 0] = i
    journal[n, 1] = j
    marks[0] = n + 1


@njit(**NJIT_FLAGS)
def _mark_best(marks, snapshot, group_of):
    """Mark the current state as the best one."""
    if marks[0] < 0:
        snapshot[:] = group_of
        marks[0] = 0
    marks[1] = marks[0]


@njit(**NJIT_FLAGS)
def _best_assignment(st):
    """The best assignment seen, as a new array."""
    best = st.snapshot.copy()
    if st.marks[0] >= 0:
        _replay(best, st.journal, st.marks[1])
    return best


@njit(**NJIT_FLAGS)
def _cheaper_partner(rng, i, rank, class_of, class_start, class_members):
    """A cheaper minibatch of ``i``'s class at a log-uniform rank distance; -1 if none.

    Only lightening the heaviest group lowers the max; a log-uniform distance
    proposes coarse and fine load differences alike.
    """
    r = rank[i]
    if r == 0:
        return -1
    bits = 0
    while (r >> bits) > 1:
        bits += 1
    width = np.int64(1) << _below(rng, bits + 1)
    return class_members[class_start[class_of[i]] + r - 1 - _below(rng, width)]


@njit(**NJIT_FLAGS)
def _halving_partner(i, p, q, costs, loads, members, group_start, class_of):
    """The minibatch of group ``q`` whose swap with ``i`` (in ``p``) best halves
    their load difference; -1 if ``q`` has none of ``i``'s class."""
    want = costs[i] - 0.5 * (loads[p] - loads[q])
    best = -1
    best_err = np.inf
    for k in range(group_start[q], group_start[q + 1]):
        j = members[k]
        if class_of[j] == class_of[i]:
            err = abs(costs[j] - want)
            if err < best_err:
                best_err = err
                best = j
    return best


@njit(**NJIT_FLAGS)
def _anneal_chunk(st, n_props, temperature, kappa, target, mix):
    """Run up to ``n_props`` swap proposals at a fixed temperature.

    Proposals swap two minibatches of one class between groups. With
    probability ``mix[0]`` a minibatch of the heaviest group meets a cheaper
    one anywhere; up to ``mix[1]``, it meets the best halving partner in a
    random group; otherwise two minibatches are drawn uniformly. Energy is
    the max load plus ``kappa * sum(load**2)``: the second term, tiny next to
    the first, lets swaps that leave the max unchanged still level the other
    groups. Metropolis acceptance (Kirkpatrick et al. 1983). Returns the
    number of proposals made; stops early once the best max load is
    ``<= target``.
    """
    # Locals, not st.<field> in the loop: each NamedTuple field access
    # costs an array reference count, ~10x the rest of a proposal.
    costs, group_of, slot, members, group_start = st.costs, st.group_of, st.slot, st.members, st.group_start
    loads, tree_max, tree_arg = st.loads, st.tree_max, st.tree_arg
    class_of, class_start, class_members, rank = st.class_of, st.class_start, st.class_members, st.rank
    snapshot, journal, marks, best_max, rng = st.snapshot, st.journal, st.marks, st.best_max, st.rng
    n_items = costs.shape[0]
    n_groups = loads.shape[0]
    for it in range(n_props):
        u = _unit(rng)
        if u < mix[1]:
            top = tree_arg[1]
            i = members[group_start[top] + _below(rng, group_start[top + 1] - group_start[top])]
            if u < mix[0]:
                j = _cheaper_partner(rng, i, rank, class_of, class_start, class_members)
            else:
                q = _below(rng, n_groups)
                j = -1 if q == top else _halving_partner(i, top, q, costs, loads, members, group_start, class_of)
            if j < 0:
                continue
        else:
            i = _below(rng, n_items)
            first = class_start[class_of[i]]
            j = class_members[first + _below(rng, class_start[class_of[i] + 1] - first)]
        p = group_of[i]
        q = group_of[j]
        d = costs[i] - costs[j]
        if p == q or d == 0.0:
            continue
        lp = loads[p]
        lq = loads[q]
        old = tree_max[1]
        touched = tree_arg[1] == p or tree_arg[1] == q
        if touched:
            _tree_set(tree_max, tree_arg, p, lp - d)
            _tree_set(tree_max, tree_arg, q, lq + d)
            new = tree_max[1]
        else:
            new = max(old, lp - d, lq + d)
        delta = (new - old) + kappa * 2.0 * d * (d - (lp - lq))
        # T = 0 (costs so tiny that T0 * ALPHA**k underflows) is the greedy limit: refuse
        # every uphill move; delta / 0.0 would raise compiled and be inf interpreted.
        if delta > 0.0 and (temperature <= 0.0 or _unit(rng) >= _exp_neg(delta / temperature)):
            if touched:
                _tree_set(tree_max, tree_arg, p, lp)
                _tree_set(tree_max, tree_arg, q, lq)
            continue
        if not touched:
            _tree_set(tree_max, tree_arg, p, lp - d)
            _tree_set(tree_max, tree_arg, q, lq + d)
        loads[p] = lp - d
        loads[q] = lq + d
        si = slot[i]
        sj = slot[j]
        members[si] = j
        members[sj] = i
        slot[i] = sj
        slot[j] = si
        group_of[i] = q
        group_of[j] = p
        _record(journal, marks, snapshot, i, j)
        if new <= best_max[0]:
            best_max[0] = new
            _mark_best(marks, snapshot, group_of)
            if new <= target:
                return it + 1
    return n_props
