"""Turn a predicted log length into a mean and q10/q50/q90 from out-of-fold residuals.

A point model predicts ``y_hat``, the log of a prompt's mean response length.
The spread of one sampled response around it is taken from residuals that
the model did not see in training (out-of-fold), so the interval is honest
rather than as narrow as the training fit. Residuals are binned by ``y_hat``
(long prompts spread differently from short ones) and the per-bin offsets are
interpolated between bin centres, so the quantiles vary smoothly with the
prediction; they are kept non-decreasing in the prediction, so the mean and
every quantile rank prompts the same way the point model does.

Notes
-----
This is split-conformal style calibration of a quantile band with
conditioning on the predicted value (Lei et al. 2018, "Distribution-free
predictive inference for regression", section 2.2), with the mean recovered by
Duan's (1983) smearing estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aspc.predict.base import LengthPrediction

QUANTILES = (0.1, 0.5, 0.9)


@dataclass
class Calibration:
    """Per-bin residual offsets in log space."""

    centers: np.ndarray  # (B,) float64, ascending: median y_hat of each bin
    offsets: np.ndarray  # (B, 3) float64, log-quantile offsets of one response for q10, q50, q90
    smear: np.ndarray  # (B,) float64, log of E[mean length / exp(y_hat)] in each bin

    @classmethod
    def fit(cls, y_hat: np.ndarray, lengths: Sequence[np.ndarray], n_bins: int = 8) -> Calibration:
        """Fit from out-of-fold predictions ``y_hat`` and each prompt's observed lengths."""
        y_hat = np.asarray(y_hat, dtype=np.float64)
        n_bins = int(max(1, min(n_bins, len(y_hat) // 50)))
        edges = np.quantile(y_hat, np.linspace(0, 1, n_bins + 1)[1:-1])
        bin_of = np.searchsorted(edges, y_hat, side="right")
        counts = np.fromiter((len(a) for a in lengths), dtype=np.int64, count=len(lengths))
        flat = np.log(np.maximum(np.concatenate(lengths), 1.0))
        sample_resid = flat - np.repeat(y_hat, counts)
        sample_bin = np.repeat(bin_of, counts)
        mean_ratio = np.array([np.mean(a) for a in lengths]) / np.exp(y_hat)
        centers = np.empty(n_bins)
        offsets = np.empty((n_bins, 3))
        smear = np.empty(n_bins)
        for b in range(n_bins):
            in_bin = bin_of == b
            centers[b] = np.median(y_hat[in_bin])
            offsets[b] = np.quantile(sample_resid[sample_bin == b], QUANTILES)
            smear[b] = np.log(max(float(np.mean(mean_ratio[in_bin])), 1e-6))
        # Make y_hat + offset non-decreasing across bins, so that the mean and every quantile
        # rank prompts exactly as y_hat does; a bin with odd residuals must not reorder prompts.
        offsets = np.maximum.accumulate(offsets + centers[:, None], axis=0) - centers[:, None]
        smear = np.maximum.accumulate(smear + centers) - centers
        return cls(centers, offsets, smear)

    def apply(self, y_hat: np.ndarray) -> LengthPrediction:
        """Mean and quantiles (tokens) for predicted log lengths ``y_hat``."""
        y_hat = np.asarray(y_hat, dtype=np.float64)
        q = np.stack([y_hat + np.interp(y_hat, self.centers, self.offsets[:, k]) for k in range(3)], axis=1)
        # Interpolation keeps each column's order only bin-wise; enforce q10 <= q50 <= q90.
        q = np.maximum.accumulate(q, axis=1)
        mean = np.exp(y_hat + np.interp(y_hat, self.centers, self.smear))
        qt = np.exp(q)
        return LengthPrediction(mean, qt[:, 0], qt[:, 1], qt[:, 2])

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        return {
            f"{prefix}centers": self.centers,
            f"{prefix}offsets": self.offsets,
            f"{prefix}smear": self.smear,
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], prefix: str) -> Calibration:
        return cls(
            np.asarray(arrays[f"{prefix}centers"], dtype=np.float64),
            np.asarray(arrays[f"{prefix}offsets"], dtype=np.float64),
            np.asarray(arrays[f"{prefix}smear"], dtype=np.float64),
        )


def estimate_history_prior(
    y_hat: np.ndarray, lengths: Sequence[np.ndarray], default_kappa: float
) -> dict[str, float]:
    """Shrinkage constant and within-prompt spread for history blending.

    With log lengths ``log l = theta + eps`` (``Var eps = s_w**2``) and a base
    prediction ``y_hat = theta + eta`` (``Var eta = s_b**2``), the best weight of
    the mean of ``k`` observations is ``k / (k + kappa)`` with
    ``kappa = s_w**2 / s_b**2``. Both variances are estimated from
    out-of-fold residuals and the spread of each prompt's own samples.

    Returns
    -------
    dict
        ``history_kappa`` (``default_kappa`` when no prompt has two
        observations to measure ``s_w``) and ``history_within_log_var``
        (``s_w**2``, or ``None`` when unmeasurable).
    """
    logs = [np.log(np.maximum(np.asarray(a, dtype=np.float64), 1.0)) for a in lengths]
    multi = [a for a in logs if len(a) >= 2]
    if not multi:
        return {"history_kappa": default_kappa, "history_within_log_var": None}
    s_w = float(np.mean([np.var(a, ddof=1) for a in multi]))
    k = np.array([len(a) for a in logs], dtype=np.float64)
    level = np.array([np.log(max(float(np.mean(a)), 1.0)) for a in lengths])
    # The observed level is itself noisy by s_w / k; remove that from the residual variance.
    s_b = float(np.mean((level - y_hat) ** 2 - s_w / k))
    kappa = default_kappa if s_b <= 1e-6 else float(np.clip(s_w / s_b, 0.01, 100.0))
    return {"history_kappa": kappa, "history_within_log_var": s_w}
