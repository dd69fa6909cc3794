"""Floating-point functions whose bits do not depend on the machine they run on.

A plan must be byte-identical for the same input and seed on every machine
(a plan compiled on a laptop is checked in CI, ``--resume`` recompiles epoch
plans on whichever node resumes). NumPy breaks that in two places:

- ``np.exp``, ``np.log``, ``np.log1p``, ``np.log2``, ``np.expm1`` and
  ``np.power`` dispatch to SIMD code chosen by the CPU (AVX-512 builds differ
  from the C library in the last bit for 0.1-5% of inputs; with
  ``NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL"`` the same machine agrees
  with the C library again);
- ``np.dot`` and ``@`` call BLAS, whose kernel (and so its order of
  additions) depends on the CPU and the thread count.

These wrappers call the C math library element by element (Numba loops, see
:mod:`aspc.portable_math_kernel`) and sum in one fixed order. ``np.sqrt``
and plain arithmetic are the same everywhere and stay NumPy. ``np.sum`` and
``np.mean`` add in NumPy's pairwise order, which NumPy before 2.3 applies to
8,192-element buffers one after another and NumPy 2.3 on to the whole array: past
8,192 elements the two differ in the last bit. The ridge solver's reductions
go through :func:`dot` (one fixed order of its own), and the long sums, means
and variances of training and of plans (calibration level and bins, history
weights, epoch growth, plan metrics, the partition's scale) through
:func:`sum`, :func:`mean` and :func:`var`, NumPy 2.3's pairwise order on any
NumPy. Sums of integers (token counts) and of booleans are exact in any
order and stay NumPy. Code on the compile path (predictions,
costs, partition, ordering, plan metrics) uses these, never the NumPy ones;
``tests/test_portable_math.py`` checks both the functions and that rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["dot", "exp", "expm1", "log", "log1p", "log2", "matvec", "mean", "sum", "var"]


def _elementwise(name: str) -> Callable[[Any], Any]:
    def apply(x: Any) -> Any:
        from aspc import portable_math_kernel as K

        a = np.asarray(x, dtype=np.float64)
        flat = np.ascontiguousarray(a).reshape(-1)
        out = np.empty(flat.size, dtype=np.float64)
        if name in ("log", "log2"):
            K.log_into(flat, out, name == "log2")
        else:
            getattr(K, f"{name}_into")(flat, out)
        out = out.reshape(a.shape)
        return out[()] if out.ndim == 0 else out

    apply.__name__ = name
    apply.__doc__ = f"``np.{name}`` with the C library's bits (float64; a scalar for a scalar)."
    return apply


exp = _elementwise("exp")
expm1 = _elementwise("expm1")
log = _elementwise("log")
log1p = _elementwise("log1p")
log2 = _elementwise("log2")


def dot(a: Any, b: Any) -> float:
    """``a . b`` of two 1-D arrays in one fixed order of additions (the same bits on every machine).

    Eight partial sums, lane ``j`` taking the products ``j, j + 8, ...`` left
    to right, then ``((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))``
    (:func:`aspc.portable_math_kernel.dot_kernel`). ``np.sum(x * y)`` was
    used before: its pairwise order follows NumPy's SIMD loops, so a ridge fit
    (a trained predictor, an epoch's plan) differed in the last bits between
    NumPy 1.26 and 2.x, and on NumPy 1.x between CPUs.
    """
    from aspc.portable_math_kernel import dot_kernel

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"dot takes two 1-D arrays of one length, got shapes {x.shape} and {y.shape}")
    return float(dot_kernel(np.ascontiguousarray(x), np.ascontiguousarray(y)))


def _vector(a: Any, name: str) -> np.ndarray:
    x = np.asarray(a, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{name} takes a 1-D array, got shape {x.shape}")
    return np.ascontiguousarray(x)


def sum(a: Any) -> float:  # shadows the builtin on purpose: pm.sum mirrors np.sum
    """``np.sum`` of a 1-D array with NumPy 2.3's bits on any NumPy (0.0 for an empty one).

    NumPy's pairwise summation, step for step
    (:func:`aspc.portable_math_kernel.pairwise_sum`), over the whole array:
    NumPy 2.3 on sums a contiguous array so; NumPy 1.x to 2.2 add 8,192-element
    buffers' pairwise sums one after another. So sums NumPy 2.3+ computed
    before (stored plan metrics, a trained predictor) keep their bits.
    """
    from aspc.portable_math_kernel import pairwise_sum

    x = _vector(a, "sum")
    return 0.0 + float(pairwise_sum(x, 0, x.size))  # NumPy starts from 0.0: -0.0 sums to 0.0


def mean(a: Any) -> float:
    """``np.mean`` of a 1-D array (:func:`sum` over the length; NaN for an empty one, as NumPy gives)."""
    x = _vector(a, "mean")
    return sum(x) / x.size if x.size else float("nan")


def var(a: Any, ddof: int = 0) -> float:
    """``np.var(a, ddof=ddof)`` of a 1-D array, as NumPy computes it: squared deviations from :func:`mean`, summed."""
    x = _vector(a, "var")
    if x.size - ddof <= 0:
        return float("nan")
    d = x - mean(x)
    return sum(d * d) / (x.size - ddof)


def matvec(m: Any, v: Any) -> np.ndarray:
    """``m @ v`` for a 2-D ``m``, each row summed left to right in float64 (no BLAS).

    A float32 ``m`` is read as it is (each entry widened exactly), so a large
    float32 table is not copied to float64 first.
    """
    from aspc.portable_math_kernel import matvec_into

    a = np.asarray(m)
    a = a if a.dtype in (np.float32, np.float64) else a.astype(np.float64)
    x = np.ascontiguousarray(v, dtype=np.float64)
    if a.ndim != 2 or x.ndim != 1 or a.shape[1] != x.shape[0]:
        raise ValueError(f"matvec takes an (n, k) matrix and a k-vector, got shapes {a.shape} and {x.shape}")
    out = np.empty(a.shape[0], dtype=np.float64)
    matvec_into(a, x, out)
    return out
