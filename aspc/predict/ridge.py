"""Ridge regression on hashed sparse features plus a few unpenalised dense ones.

Solved with NumPy only, and without BLAS or LAPACK: their kernels, and so
their rounding, depend on the CPU and the thread count, and the predictions
a fit makes end up in plans that must be byte-identical on every machine
(:mod:`aspc.portable_math`). The few dense columns are orthonormalised by
modified Gram-Schmidt in fixed order instead. The dense columns (intercept, length features) are
unpenalised and projected out exactly; the hashed part is solved by
preconditioned conjugate gradients on the projected normal equations. Each
iteration costs two sparse products, so a 2**18-column problem over thousands
of rows solves in seconds without SciPy or a dense Gram matrix. Projecting out
the intercept also centres the hashed columns implicitly, which removes the
one huge eigenvalue that shared n-grams ("the", " a ") would otherwise create
and keeps the iteration count low.

Notes
-----
Conjugate gradients with a Jacobi preconditioner: Hestenes & Stiefel (1952);
Golub & Van Loan, *Matrix Computations*, section 11.5. Eliminating the
unpenalised block is the Frisch–Waugh–Lovell theorem.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from aspc import portable_math as pm
from aspc.predict.features import Features

# A dense column whose norm, after removing the columns before it, is below this share of the
# largest column norm adds nothing to the span (constant or collinear length features).
_RANK_TOL = 1e-10


@dataclass
class RidgeSolution:
    """Weights of ``y ~ dense @ alpha + H @ beta``."""

    alpha: np.ndarray  # (N_DENSE,) float64, unpenalised dense coefficients
    beta: np.ndarray  # (n_hashed,) float64, hashed coefficients
    iterations: int  # conjugate-gradient iterations used

    def predict(self, X: Features) -> np.ndarray:
        return pm.matvec(X.dense, self.alpha) + X.hashed_matvec(self.beta)


def ridge_fit(
    X: Features,
    y: np.ndarray,
    lam: float,
    *,
    sample_weight: np.ndarray | None = None,
    offset: np.ndarray | None = None,
    beta0: np.ndarray | None = None,
    tol: float = 1e-4,
    max_iter: int = 300,
) -> RidgeSolution:
    """Minimise ``sum_i s_i (off_i + d_i.alpha + h_i.beta - y_i)**2 + lam * |beta|**2``.

    Parameters
    ----------
    X
        Features: dense part (unpenalised) and hashed part (penalised).
    y
        Targets, one per row.
    lam
        Ridge penalty on the hashed coefficients; must be positive.
    sample_weight
        Non-negative weight per row (``None``: all ones).
    offset
        A fixed per-row term added to the prediction (e.g. a shared model's
        score when fitting a per-target correction).
    beta0
        Warm start for the hashed coefficients.
    tol
        Relative residual of the projected normal equations at which to stop.
    max_iter
        Iteration cap; the solution so far is returned when reached.

    Returns
    -------
    RidgeSolution
    """
    if lam <= 0:
        raise ValueError("lam must be positive")
    y = np.asarray(y, dtype=np.float64)
    if offset is not None:
        y = y - offset
    s = np.ones_like(y) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    sw = np.sqrt(s)
    # Orthonormal basis of the span of the weighted dense columns (constant or collinear length
    # features are dropped); P(v) = v - Q Q^T v removes that span so alpha never enters the
    # iteration.
    dense_w = X.dense * sw[:, None]
    q, r, kept = _gram_schmidt(dense_w)

    def project(v: np.ndarray) -> np.ndarray:
        return v - pm.matvec(q, pm.matvec(q.T, v))

    def normal(beta: np.ndarray) -> np.ndarray:
        return X.hashed_rmatvec(sw * project(sw * X.hashed_matvec(beta))) + lam * beta

    yt = sw * y
    b = X.hashed_rmatvec(sw * project(yt))
    inv_diag = 1.0 / (X.hashed_sq_norms(s) + lam)

    beta = np.zeros(X.n_hashed) if beta0 is None else np.array(beta0, dtype=np.float64)
    res = b - normal(beta) if beta0 is not None else b.copy()
    z = inv_diag * res
    p = z.copy()
    rz = pm.dot(res, z)
    b_norm = math.sqrt(pm.dot(b, b)) or 1.0
    it = 0
    while it < max_iter and math.sqrt(pm.dot(res, res)) > tol * b_norm:
        qv = normal(p)
        step = rz / pm.dot(p, qv)
        beta += step * p
        res -= step * qv
        z = inv_diag * res
        rz_new = pm.dot(res, z)
        p = z + (rz_new / rz) * p
        rz = rz_new
        it += 1
    alpha = _least_squares(q, r, kept, dense_w.shape[1], yt - sw * X.hashed_matvec(beta))
    return RidgeSolution(alpha, beta, it)


def _gram_schmidt(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """``a[:, kept] = q @ r``: orthonormal ``q``, upper-triangular ``r``, columns that add to the span.

    Modified Gram-Schmidt, each column orthogonalised twice ("twice is
    enough": Giraud et al., Numer. Math. 2005), so ``q`` is orthonormal to
    working precision for the handful of dense columns here.
    """
    n, k = a.shape
    norms = [math.sqrt(pm.dot(a[:, j], a[:, j])) for j in range(k)]
    floor = _RANK_TOL * max(max(norms, default=0.0), 1e-300)
    qs: list[np.ndarray] = []
    r = np.zeros((k, k))
    kept: list[int] = []
    for j in range(k):
        v = np.array(a[:, j], dtype=np.float64)
        coef = np.zeros(len(qs))
        for _ in range(2):
            for i, qi in enumerate(qs):
                c = pm.dot(qi, v)
                coef[i] += c
                v -= c * qi
        norm = math.sqrt(pm.dot(v, v))
        if norm <= floor:
            continue
        r[: len(qs), len(kept)] = coef
        r[len(qs), len(kept)] = norm
        qs.append(v / norm)
        kept.append(j)
    q = np.stack(qs, axis=1) if qs else np.zeros((n, 0))
    return q, r[: len(kept), : len(kept)], kept


def _least_squares(q: np.ndarray, r: np.ndarray, kept: list[int], k: int, y: np.ndarray) -> np.ndarray:
    """Coefficients of the columns ``kept`` fitting ``y`` (back substitution on ``r``); the others 0."""
    rhs = pm.matvec(q.T, y)
    m = len(kept)
    x = np.zeros(m)
    for i in range(m - 1, -1, -1):
        s = rhs[i]
        for j in range(i + 1, m):
            s -= r[i, j] * x[j]
        x[i] = s / r[i, i]
    out = np.zeros(k)
    out[kept] = x
    return out


def target_levels(icpt: np.ndarray, rows: np.ndarray, target_of_row: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Per-target intercepts of a fit on ``rows``, then the pooled one (their mean, weighted like the fit).

    A target with no row among ``rows`` has no column in the fit (its intercept came out 0, a level of
    one token): it gets the pooled level instead, the prediction for a target the fit never saw.
    """
    share = np.bincount(target_of_row[rows], weights=weight[rows], minlength=len(icpt))
    pooled = pm.dot(share, icpt) / float(share.sum())
    return np.append(np.where(share > 0, icpt, pooled), pooled)
