"""Agreement statistics between predicted and observed lengths (NumPy only).

Kept free of matplotlib so ``aspc report`` can print them without the
``report`` extra, and free of scipy, which is not a core dependency.
"""

from __future__ import annotations

import math

import numpy as np


def _dense_ranks(x: np.ndarray) -> np.ndarray:
    """0-based dense ranks: equal values share a rank, ranks have no gaps."""
    _, inv = np.unique(x, return_inverse=True)
    return inv.reshape(-1).astype(np.int64)


def _tied_pairs(ranks: np.ndarray) -> int:
    """Number of pairs ``i < j`` with equal values, ``Σ t (t-1) / 2`` over tie groups."""
    counts = np.bincount(ranks).astype(np.int64)
    return int(np.sum(counts * (counts - 1) // 2))


def count_inversions(values: np.ndarray) -> int:
    """Pairs ``i < j`` with ``values[i] > values[j]`` (strict), in O(n log² n) NumPy.

    Parameters
    ----------
    values : array_like of int, shape (n,)
        Non-negative integer keys (dense ranks), ``< n``.

    Notes
    -----
    A bottom-up merge sort done level by level on whole arrays: at width
    ``w`` every pair of adjacent sorted blocks (left, right) is merged at once.
    Offsetting each key by ``pair_id * n`` makes the concatenation of all left
    blocks one sorted array, so a single ``searchsorted`` counts, for every
    right element, the left elements of its own pair that are greater.
    """
    v = np.ascontiguousarray(values, dtype=np.int64)
    n = v.size
    if n < 2:
        return 0
    span = int(v.max()) + 1
    idx = np.arange(n, dtype=np.int64)
    total = 0
    width = 1
    while width < n:
        pair = idx // (2 * width)
        is_left = (idx // width) % 2 == 0
        key = pair * span + v
        left = key[is_left]  # sorted: blocks are sorted and pair offsets increase
        right_key = key[~is_left]
        right_pair = pair[~is_left]
        # End of each pair's left block inside ``left``.
        left_end = np.searchsorted(left, (right_pair + 1) * span, side="left")
        total += int(np.sum(left_end - np.searchsorted(left, right_key, side="right")))
        v = np.sort(key, kind="stable") - pair * span
        width *= 2
    return total


def kendall_tau(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's τ-b between two samples, in O(n log² n).

    Parameters
    ----------
    x, y : array_like of float, shape (n,)
        Paired observations (e.g. predicted and observed mean length per prompt).

    Returns
    -------
    float
        τ-b in [-1, 1], ties handled as in Kendall (1945); NaN when ``n < 2``
        or either sample is constant (τ is undefined).

    Notes
    -----
    Knight's algorithm (J. Amer. Statist. Assoc. 61, 1966): sort by (x, y);
    discordant pairs are then the strict inversions of the y sequence, and
    ties in x, in y and in both are counted from run lengths.
    """
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.size != y.size:
        raise ValueError(f"kendall_tau needs samples of equal length, got {x.size} and {y.size}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = x.size
    if n < 2:
        return math.nan
    rx, ry = _dense_ranks(x), _dense_ranks(y)
    order = np.lexsort((ry, rx))
    rx, ry = rx[order], ry[order]
    n0 = n * (n - 1) // 2
    n1 = _tied_pairs(rx)
    n2 = _tied_pairs(ry)
    joint = _dense_ranks(rx * (int(ry.max()) + 1) + ry)
    n3 = _tied_pairs(joint)
    discordant = count_inversions(ry)
    denom = math.sqrt(float(n0 - n1) * float(n0 - n2))
    if denom == 0.0:
        return math.nan
    # Concordant - discordant = (pairs untied in both) - 2 * discordant.
    return float((n0 - n1 - n2 + n3 - 2 * discordant) / denom)


def mean_absolute_error(predicted: np.ndarray, observed: np.ndarray) -> float:
    """Mean of ``|predicted - observed|`` over finite pairs; NaN when there are none."""
    p = np.asarray(predicted, dtype=np.float64).reshape(-1)
    o = np.asarray(observed, dtype=np.float64).reshape(-1)
    keep = np.isfinite(p) & np.isfinite(o)
    if not keep.any():
        return math.nan
    return float(np.mean(np.abs(p[keep] - o[keep])))
