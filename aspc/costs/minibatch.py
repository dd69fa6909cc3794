"""Checked wrapper of the minibatch cost kernels: validates boundaries and quantiles, picks the model.

:mod:`aspc.costs.kernel` holds the Numba kernels; callers use :mod:`aspc.costs`.
"""


from __future__ import annotations

import numpy as np

from aspc import portable_math as pm
from aspc.choices import MINIBATCH_COSTS
from aspc.costs.kernel import Z90, _expected_max_costs, _padded_costs
from aspc.errors import ConfigError


def minibatch_costs(
    model: str,
    starts: np.ndarray,
    n_samples: np.ndarray,
    mean: np.ndarray,
    q10: np.ndarray | None = None,
    q50: np.ndarray | None = None,
    q90: np.ndarray | None = None,
    cap: float | None = None,
) -> np.ndarray:
    """Predicted cost (token-slots) of each minibatch.

    Parameters
    ----------
    model
        ``"padded"``: sequences x max predicted mean; ``"expected-max"``:
        sequences x expected maximum sampled length.
    starts
        Minibatch boundaries over the rows (length M+1, first 0, last n).
    n_samples
        Sequences generated per prompt (rows).
    mean, q10, q50, q90
        Per-row predicted mean and quantiles in tokens.
    cap
        Longest response the trainer generates (tokens); ``None``: no cap.
        Each length counts as ``min(length, cap)``.

    Returns
    -------
    numpy.ndarray
        float64 costs, one per minibatch.
    """
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    nseq = np.ascontiguousarray(n_samples, dtype=np.float64)
    mean = np.ascontiguousarray(mean, dtype=np.float64)
    if starts.ndim != 1 or starts.size < 2 or starts[0] != 0 or starts[-1] != mean.size:
        raise ConfigError("minibatch boundaries must start at 0 and end at the number of rows")
    if np.any(np.diff(starts) <= 0):
        raise ConfigError("minibatch boundaries must be strictly increasing (no empty minibatch)")
    # The kernels index every per-row array by row without bounds checks: a short one is read past its end.
    rows = mean.size
    if nseq.shape != (rows,):
        raise ConfigError(f"n_samples must hold one count per row ({rows} rows), got shape {nseq.shape}")
    if cap is not None:
        if not cap > 0:
            raise ConfigError(f"response cap must be > 0 tokens, got {cap!r}")
        mean = np.minimum(mean, float(cap))
    if model == "padded":
        return _padded_costs(mean, nseq, starts)
    if model == "expected-max":
        if q10 is None or q50 is None or q90 is None:
            raise ConfigError("cost model expected-max needs q10, q50 and q90 predictions")
        for name, q in (("q10", q10), ("q50", q50), ("q90", q90)):
            if np.shape(q) != (rows,):
                raise ConfigError(f"{name} must hold one prediction per row ({rows} rows), got shape {np.shape(q)}")
        q10 = np.maximum(np.asarray(q10, dtype=np.float64), 0.0)
        q50 = np.maximum(np.asarray(q50, dtype=np.float64), 1e-9)
        q90 = np.maximum(np.asarray(q90, dtype=np.float64), q50)
        spread = pm.log(np.maximum(q90, 1e-9)) - pm.log(np.maximum(q10, 1e-9))
        # A prompt whose quantiles coincide is a point mass at its mean.
        sigma = np.where((q90 - q10) > 1e-9, np.clip(spread, 0.0, 20.0) / (2 * Z90), 0.0)
        mu = pm.log(q50)
        upper = np.inf if cap is None else float(cap)
        return _expected_max_costs(mu, np.ascontiguousarray(sigma), mean, nseq, starts, upper)
    raise ConfigError(f"unknown cost model {model!r}; use one of {', '.join(MINIBATCH_COSTS)}")
