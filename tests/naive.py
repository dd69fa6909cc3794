"""Brute-force oracles for the numerical kernels (tiny inputs only).

Each oracle states its rule directly, by enumeration, so that the fast
kernels can be checked against a definition rather than against themselves.
"""

from __future__ import annotations

import itertools

import numpy as np


def compositions(n: int):
    """Every ordered sequence of positive integers summing to ``n``."""
    for cuts in itertools.product((False, True), repeat=n - 1):
        sizes, run = [], 1
        for cut in cuts:
            if cut:
                sizes.append(run)
                run = 1
            else:
                run += 1
        sizes.append(run)
        yield tuple(sizes)


def partition(sorted_lengths, batch_size: int, slack: int, overhead: float = 0.0) -> tuple[float, tuple[int, ...]]:
    """Optimal ``(padded cost, sizes)`` by enumerating all compositions of ``n``.

    Rule (mirrors :func:`aspc.partition.partition`): all sizes in
    ``[B - slack, B + slack]`` if any such composition exists; otherwise exactly
    one size in ``[1, B - slack - 1]`` and the rest in the band. Ties: least
    ``sum |size - B|``, then the reversed size sequence lexicographically least.
    """
    a = [float(x) for x in sorted_lengths]
    lo, hi = batch_size - slack, batch_size + slack

    def key(sizes):
        cost, end = 0.0, 0
        for s in sizes:
            end += s
            cost += (s + overhead) * a[end - 1]
        dev = sum(abs(s - batch_size) for s in sizes)
        return cost, dev, tuple(reversed(sizes))

    comps = list(compositions(len(a)))
    band = [c for c in comps if all(lo <= s <= hi for s in c)]
    if not band:
        band = [c for c in comps if sum(not lo <= s <= hi for s in c) == 1 and all(s <= hi for s in c)]
    best = min(band, key=key)
    return key(best)[0], best


def group_capacities(n_items: int, n_groups: int) -> list[int]:
    """Default cardinalities: ``n_items // n_groups``, the last remainder groups one more."""
    q, r = divmod(n_items, n_groups)
    return [q] * (n_groups - r) + [q + 1] * r


def balance(costs, n_groups: int) -> float:
    """Optimal max group load under the default cardinality rule, by enumeration.

    Groups hold ``M // G`` or ``M // G + 1`` minibatches; which groups hold the
    extra one does not matter (labels are interchangeable), so assignments are
    admitted whenever their sorted group sizes match that rule.
    """
    c = np.asarray(costs, dtype=np.float64)
    caps = sorted(group_capacities(c.size, n_groups))
    best = np.inf
    for assign in itertools.product(range(n_groups), repeat=c.size):
        if sorted(np.bincount(assign, minlength=n_groups)) == caps:
            best = min(best, np.bincount(assign, weights=c, minlength=n_groups).max())
    return float(best)


def padded_costs(lengths, starts, n_samples: int) -> list[float]:
    """Padded cost of each minibatch: sequences times the longest predicted length, one by one."""
    x = np.asarray(lengths, dtype=np.float64)
    return [n_samples * (e - s) * x[s:e].max() for s, e in zip(starts[:-1], starts[1:], strict=True)]


def sim_minibatch_times(lens: np.ndarray, ptok: np.ndarray, prefill_tokens: float, c):
    """Step-by-step decode of one minibatch: the definition the simulator's kernel must match.

    ``c`` holds the simulator's step-time coefficients
    (:class:`aspc.runtime.backends.sim.SimCostModel`); returns the minibatch's
    duration and each sample's finish offset, seconds.
    """
    pre = c.prefill_base + c.prefill_per_token * prefill_tokens
    t = pre
    finish = np.full(lens.size, pre)
    for step in range(1, int(lens.max(initial=0)) + 1):
        active = lens >= step
        ctx = float(np.sum(ptok[active] + step - 1))
        t += c.decode_base + c.decode_per_seq * active.sum() + c.decode_per_context_token * ctx
        finish[lens == step] = t
    return t, finish
