"""Minibatch boundaries over length-sorted prompts (the padding bubble).

A worker returns a generation minibatch only when its longest response is
done, so every sequence in it costs as much as the longest. Grouping prompts of
similar predicted length, and letting minibatch sizes flex by a small slack so
that boundaries can fall at jumps in length, minimises that padding.
"""

from __future__ import annotations

import numbers

import numpy as np

from aspc.errors import ConfigError, InputError
from aspc.partition.kernel import _partition_kernel

__all__ = ["partition", "padded_cost"]


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an integer, got {value!r}; pass a whole number")
    return int(value)


def _check_lengths(lengths: object) -> np.ndarray:
    try:
        arr = np.ascontiguousarray(lengths, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"lengths must be real numbers ({exc}); pass a 1-D numeric array") from None
    if arr.ndim != 1:
        raise InputError(f"lengths must be 1-D, got shape {arr.shape}; pass one length per prompt")
    if arr.size == 0:
        raise InputError("lengths is empty; pass at least one prompt length")
    if not np.all(np.isfinite(arr)):
        raise InputError("lengths contain NaN or infinity; fix or drop those predictions")
    if arr.min() < 0:
        raise InputError("lengths contain negative values; response lengths must be >= 0")
    if np.any(arr[1:] < arr[:-1]):
        raise InputError("lengths are not sorted; sort them ascending (np.sort) before partition")
    return arr


def padded_cost(sorted_lengths: np.ndarray, boundaries: np.ndarray) -> float:
    """Padded tokens ``sum_k |b_k| * max(b_k)`` of a partition of sorted lengths.

    Parameters
    ----------
    sorted_lengths : array_like of float, shape (n,)
        Non-decreasing lengths, as given to :func:`partition`.
    boundaries : array_like of int, shape (M + 1,)
        Boundaries as returned by :func:`partition`.

    Returns
    -------
    float
        The objective :func:`partition` minimises (one sample per prompt).
    """
    a = np.asarray(sorted_lengths, dtype=np.float64)
    b = np.asarray(boundaries, dtype=np.int64)
    return float(np.sum(np.diff(b) * a[b[1:] - 1]))


def partition(sorted_lengths: np.ndarray, batch_size: int, slack: int) -> np.ndarray:
    """Choose minibatch boundaries over sorted lengths that minimise padding.

    Parameters
    ----------
    sorted_lengths : array_like of real, shape (n,)
        Predicted response lengths, non-decreasing, finite, ``>= 0``. Converted
        to float64.
    batch_size : int
        Nominal minibatch size ``B >= 1`` (prompts per minibatch).
    slack : int
        Allowed deviation ``0 <= delta < B``: sizes lie in ``[B - delta, B + delta]``.

    Returns
    -------
    numpy.ndarray of int64, shape (M + 1,)
        Boundaries ``0 = b_0 < b_1 < ... < b_M = n``; minibatch ``k`` holds
        rows ``[b_k, b_{k+1})``.

    Raises
    ------
    InputError
        If the lengths are empty, not 1-D, not finite, negative or unsorted.
    ConfigError
        If ``batch_size < 1`` or ``slack`` is outside ``[0, batch_size)``.

    Notes
    -----
    Minimises the padded tokens ``sum_k |b_k| * max(b_k)``; because the input
    is sorted, ``max(b_k)`` is the minibatch's last length. The compile layer
    multiplies by samples per prompt, a constant factor that leaves the
    argmin unchanged.

    Size rule. Every minibatch has a size in the band ``[B - delta, B + delta]``
    whenever ``n`` can be written as such a sum. Only when it cannot (for
    example ``delta = 0`` and ``B`` does not divide ``n``, or ``n < B - delta``)
    exactly one *remainder* minibatch of size ``1 .. B - delta - 1`` is allowed,
    anywhere in the order; the DP places it where it costs least. Such an
    ``n`` always has a solution with one remainder, so the function is total.
    ``n < B - delta`` gives a single minibatch of all ``n`` prompts.

    Ties. Among boundary sets of equal padded cost (float64, compared
    exactly) the one with the least total deviation ``sum_k |size_k - B|``
    wins (a remainder of size ``r`` counts ``B - r``), so equal lengths give
    minibatches of size ``B`` where possible. Remaining ties go to the
    smallest last minibatch, then the smallest one before it, and so on
    (the size sequence read from the end, lexicographically smallest).

    A dynamic program over prefixes, ``O(n (2 delta + 1))`` time; the
    remainder table is built only when the band alone cannot reach ``n``
    (``O(n (B + delta))``). Partition DP for padding-minimal batching follows
    the ASP preprint (Chikhi et al., arXiv 2611.08864), where minibatch sizes
    may vary by a slack so boundaries fall at jumps in predicted length.
    """
    b = _check_int("batch_size", batch_size)
    d = _check_int("slack", slack)
    if b < 1:
        raise ConfigError(f"batch_size must be >= 1, got {b}; use --batch-size 1 or more")
    if not 0 <= d < b:
        raise ConfigError(f"slack must be in [0, batch_size), got {d} with batch_size {b}; lower --slack")
    arr = _check_lengths(sorted_lengths)

    boundaries, used_remainder = _partition_kernel(arr, b, b - d, b + d)

    sizes = np.diff(boundaries)
    off_band = int(np.count_nonzero((sizes < b - d) | (sizes > b + d)))
    if (
        boundaries[0] != 0
        or boundaries[-1] != arr.size
        or sizes.min() < 1
        or off_band > int(used_remainder)
        or (used_remainder and sizes.min() >= b - d)
    ):
        raise AssertionError("partition kernel broke its size invariants; please report this bug")
    return boundaries
