"""Numba loops over the C library's ``exp``/``log`` family (no validation here; see aspc.portable_math).

Numba lowers ``math.exp`` and friends to calls into the process's C math
library, the same functions ``math.exp`` calls in plain Python, so these
loops give the same bits as Python's ``math`` module, with or without
``NUMBA_DISABLE_JIT``. The branches give NumPy's results where ``math``
would raise instead (log of zero or a negative number, exp overflow).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from aspc.numba_config import NJIT_FLAGS

# math.exp overflows (raises, in plain Python) above log(max float64).
_EXP_MAX = 709.782712893384


@njit(**NJIT_FLAGS)
def exp_into(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.size):
        v = x[i]
        out[i] = math.inf if v > _EXP_MAX else math.exp(v)


@njit(**NJIT_FLAGS)
def expm1_into(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.size):
        v = x[i]
        out[i] = math.inf if v > _EXP_MAX else math.expm1(v)


@njit(**NJIT_FLAGS)
def log_into(x: np.ndarray, out: np.ndarray, base2: bool) -> None:
    for i in range(x.size):
        v = x[i]
        if v > 0.0:
            out[i] = math.log2(v) if base2 else math.log(v)
        elif v == 0.0:
            out[i] = -math.inf
        else:
            out[i] = math.nan


@njit(**NJIT_FLAGS)
def log1p_into(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.size):
        v = x[i]
        if v > -1.0:
            out[i] = math.log1p(v)
        elif v == -1.0:
            out[i] = -math.inf
        else:
            out[i] = math.nan


@njit(**NJIT_FLAGS)
def matvec_into(m: np.ndarray, v: np.ndarray, out: np.ndarray) -> None:
    # Column by column, left to right: one fixed order of additions per row.
    for i in range(m.shape[0]):
        s = 0.0
        for j in range(m.shape[1]):
            s += m[i, j] * v[j]
        out[i] = s


LANES = 8  # dot_kernel's partial sums (aspc.portable_math.dot's documented order)


@njit(**NJIT_FLAGS)
def dot_kernel(x: np.ndarray, y: np.ndarray) -> float:
    # LANES partial sums (lane j takes the products i = j, j + LANES, ... in order), then added as
    # ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)). Without fastmath LLVM keeps this order, so
    # the bits depend on neither the CPU nor the NumPy version (np.sum's order depends on both).
    s = np.zeros(LANES)
    n = x.size
    for i in range(n):
        s[i % LANES] += x[i] * y[i]
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))


PAIRWISE_BLOCK = 128  # NumPy's PW_BLOCKSIZE: below it, eight running sums; above, split in two


@njit(**NJIT_FLAGS)
def pairwise_sum(x: np.ndarray, lo: int, n: int) -> float:
    # NumPy's pairwise summation of x[lo:lo + n], step for step (numpy/_core/src/umath/loops_utils.h.src),
    # without the split of a reduction into 8,192-element buffers that NumPy made before 2.3: np.sum's bits
    # on NumPy >= 2.3 for any length, and on older NumPy up to 8,192 elements.
    if n < 8:
        res = 0.0
        for i in range(n):
            res += x[lo + i]
        return res
    if n <= PAIRWISE_BLOCK:
        r0, r1, r2, r3 = x[lo], x[lo + 1], x[lo + 2], x[lo + 3]
        r4, r5, r6, r7 = x[lo + 4], x[lo + 5], x[lo + 6], x[lo + 7]
        i = 8
        while i < n - n % 8:
            j = lo + i
            r0 += x[j]
            r1 += x[j + 1]
            r2 += x[j + 2]
            r3 += x[j + 3]
            r4 += x[j + 4]
            r5 += x[j + 5]
            r6 += x[j + 6]
            r7 += x[j + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res += x[lo + i]
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return pairwise_sum(x, lo, n2) + pairwise_sum(x, lo + n2, n - n2)
