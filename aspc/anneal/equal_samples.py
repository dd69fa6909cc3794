"""Levelling the groups' sample counts of an ``--equal-samples`` start by swaps.

The samples-LPT start gives each minibatch, largest sample count first, to the
group holding the fewest samples. That greedy can end a few samples apart
where the minibatches' sizes allow equal groups (147-159 on the bundled
example, whose minibatches hold 12-20 prompts). Swapping a minibatch of a
heavier group with a smaller one of a lighter group keeps every group's
cardinality and moves the difference ``d`` between them; with ``0 < d < gap``
the sum of squared sample counts falls by ``2 d (gap - d)``, so the search
ends. The annealer swaps only equal sizes afterwards, so the counts found
here are the plan's.
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["level_samples"]


class _Groups:
    """Per-group counts of each size class, kept current through swaps, with the lowest minibatch of each.

    Groups are also counted by their sample total: a swap keeps both totals within the pair's old
    range, so the totals' range never grows, and "is there a group of total t holding a class in
    [lo, hi)" is one lookup. A partner is then found per total (a few hundred at most), not per group.
    """

    def __init__(self, group_of: np.ndarray, cls: np.ndarray, values: np.ndarray, n_groups: int) -> None:
        self.values = values
        self.counts = np.zeros((n_groups, values.size), np.int64)
        np.add.at(self.counts, (group_of, cls), 1)
        self.totals = (self.counts * values).sum(axis=1)  # integers: exact in any order
        # present[g, j] as running counts over classes: "has group g a class in [lo, hi)" is one subtraction.
        self.cum = np.zeros((n_groups, values.size + 1), np.int64)
        np.cumsum(self.counts > 0, axis=1, out=self.cum[:, 1:])
        self.t0 = int(self.totals.min())
        # by_total[t - t0, j]: groups of total t holding class j.
        self.by_total = np.zeros((int(self.totals.max()) - self.t0 + 1, values.size), np.int64)
        np.add.at(self.by_total, self.totals - self.t0, (self.counts > 0).astype(np.int64))
        self.members: dict[tuple[int, int], list[int]] = {}
        for i in np.lexsort((np.arange(cls.size), cls, group_of)).tolist():
            self.members.setdefault((int(group_of[i]), int(cls[i])), []).append(i)  # ascending: already a heap

    def swap(self, heavy: int, light: int, a: int, b: int) -> tuple[int, int]:
        """Move the lowest minibatch of class ``a`` from ``heavy`` to ``light`` and of class ``b`` back."""
        i = heapq.heappop(self.members[(heavy, a)])
        j = heapq.heappop(self.members[(light, b)])
        heapq.heappush(self.members.setdefault((light, a), []), i)
        heapq.heappush(self.members.setdefault((heavy, b), []), j)
        for g, out_c, in_c in ((heavy, a, b), (light, b, a)):
            self.by_total[self.totals[g] - self.t0] -= self.counts[g] > 0
            self.counts[g, out_c] -= 1
            self.counts[g, in_c] += 1
            self.totals[g] += self.values[in_c] - self.values[out_c]
            np.cumsum(self.counts[g] > 0, out=self.cum[g, 1:])
            self.by_total[self.totals[g] - self.t0] += self.counts[g] > 0
        return i, j

    def _bounds(self, own: np.ndarray, gaps: np.ndarray, heavy: bool) -> tuple[np.ndarray, np.ndarray]:
        """Per gap and own class, the partner's classes [lo, hi) a swap helps with (``0 < d < gap``)."""
        v = self.values
        if heavy:  # class a (own) leaves, class b of the partner arrives: v[a] - gap < v[b] < v[a]
            lo = np.searchsorted(v, v[own][None, :] - gaps[:, None], side="right")
            return lo, np.broadcast_to(own[None, :], lo.shape)
        # class a of the partner leaves, class b (own) arrives: v[b] < v[a] < v[b] + gap
        hi = np.searchsorted(v, v[own][None, :] + gaps[:, None], side="left")
        return np.broadcast_to(own[None, :] + 1, hi.shape), hi

    def partner(self, group: int, heavy: bool) -> tuple[int, int, int, int] | None:
        """(heavier, lighter, class out of the heavier, class in) for the best swap with ``group``, or None.

        ``heavy``: ``group`` gives, to the lightest group a swap helps; else it takes, from the heaviest
        (the lowest-numbered of that total).
        """
        own = np.flatnonzero(self.counts[group] > 0)
        t_all = self.t0 + np.arange(self.by_total.shape[0])
        gaps = (self.totals[group] - t_all) if heavy else (t_all - self.totals[group])
        lo, hi = self._bounds(own, gaps, heavy)
        held = np.zeros((t_all.size, self.values.size + 1), np.int64)
        np.cumsum(self.by_total > 0, axis=1, out=held[:, 1:])
        rows = np.arange(t_all.size)[:, None]
        ok = (gaps[:, None] > 1) & (hi > lo) & (held[rows, np.maximum(hi, lo)] > held[rows, lo])
        feasible = np.flatnonzero(ok.any(axis=1))
        if feasible.size == 0:
            return None
        r = int(feasible[0] if heavy else feasible[-1])  # the spread's other end moves when it can
        lo_r, hi_r = lo[r], hi[r]
        cands = np.flatnonzero(self.totals == t_all[r])
        cum = self.cum[cands]
        fits = ((hi_r > lo_r)[None, :] & (cum[:, np.maximum(hi_r, lo_r)] > cum[:, lo_r])).any(axis=1)
        other = int(cands[np.argmax(fits)])
        theirs = np.flatnonzero(self.counts[other] > 0)
        out_c, in_c = (own, theirs) if heavy else (theirs, own)
        d = self.values[out_c][:, None] - self.values[in_c][None, :]
        gap = int(gaps[r])
        score = np.where((d > 0) & (d < gap), np.abs(2 * d - gap), np.iinfo(np.int64).max)
        x, y = np.unravel_index(int(np.argmin(score)), score.shape)
        a, b = int(out_c[x]), int(in_c[y])
        return (group, other, a, b) if heavy else (other, group, a, b)


def level_samples(group_of: np.ndarray, sizes: np.ndarray, n_groups: int) -> np.ndarray:
    """``group_of`` with minibatches swapped between groups to level their sample counts.

    Parameters
    ----------
    group_of
        Group of each minibatch (the samples-LPT start).
    sizes
        Sequences of each minibatch (integers >= 1).
    n_groups
        Number of groups.

    Returns
    -------
    numpy.ndarray
        A new assignment, same dtype, every group's cardinality unchanged,
        where no swap with the heaviest or the lightest group lowers the sum of
        squared sample counts. Deterministic: the lowest-numbered minibatch of
        a size class moves.
    """
    out = np.array(group_of, copy=True)
    values, cls = np.unique(np.asarray(sizes, dtype=np.int64), return_inverse=True)
    if values.size < 2 or n_groups < 2:
        return out
    groups = _Groups(out, cls, values, n_groups)
    # Each swap lowers the sum of squared counts by 2 d (gap - d) >= 2: the loop ends well before this cap.
    for _ in range(int((groups.totals * groups.totals).sum()) // 2 + 1):
        found = groups.partner(int(np.argmax(groups.totals)), heavy=True)
        if found is None:
            found = groups.partner(int(np.argmin(groups.totals)), heavy=False)
        if found is None:
            return out
        heavy, light, a, b = found
        i, j = groups.swap(heavy, light, a, b)
        out[i], out[j] = light, heavy
    return out
