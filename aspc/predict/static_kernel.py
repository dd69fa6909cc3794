"""Segmented mean of static token vectors: one Numba pass, no tokens x dim temporary.

A prompt's static embedding is the mean of its tokens' rows of the distilled
table. ``table[flat_ids]`` would materialise a (tokens, dim) float array
(hundreds of MB for 100,000 prompts) only to sum it again; the kernel reads
each token's row once and adds it into the prompt's accumulator. The checked
wrapper :func:`segmented_mean` validates the inputs; the kernel does not.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from aspc.numba_config import NJIT_FLAGS


# Serial: prediction averages one scalar per token (milliseconds per 100,000 prompts), training
# a few thousand prompts' 384-wide rows (~0.3 s); threads would not pay for themselves.
@njit(**NJIT_FLAGS)
def _segmented_mean_kernel(flat_ids, offsets, table, out):  # pragma: no cover - compiled
    dim = table.shape[1]
    for d in range(len(offsets) - 1):
        a, b = offsets[d], offsets[d + 1]
        acc = np.zeros(dim, dtype=np.float64)  # float64: the sum of 512 float32 rows keeps ~1e-7 relative
        for i in range(a, b):
            row = flat_ids[i]
            for j in range(dim):
                acc[j] += table[row, j]
        if b > a:
            inv = 1.0 / (b - a)
            for j in range(dim):
                out[d, j] = acc[j] * inv
        else:
            for j in range(dim):
                out[d, j] = 0.0


def segmented_mean(flat_ids: np.ndarray, offsets: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Mean of ``table`` rows per segment: ``out[d] = table[flat_ids[offsets[d]:offsets[d+1]]].mean(0)``.

    Parameters
    ----------
    flat_ids
        Row indices of all segments, one after the other (int, each in ``[0, len(table))``).
    offsets
        ``n + 1`` non-decreasing positions into ``flat_ids``, from 0 to ``len(flat_ids)``.
    table
        ``(rows, dim)`` float32 or float64 vectors.

    Returns
    -------
    numpy.ndarray
        ``(n, dim)`` of the table's dtype (sums in float64 either way); an empty segment
        (a prompt without tokens) gets zeros.

    Raises
    ------
    ValueError
        Malformed offsets, ids out of range, or a table that is not 2-D float.
    """
    table = np.asarray(table)
    if table.ndim != 2 or table.dtype not in (np.float32, np.float64):
        raise ValueError(f"table must be a 2-D float32/float64 array, got {table.dtype} {table.shape}")
    table = np.ascontiguousarray(table)
    flat_ids = np.ascontiguousarray(flat_ids, dtype=np.int64)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if flat_ids.ndim != 1 or offsets.ndim != 1 or len(offsets) == 0:
        raise ValueError("flat_ids and offsets must be 1-D, offsets with n + 1 >= 1 entries")
    if offsets[0] != 0 or offsets[-1] != len(flat_ids) or np.any(np.diff(offsets) < 0):
        raise ValueError("offsets must rise from 0 to len(flat_ids)")
    if len(flat_ids) and (int(flat_ids.min()) < 0 or int(flat_ids.max()) >= len(table)):
        raise ValueError(f"token ids must be in [0, {len(table)})")
    out = np.empty((len(offsets) - 1, table.shape[1]), dtype=table.dtype)
    _segmented_mean_kernel(flat_ids, offsets, table, out)
    return out
