"""Sparse products of the hashed feature matrix (COO), one Numba loop each.

The ridge solver multiplies by the hashed matrix and its transpose hundreds
of times; ``np.bincount`` with weights needs a gathered, multiplied temporary
of every entry per product, which made a 53k-row fit take minutes on a busy
2-core machine. These loops read each entry once and allocate only the output.
Entries are summed in storage order, so results are deterministic.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from aspc.numba_config import NJIT_FLAGS


@njit(**NJIT_FLAGS)
def _matvec(rows, cols, vals, beta, n_rows):  # pragma: no cover - compiled
    out = np.zeros(n_rows)
    for i in range(len(rows)):
        out[rows[i]] += vals[i] * beta[cols[i]]
    return out


@njit(**NJIT_FLAGS)
def _rmatvec(rows, cols, vals, r, n_cols):  # pragma: no cover - compiled
    out = np.zeros(n_cols)
    for i in range(len(rows)):
        out[cols[i]] += vals[i] * r[rows[i]]
    return out


def coo_matvec(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, x: np.ndarray, n_out: int) -> np.ndarray:
    """``A @ x`` for ``A[rows[i], cols[i]] += vals[i]`` with ``n_out`` rows (repeats add up)."""
    return _matvec(rows, cols, vals, np.ascontiguousarray(x, dtype=np.float64), n_out)


def coo_rmatvec(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, r: np.ndarray, n_out: int) -> np.ndarray:
    """``A.T @ r`` with ``n_out`` columns."""
    return _rmatvec(rows, cols, vals, np.ascontiguousarray(r, dtype=np.float64), n_out)


@njit(**NJIT_FLAGS)
def _counting_sort(keys, n_keys, order):  # pragma: no cover - compiled
    # ``order`` stably sorted by ``keys[order]`` (each below n_keys): one count, one scatter.
    start = np.zeros(n_keys + 1, dtype=np.int64)
    for j in range(order.size):
        start[keys[order[j]] + 1] += 1
    for k in range(n_keys):
        start[k + 1] += start[k]
    out = np.empty(order.size, dtype=np.int64)
    for j in range(order.size):
        k = keys[order[j]]
        out[start[k]] = order[j]
        start[k] += 1
    return out


@njit(**NJIT_FLAGS)
def _merge_entries(rows, cols, vals, n_rows, n_cols):  # pragma: no cover - compiled
    # Two stable counting sorts (by column, then by row) put the entries in (row, col) order with
    # repeats in storage order; each repeat is then added to 0.0 in that order, as np.bincount does.
    n = rows.size
    order = _counting_sort(rows, n_rows, _counting_sort(cols, n_cols, np.arange(n)))
    m = 0  # distinct (row, col) pairs: the outputs are allocated at their size
    for j in range(n):
        i, p = order[j], order[j - 1]
        if j == 0 or rows[i] != rows[p] or cols[i] != cols[p]:
            m += 1
    out_rows = np.empty(m, dtype=np.int64)
    out_cols = np.empty(m, dtype=np.int64)
    out_vals = np.empty(m)
    m = -1
    for j in range(n):
        i = order[j]
        if m < 0 or rows[i] != out_rows[m] or cols[i] != out_cols[m]:
            m += 1
            out_rows[m] = rows[i]
            out_cols[m] = cols[i]
            out_vals[m] = 0.0
        out_vals[m] += vals[i]
    return out_rows, out_cols, out_vals


def merge_entries(
    rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n_rows: int, n_cols: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The COO entries sorted by (row, col), repeats added up: ``np.unique`` of the keys and
    ``np.bincount`` of the values, bit for bit, in two linear passes instead of a sort."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    cols = np.ascontiguousarray(cols, dtype=np.int64)
    vals = np.ascontiguousarray(vals, dtype=np.float64)
    if rows.size and (rows.min() < 0 or rows.max() >= n_rows or cols.min() < 0 or cols.max() >= n_cols):
        raise ValueError(f"entries outside a {n_rows} x {n_cols} matrix")
    return _merge_entries(rows, cols, vals, int(n_rows), int(n_cols))
