"""How good a length prediction is: rank agreement, error, buckets, interval coverage.

The figures (same names everywhere: ``aspc predict eval``, training metadata,
benchmarks):

- ``kendall_tau``: Kendall tau-b between predicted mean and target (ties
  handled), O(n log n).
- ``spearman``: Spearman rho (Pearson correlation of average ranks).
- ``mae``: mean absolute error of the predicted mean, tokens.
- ``bucket_accuracy``: the target range is cut into 10 equal-frequency buckets
  at the target's deciles; the fraction of prompts whose prediction falls in
  the same bucket as their target.
- ``coverage_q10_q90``: the fraction of observed individual lengths that lie
  inside their prompt's predicted ``[q10, q90]`` (80% when calibrated).

The target of a prompt is the mean of its observed lengths. A figure that the
data cannot define is ``None`` (JSON ``null``), never a number that looks
measured: the rank figures on fewer than 2 prompts or on observed lengths
that are all equal, the bucket accuracy then or on fewer prompts than
buckets, every figure on none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from aspc.predict.base import LengthPrediction

METRIC_KEYS = ("kendall_tau", "spearman", "mae", "bucket_accuracy", "coverage_q10_q90", "n")
N_BUCKETS = 10  # bucket_accuracy's equal-frequency buckets


def _dense_rank(a: np.ndarray) -> np.ndarray:
    """0-based ranks where equal values share a rank and ranks have no gaps."""
    return np.unique(a, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _tied_pairs(a: np.ndarray) -> int:
    """Number of pairs ``i < j`` with ``a[i] == a[j]``."""
    counts = np.unique(a, return_counts=True)[1].astype(np.int64)
    return int((counts * (counts - 1) // 2).sum())


def _count_inversions(v: np.ndarray) -> int:
    """Pairs ``i < j`` with ``v[i] > v[j]`` (strictly), for non-negative integers.

    Bottom-up merge sort done a whole level at a time with NumPy: at width
    ``w`` every pair of adjacent sorted blocks is merged at once, and for each
    element of a right block ``searchsorted`` counts the larger elements of its
    left block. ``log2(n)`` levels of sorting: O(n log^2 n) with C loops,
    never O(n^2).
    """
    n = len(v)
    cur = np.asarray(v, dtype=np.int64).copy()
    span = int(cur.max()) + 1 if n else 1
    pos = np.arange(n, dtype=np.int64)
    total = 0
    width = 1
    while width < n:
        block = pos // width
        pair = block // 2
        right = (block & 1) == 1
        key = pair * span + cur
        # Left blocks are sorted and pairs ascend, so all left keys form one sorted array.
        left_keys = key[~right]
        rp = pair[right]
        end_of_pair = np.searchsorted(left_keys, (rp + 1) * span, side="left")
        not_greater = np.searchsorted(left_keys, key[right], side="right")
        total += int((end_of_pair - not_greater).sum())
        cur = np.sort(key, kind="stable") - pair * span
        width *= 2
    return total


def kendall_tau(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Kendall's tau-b of two equally long samples; 0.0 when either is constant.

    Notes
    -----
    Knight (1966), "A computer method for calculating Kendall's tau with
    ungrouped data", JASA 61(314): sort by ``(x, y)``, count the discordant
    pairs as inversions of ``y``, and correct for ties in ``x``, ``y`` and both.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("x and y must be 1-D arrays of the same length")
    n = len(x)
    if n < 2:
        return 0.0
    order = np.lexsort((y, x))
    xs, ys = x[order], y[order]
    total = n * (n - 1) // 2
    x_ties = _tied_pairs(xs)
    y_ties = _tied_pairs(ys)
    joint = _tied_pairs(_dense_rank(xs) * (n + 1) + _dense_rank(ys))
    discordant = _count_inversions(_dense_rank(ys))
    denom = np.sqrt(float(total - x_ties)) * np.sqrt(float(total - y_ties))
    if denom == 0:
        return 0.0
    return float((total - x_ties - y_ties + joint - 2 * discordant) / denom)


def average_ranks(a: Sequence[float] | np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks."""
    a = np.asarray(a, dtype=np.float64)
    uniq, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    mid = ends - (counts - 1) / 2.0
    return mid[inv.reshape(-1)]


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Spearman's rho (ties averaged); 0.0 when either sample is constant."""
    rx = average_ranks(x)
    ry = average_ranks(y)
    if len(rx) < 2:
        return 0.0
    rx -= rx.mean()
    ry -= ry.mean()
    denom = np.sqrt((rx**2).sum() * (ry**2).sum())
    return float((rx * ry).sum() / denom) if denom > 0 else 0.0


def bucket_accuracy(pred: np.ndarray, target: np.ndarray, n_buckets: int = 10) -> float:
    """Fraction of prompts whose prediction lies in the target's equal-frequency bucket."""
    edges = np.quantile(target, np.linspace(0, 1, n_buckets + 1)[1:-1])
    return float(
        np.mean(np.searchsorted(edges, pred, side="right") == np.searchsorted(edges, target, side="right"))
    )


def coverage(pred: LengthPrediction, lengths: Sequence[np.ndarray]) -> float:
    """Fraction of all observed lengths inside their prompt's ``[q10, q90]``."""
    counts = np.fromiter((len(a) for a in lengths), dtype=np.int64, count=len(lengths))
    flat = np.concatenate([np.asarray(a, dtype=np.float64) for a in lengths]) if len(lengths) else np.empty(0)
    lo = np.repeat(pred.q10, counts)
    hi = np.repeat(pred.q90, counts)
    return float(np.mean((flat >= lo) & (flat <= hi))) if len(flat) else 0.0


def targets_of(lengths: Sequence[np.ndarray]) -> np.ndarray:
    """The evaluation target of each prompt: the mean of its observed lengths."""
    return np.array([float(np.mean(a)) for a in lengths], dtype=np.float64)


def evaluate(pred: LengthPrediction, lengths: Sequence[np.ndarray]) -> dict[str, Any]:
    """All figures of ``pred`` against observed lengths (one array per prompt).

    Returns
    -------
    dict
        Keys :data:`METRIC_KEYS`.
    """
    if len(pred) != len(lengths):
        raise ValueError(f"{len(pred)} predictions but {len(lengths)} prompts with lengths")
    target = targets_of(lengths)
    n = len(target)
    # One prompt, or prompts whose observed lengths are all equal, have no order to agree with. (A
    # constant prediction against varied lengths keeps τ = 0: it ranks nothing, which is its figure.)
    ranked = n >= 2 and bool(np.ptp(target) > 0)
    return {
        "kendall_tau": kendall_tau(pred.mean, target) if ranked else None,
        "spearman": spearman(pred.mean, target) if ranked else None,
        "mae": float(np.mean(np.abs(pred.mean - target))) if n else None,
        "bucket_accuracy": bucket_accuracy(pred.mean, target, N_BUCKETS) if ranked and n >= N_BUCKETS else None,
        "coverage_q10_q90": coverage(pred, lengths) if n else None,
        "n": int(n),
    }


def mean_over(per: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Each figure of :data:`METRIC_KEYS` (but ``n``) averaged over ``per``'s entries that define it."""
    out: dict[str, float | None] = {}
    for k in METRIC_KEYS[:-1]:
        got = [m[k] for m in per.values() if m.get(k) is not None]
        out[k] = float(np.mean(got)) if got else None
    return out


def marginal_summary(lengths: Sequence[np.ndarray]) -> dict[str, float]:
    """What a no-information predictor knows: the marginal mean and quantiles of single lengths (and
    their range, which bounds how far predictions may stray: :func:`aspc.predict.ease.ease_lengths`)."""
    flat = np.concatenate([np.asarray(a, dtype=np.float64) for a in lengths])
    q10, q50, q90 = np.quantile(flat, [0.1, 0.5, 0.9])
    return {"mean": float(flat.mean()), "q10": float(q10), "q50": float(q50), "q90": float(q90),
            "min": float(flat.min()), "max": float(flat.max())}  # fmt: skip


def baseline_prediction(n: int, marginal: dict[str, float]) -> LengthPrediction:
    """The no-information baseline: every prompt gets the marginal mean and quantiles."""
    return LengthPrediction(
        np.full(n, marginal["mean"]),
        np.full(n, marginal["q10"]),
        np.full(n, marginal["q50"]),
        np.full(n, marginal["q90"]),
    )
