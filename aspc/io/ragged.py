"""Ragged per-prompt lengths: one float64 value array plus segment offsets.

A million prompts with a few sampled lengths each stay two NumPy arrays
instead of a million small arrays; means and quantiles run as one kernel
over the segments (:mod:`aspc.io.ragged_kernel`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np


class RaggedLengths(Sequence):
    """Lengths of ``n`` prompts: segment ``i`` is ``values[offsets[i]:offsets[i + 1]]``.

    Behaves as a read-only sequence of float64 arrays (views), so code written
    for a list of per-prompt arrays keeps working.
    """

    __slots__ = ("offsets", "values")

    def __init__(self, values: np.ndarray, offsets: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=np.float64)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != values.size:
            raise ValueError("offsets must start at 0 and end at len(values)")
        if offsets.size > 1 and np.any(np.diff(offsets) < 1):
            raise ValueError("every segment needs at least one length")
        self.values = values  # float64, every length of every prompt, prompt by prompt
        self.offsets = offsets  # int64, n + 1 segment bounds, strictly increasing from 0

    @classmethod
    def from_arrays(cls, arrays: Iterable[np.ndarray]) -> RaggedLengths:
        arrays = [np.asarray(a, dtype=np.float64).ravel() for a in arrays]
        sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
        values = np.concatenate(arrays) if arrays else np.empty(0)
        return cls(values, np.r_[0, np.cumsum(sizes)])

    @classmethod
    def single(cls, values: np.ndarray) -> RaggedLengths:
        """One length per prompt."""
        values = np.asarray(values, dtype=np.float64)
        return cls(values, np.arange(values.size + 1, dtype=np.int64))

    def __len__(self) -> int:
        return self.offsets.size - 1

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...
    @overload
    def __getitem__(self, i: slice) -> list[np.ndarray]: ...
    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("segment index out of range")
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        v, o = self.values, self.offsets
        return (v[o[i] : o[i + 1]] for i in range(len(self)))

    def sizes(self) -> np.ndarray:
        """Number of lengths of each prompt (int64)."""
        return np.diff(self.offsets)

    def take(self, rows: np.ndarray) -> RaggedLengths:
        """The segments of ``rows``, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        sizes = self.sizes()[rows]
        starts = self.offsets[rows]
        offsets = np.r_[0, np.cumsum(sizes)].astype(np.int64)
        # Position of every output value in self.values: segment start + rank inside it.
        idx = np.repeat(starts - offsets[:-1], sizes) + np.arange(offsets[-1], dtype=np.int64)
        return RaggedLengths(self.values[idx], offsets)

    def head(self, k: int) -> RaggedLengths:
        """The first ``k >= 1`` lengths of every segment (all of a shorter one)."""
        if k < 1:
            raise ValueError("head needs k >= 1")
        sizes = np.minimum(self.sizes(), k)
        offsets = np.r_[0, np.cumsum(sizes)].astype(np.int64)
        idx = np.repeat(self.offsets[:-1] - offsets[:-1], sizes) + np.arange(offsets[-1], dtype=np.int64)
        return RaggedLengths(self.values[idx], offsets)

    def stats(self, quantiles: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
        """Mean and linear quantiles of every segment, bit-identical to NumPy per segment.

        Returns
        -------
        mean : ndarray, shape (n,)
            ``x.mean()`` of each segment.
        q : ndarray, shape (n, len(quantiles))
            ``np.quantile(x, quantiles)`` of each segment.
        """
        qs = np.asarray(quantiles, dtype=np.float64)
        if qs.ndim != 1 or not np.all((qs >= 0) & (qs <= 1)):  # NaN fails both comparisons: refused too
            raise ValueError("quantiles must be a 1-D list of values in [0, 1]")
        if len(self) == 0:
            return np.empty(0), np.empty((0, qs.size))
        if self.values.size == len(self):
            # One length per prompt: mean and every quantile are the value
            # itself (0.0 + x, as NumPy's sum starts from its identity; and a
            # length has no sign, see ragged_kernel).
            mean = 0.0 + self.values
            return mean, np.repeat(mean[:, None], qs.size, axis=1)
        from aspc.io.ragged_kernel import _segment_stats

        return _segment_stats(self.values, self.offsets, qs)
