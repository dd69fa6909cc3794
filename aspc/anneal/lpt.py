"""Longest-first dispatch on the upper quantile: so the run's last long chain starts early.

A static minibatch returns when its longest response ends. Whatever order
the trainer would like, the run ends when the last-started long minibatch
ends: with ``W`` workers, a minibatch that starts after ``w`` of the work
finishes no earlier than ``w / W`` plus its own time (list scheduling,
Graham 1969). Dispatching the minibatches most likely to hold the run's
longest responses first, and ending with the ones reliably short, is
longest-processing-time-first (LPT); with uncertain lengths the key is an
upper quantile of each minibatch's longest response, not its mean, so that a
minibatch whose band admits a degenerate response is not the one left for
last.

Groups stay contiguous (the balanced groups of :func:`aspc.anneal.balance`
keep each trainer window's work equal when the trainer is the busy side):
groups go in descending order of their peak key, and each group's
minibatches in descending key. Equal keys keep the order of a tie rank
(a seeded permutation in the compiler), so where predictions carry no
information the order is the random order, never the input's.
"""

from __future__ import annotations

import numbers

import numpy as np

from aspc import portable_math as pm
from aspc.anneal.lpt_kernel import (
    _coarse_quantiles,
    _exp_bounds,
    _finish_quantiles,
    _lpt_group_order,
    _max_quantiles,
)
from aspc.errors import ConfigError, InputError

__all__ = ["UPPER_QUANTILE", "lpt_keys", "lpt_order", "max_quantiles"]

# The quantile of a minibatch's longest response that orders dispatch: high
# enough that a wide band (a possible degenerate response) counts, and still
# one the calibrated bands of a predictor describe (their q90).
UPPER_QUANTILE = 0.9
Z90 = 1.2815515655446004  # q90 = exp(mu + Z90 * sigma) for a lognormal


def _floats(name: str, values: object, n: int) -> np.ndarray:
    try:
        arr = np.ascontiguousarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be real numbers ({exc}); pass one value per row") from None
    if arr.shape != (n,):
        raise InputError(f"{name} must have shape ({n},), got {arr.shape}; pass one value per row")
    if not np.all(np.isfinite(arr)) or (arr.size and arr.min() < 0):
        raise InputError(f"{name} must be finite and >= 0")
    return arr


def _lognormal_rows(starts, n_samples, mean, q10, q50, q90, q):
    """Checked kernel arguments of :func:`max_quantiles`: per-row log median, sigma, point mass, count; bounds; q."""
    b = np.ascontiguousarray(starts, dtype=np.int64)
    n = int(np.asarray(mean).shape[0]) if np.ndim(mean) == 1 else -1
    if n < 0:
        raise InputError("mean must be 1-D; pass one value per row")
    if b.ndim != 1 or b.size < 2 or b[0] != 0 or b[-1] != n or np.any(np.diff(b) <= 0):
        raise InputError("starts must be increasing minibatch boundaries from 0 to the number of rows")
    if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0.0 < float(q) < 1.0:
        raise ConfigError(f"quantile must be in (0, 1), got {q!r}")
    m_ = _floats("mean", mean, n)
    lo, med, hi = (_floats(k, v, n) for k, v in (("q10", q10), ("q50", q50), ("q90", q90)))
    nseq = _floats("n_samples", n_samples, n)
    med = np.maximum(med, 1e-9)
    hi = np.maximum(hi, med)
    spread = pm.log(np.maximum(hi, 1e-9)) - pm.log(np.maximum(lo, 1e-9))
    sigma = np.ascontiguousarray(np.where(hi - lo > 1e-9, np.clip(spread, 0.0, 20.0) / (2 * Z90), 0.0))
    return pm.log(med), sigma, m_, nseq, b, float(q)


def _checked(out: np.ndarray) -> np.ndarray:
    if not np.all(np.isfinite(out)) or np.any(out < 0):
        raise AssertionError("max_quantiles kernel returned a non-finite quantile; please report this bug")
    return out


def max_quantiles(
    starts: np.ndarray,
    n_samples: np.ndarray,
    mean: np.ndarray,
    q10: np.ndarray,
    q50: np.ndarray,
    q90: np.ndarray,
    q: float = UPPER_QUANTILE,
) -> np.ndarray:
    """The ``q``-quantile of each minibatch's longest sampled response, in tokens.

    Parameters
    ----------
    starts : array_like of int, shape (M + 1,)
        Minibatch boundaries over the rows (first 0, last n, increasing).
    n_samples : array_like of int, shape (n,)
        Responses sampled per row (all count toward the maximum).
    mean, q10, q50, q90 : array_like of float, shape (n,)
        Per-row predicted mean and quantiles of one response's length.
    q : float
        The quantile, in (0, 1).

    Returns
    -------
    numpy.ndarray of float64, shape (M,)
        ``x`` with ``P(max <= x) = q`` where each row's lengths are lognormal
        from (q10, q50, q90), the same model as the ``expected-max`` cost; a
        row whose quantiles coincide is a point mass at its mean.
    """
    return _checked(_max_quantiles(*_lognormal_rows(starts, n_samples, mean, q10, q50, q90, q)))


def lpt_keys(
    starts: np.ndarray,
    n_samples: np.ndarray,
    mean: np.ndarray,
    q10: np.ndarray,
    q50: np.ndarray,
    q90: np.ndarray,
    q: float = UPPER_QUANTILE,
) -> np.ndarray:
    """Keys that every comparison sees as :func:`max_quantiles` (same arguments): what :func:`lpt_order` needs.

    Dispatch order compares keys and nothing else, so a minibatch whose
    quantile is known to lie in an interval no other minibatch's interval
    meets needs no more precision. Each minibatch's quantile is first located
    in a narrow interval: by Newton's method, confirmed by two of the
    bisection's own comparisons, or else by a first
    :data:`~aspc.anneal.lpt_kernel._COARSE_STEPS` bisection steps; the
    minibatches whose intervals meet another's (in tokens, end points
    included, so exact ties are found) run their bisection to the end and get
    :func:`max_quantiles`' exact value; the others get their interval's upper
    end. For any two minibatches ``a``, ``b``: ``key[a] < key[b]`` exactly
    when ``max_quantiles[a] < max_quantiles[b]``, and likewise ``==``, so
    :func:`lpt_order` gives the same order, and plans the same bytes, at a
    fraction of the evaluations (Newton takes ~5-10 where the bisection takes 60).
    """
    args = _lognormal_rows(starts, n_samples, mean, q10, q50, q90, q)
    m = args[4].size - 1
    lo, hi, blo, bhi = np.empty(m), np.empty(m), np.empty(m), np.empty(m)
    seen, exact, left = np.empty(m, dtype=np.int8), np.empty(m, dtype=np.int8), np.empty(m, dtype=np.int64)
    _coarse_quantiles(*args, lo, hi, seen, exact, blo, bhi, left)
    elo, ehi = _exp_bounds(blo, bhi, hi, exact)
    # Sweep the intervals by lower end: one meets an earlier one when its lower
    # end is <= the largest upper end so far; a run of such is a cluster.
    by_lo = np.argsort(elo, kind="stable")
    reach = np.maximum.accumulate(ehi[by_lo])
    meets_prev = np.r_[False, elo[by_lo][1:] <= reach[:-1]]
    cluster = np.cumsum(~meets_prev)
    shared = np.bincount(cluster)[cluster] > 1
    which = np.sort(by_lo[shared & (exact[by_lo] == 0)]).astype(np.int64)
    key = ehi.copy()
    if which.size:
        key[which] = _finish_quantiles(*args, lo, hi, seen, left, which)
    return _checked(key)


def lpt_order(key: np.ndarray, assignment: np.ndarray, n_groups: int, tie: np.ndarray | None = None) -> np.ndarray:
    """Dispatch order: groups by descending peak ``key``, minibatches in a group by descending ``key``.

    Parameters
    ----------
    key : array_like of float, shape (M,)
        Per minibatch, how long it may run (e.g. :func:`max_quantiles`), ``>= 0``.
    assignment : array_like of int, shape (M,)
        Group of each minibatch in ``[0, n_groups)``; every group non-empty.
    n_groups : int
        ``G >= 1``.
    tie : array_like of int, shape (M,), optional
        A permutation of ``0..M-1``: among equal keys the lower rank goes first
        (default: the minibatch index).

    Returns
    -------
    numpy.ndarray of int64, shape (M,)
        A permutation of ``0..M-1`` in which each group is contiguous.

    Notes
    -----
    LPT (Graham 1969) at group granularity. ``O(M log M)``.
    """
    k = np.ascontiguousarray(key, dtype=np.float64)
    if k.ndim != 1 or k.size == 0:
        raise InputError("key must be a non-empty 1-D array, one value per minibatch")
    if not np.all(np.isfinite(k)) or k.min() < 0:
        raise InputError("key must be finite and >= 0")
    if isinstance(n_groups, bool) or not isinstance(n_groups, numbers.Integral) or n_groups < 1:
        raise ConfigError(f"n_groups must be an integer >= 1, got {n_groups!r}")
    a = np.asarray(assignment)
    if a.shape != k.shape or a.dtype.kind not in "iu":
        raise InputError(f"assignment must be integers of shape {k.shape}, got {a.dtype} {a.shape}")
    a = np.ascontiguousarray(a, dtype=np.int64)
    if a.min() < 0 or a.max() >= n_groups or np.any(np.bincount(a, minlength=n_groups) == 0):
        raise InputError(f"assignment must use every group of 0..{n_groups - 1}; pass balance(...).assignment")
    m = k.size
    t = np.arange(m, dtype=np.int64) if tie is None else np.ascontiguousarray(tie, dtype=np.int64)
    if t.shape != (m,) or not np.array_equal(np.sort(t), np.arange(m)):
        raise InputError("tie must be a permutation of 0..M-1")
    order = _lpt_group_order(k, t, a, int(n_groups))
    if not np.array_equal(np.sort(order), np.arange(m)):
        raise AssertionError("lpt_order kernel lost or repeated a minibatch; please report this bug")
    return order
