"""Dispatch order of balanced groups, and the delivery-drift metric.

Dispatching minibatches sorted short-first delivers samples faster than work
early on and slower later: the trainer sees a flood, then a drought (the
sorting bubble). The order here keeps cumulative work close to the straight
line of cumulative samples, group by group.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from aspc.anneal.order_kernel import _order_kernel
from aspc.errors import ConfigError, InputError

__all__ = ["delivery_drift", "dispatch_order", "group_order"]


def _nonneg(name: str, values: object, length: int | None = None) -> np.ndarray:
    try:
        arr = np.ascontiguousarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be real numbers ({exc}); pass a 1-D numeric array") from None
    if arr.ndim != 1 or (length is not None and arr.size != length):
        want = "1-D" if length is None else f"shape ({length},)"
        raise InputError(f"{name} must be {want}, got shape {arr.shape}; pass one value per minibatch")
    if not np.all(np.isfinite(arr)) or (arr.size and arr.min() < 0):
        raise InputError(f"{name} must be finite and >= 0")
    return arr


def _shares(values: np.ndarray) -> np.ndarray:
    total = math.fsum(values)
    return values / total if total > 0 else np.zeros_like(values)


def delivery_drift(costs_in_dispatch_order: np.ndarray, sizes_in_dispatch_order: np.ndarray) -> float:
    """Largest gap between the cumulative work and sample curves of a dispatch order.

    Parameters
    ----------
    costs_in_dispatch_order : array_like of float, shape (M,)
        Predicted cost (work) of each minibatch, in dispatch order, ``>= 0``.
    sizes_in_dispatch_order : array_like of float, shape (M,)
        Sequences each minibatch delivers, in the same order, ``>= 0``.

    Returns
    -------
    float
        ``max_k |y_k - x_k|`` over ``k = 0..M``, where ``x_k`` is the fraction
        of all sequences and ``y_k`` the fraction of all work dispatched in the
        first ``k`` minibatches. ``0`` is a perfect straight line; sorted
        short-first orders score high. ``0.0`` when ``M == 0`` or either total
        is ``0`` (nothing to compare).

    Notes
    -----
    The sorting-bubble index of ASP (Chikhi et al., arXiv 2611.08864): the
    queue floods while samples run ahead of work and starves while they lag.
    This is the single definition; plan and run metrics import it.
    """
    costs = _nonneg("costs", costs_in_dispatch_order)
    sizes = _nonneg("sizes", sizes_in_dispatch_order, costs.size)
    if costs.size == 0 or math.fsum(costs) == 0 or math.fsum(sizes) == 0:
        return 0.0
    gap = np.cumsum(_shares(costs)) - np.cumsum(_shares(sizes))
    return float(np.max(np.abs(gap)))


def dispatch_order(costs: np.ndarray, sizes: np.ndarray, assignment: np.ndarray, n_groups: int) -> np.ndarray:
    """Order minibatches for dispatch: group by group, work tracking samples.

    Parameters
    ----------
    costs : array_like of float, shape (M,)
        Predicted cost (work) of each minibatch, ``>= 0``.
    sizes : array_like of float, shape (M,)
        Sequences each minibatch delivers, ``>= 0``.
    assignment : array_like of int, shape (M,)
        Group of each minibatch in ``[0, n_groups)``, e.g.
        ``balance(...).assignment``; every group must be non-empty.
    n_groups : int
        Number of groups ``G >= 1``.

    Returns
    -------
    numpy.ndarray of int64, shape (M,)
        Minibatch indices in dispatch order, a permutation of ``0..M-1`` in
        which each group's minibatches are contiguous. :func:`group_order`
        recovers the order of the groups.

    Notes
    -----
    Let ``e_i = cost_i / total cost - size_i / total size``: dispatching ``i``
    moves the work-minus-samples gap ``y - x`` of :func:`delivery_drift` by
    ``e_i``. Groups are ordered greedily by their summed ``e`` so the gap at
    each group's end is as small as possible; inside a group, each step takes
    the minibatch that leaves ``|y - x|`` smallest, so short and long
    minibatches interleave. Ties go to the larger ``e``; equal ``e`` are
    taken in their (value, index) sorted order, so the result is
    deterministic. ``O(M log M)``. The group-by-group dispatch is the ordering stage of ASP
    (Chikhi et al., arXiv 2611.08864).
    """
    cost = _nonneg("costs", costs)
    size = _nonneg("sizes", sizes, cost.size)
    if isinstance(n_groups, bool) or not isinstance(n_groups, numbers.Integral) or n_groups < 1:
        raise ConfigError(f"n_groups must be an integer >= 1, got {n_groups!r}")
    group = np.asarray(assignment)
    if group.shape != cost.shape or group.dtype.kind not in "iu":
        raise InputError(
            f"assignment must be integers of shape {cost.shape}, got {group.dtype} {group.shape}"
        )
    group = group.astype(np.int64)
    if cost.size == 0:
        raise InputError("no minibatches to order; pass at least one")
    if group.min() < 0 or group.max() >= n_groups:
        raise InputError(f"assignment values must lie in [0, {n_groups}); pass balance(...).assignment")
    counts = np.bincount(group, minlength=n_groups)
    if np.any(counts == 0):
        raise InputError(f"group {int(np.argmin(counts))} has no minibatch; every group must be non-empty")

    excess = _shares(cost) - _shares(size)
    idx = np.arange(cost.size)
    by_group = np.lexsort((idx, excess, group))
    group_excess = np.bincount(group, weights=excess, minlength=n_groups)
    group_ids = np.lexsort((np.arange(n_groups), group_excess))
    group_ptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    order = _order_kernel(
        np.ascontiguousarray(excess[by_group]),
        by_group.astype(np.int64),
        group_ptr,
        np.ascontiguousarray(group_excess[group_ids]),
        group_ids.astype(np.int64),
    )
    if not np.array_equal(np.sort(order), idx):
        raise AssertionError("dispatch_order kernel lost or repeated a minibatch; please report this bug")
    return order


def group_order(order: np.ndarray, assignment: np.ndarray) -> np.ndarray:
    """Groups in the order :func:`dispatch_order` sends them.

    Parameters
    ----------
    order : array_like of int, shape (M,)
        A dispatch order in which each group is contiguous.
    assignment : array_like of int, shape (M,)
        Group of each minibatch.

    Returns
    -------
    numpy.ndarray of int64
        Each group once, in dispatch order.
    """
    seq = np.asarray(assignment, dtype=np.int64)[np.asarray(order, dtype=np.int64)]
    starts = np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]])
    groups = seq[starts]
    if np.unique(groups).size != groups.size:
        raise InputError("order does not keep each group contiguous; pass dispatch_order(...)'s result")
    return groups
