"""Ridge regression on hashed sparse features plus a few unpenalised dense ones.

Solved with NumPy only. The dense columns (intercept, length features) are
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

from dataclasses import dataclass

import numpy as np

from aspc.predict.features import Features


@dataclass
class RidgeSolution:
    """Weights of ``y ~ dense @ alpha + H @ beta``."""

    alpha: np.ndarray  # (N_DENSE,) float64, unpenalised dense coefficients
    beta: np.ndarray  # (n_hashed,) float64, hashed coefficients
    iterations: int  # conjugate-gradient iterations used

    def predict(self, X: Features) -> np.ndarray:
        return X.dense @ self.alpha + X.hashed_matvec(self.beta)


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
    # Orthonormal basis of the span of the weighted dense columns (SVD, so that constant or
    # collinear length features are simply dropped); P(v) = v - Q Q^T v removes that span
    # so alpha never enters the iteration.
    dense_w = X.dense * sw[:, None]
    u, sv, _ = np.linalg.svd(dense_w, full_matrices=False)
    q = u[:, sv > 1e-10 * max(float(sv[0]) if len(sv) else 0.0, 1e-300)]

    def project(v: np.ndarray) -> np.ndarray:
        return v - q @ (q.T @ v)

    def normal(beta: np.ndarray) -> np.ndarray:
        return X.hashed_rmatvec(sw * project(sw * X.hashed_matvec(beta))) + lam * beta

    yt = sw * y
    b = X.hashed_rmatvec(sw * project(yt))
    inv_diag = 1.0 / (X.hashed_sq_norms(s) + lam)

    beta = np.zeros(X.n_hashed) if beta0 is None else np.array(beta0, dtype=np.float64)
    res = b - normal(beta) if beta0 is not None else b.copy()
    z = inv_diag * res
    p = z.copy()
    rz = float(res @ z)
    b_norm = float(np.linalg.norm(b)) or 1.0
    it = 0
    while it < max_iter and np.linalg.norm(res) > tol * b_norm:
        qv = normal(p)
        step = rz / float(p @ qv)
        beta += step * p
        res -= step * qv
        z = inv_diag * res
        rz_new = float(res @ z)
        p = z + (rz_new / rz) * p
        rz = rz_new
        it += 1
    alpha = np.linalg.lstsq(dense_w, yt - sw * X.hashed_matvec(beta), rcond=None)[0]
    return RidgeSolution(alpha, beta, it)
