"""Turn a predicted log length into a mean and q10/q50/q90 from out-of-fold residuals.

A point model predicts ``y_hat``, a score on the log scale of a prompt's
length. Calibration maps it to tokens in two steps, both fitted on
out-of-fold predictions (residuals the model did not see in training), so the
result is honest rather than as sharp as the training fit:

1. **Level**: ``z = a + b * y_hat``, least squares of each prompt's log mean
   length on ``y_hat``, with the slope kept in ``[MIN_SLOPE, 1.5]``. Out of
   fold, ridge scores on unfamiliar prompts are too spread out, and this
   shrinks them as much as the data says, but never to a constant.
2. **Spread of one sampled response**: residuals ``log(sample) - z`` are
   binned by ``y_hat``; each bin gives the 10/50/90% quantiles and a smearing
   term for the mean. The per-bin curves ``z + offset`` are then made
   *strictly* increasing in ``y_hat`` (each step rises by at least
   ``MIN_SLOPE * b`` per unit of ``y_hat``), interpolated between bin centres
   and continued with slope ``b`` outside them. Predictors pass their
   lengths through :func:`aspc.predict.ease.ease_lengths`, so a prompt far
   unlike the training ones (a 1 MB prompt, a model fitted on 4 KB ones) stays
   a plausible length.

Every output is therefore a strictly increasing function of ``y_hat``: the
calibrated predictions rank prompts exactly as the raw scores do (same
Kendall tau), and distinct scores stay distinct. An earlier version made the
curves only non-decreasing, and a bin whose residuals said "no information"
flattened whole regions: every GSM8K prompt got the same 373.6 tokens.

Notes
-----
Split-conformal style calibration of a quantile band with conditioning on the
predicted value (Lei et al. 2018, "Distribution-free predictive inference for
regression", section 2.2); linear recalibration of the level is Platt-style
scaling on the log scale; the mean comes from Duan's (1983) smearing estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aspc import portable_math as pm
from aspc.predict.base import LengthPrediction

QUANTILES = (0.1, 0.5, 0.9)
MIN_SLOPE = 0.2
"""Least slope of the level map, and least rise (as a share of it) of every calibrated curve:
keeps calibration strictly monotone, so it never collapses distinct prompts onto one value."""
MAX_SLOPE = 1.5


@dataclass
class Calibration:
    """Level map and per-bin curves, all in log tokens."""

    centers: np.ndarray  # (B,) float64, strictly ascending: median y_hat of each bin
    curves: np.ndarray  # (B, 4) float64, at each centre: log mean, log q10, log q50, log q90
    slope: float  # d(curve)/d(y_hat) outside the centres (the level map's slope b)

    @classmethod
    def fit(
        cls,
        y_hat: np.ndarray,
        lengths: Sequence[np.ndarray],
        n_bins: int = 8,
        band_scale: float = 1.0,
    ) -> Calibration:
        """Fit from out-of-fold scores ``y_hat`` and each prompt's observed lengths.

        ``band_scale`` widens (> 1) the q10/q90 offsets about the median, for
        callers that know their held-out residuals understate the error on
        new data.
        """
        y_hat = np.asarray(y_hat, dtype=np.float64)
        level = pm.log(np.maximum([float(np.mean(a)) for a in lengths], 1.0))
        a, b = _level_map(y_hat, level)
        z = a + b * y_hat
        n_bins = int(max(1, min(n_bins, len(y_hat) // 50)))
        edges = np.quantile(y_hat, np.linspace(0, 1, n_bins + 1)[1:-1])
        bin_of = np.searchsorted(edges, y_hat, side="right")
        counts = np.fromiter((len(x) for x in lengths), dtype=np.int64, count=len(lengths))
        flat = pm.log(np.maximum(np.concatenate(lengths), 1.0))
        sample_resid = flat - np.repeat(z, counts)
        sample_bin = np.repeat(bin_of, counts)
        mean_ratio = pm.exp(level - z)
        centers, curves = [], []
        for k in range(n_bins):
            in_bin = bin_of == k
            if not in_bin.any():
                continue
            c = float(np.median(y_hat[in_bin]))
            q = np.quantile(sample_resid[sample_bin == k], QUANTILES)
            q = q[1] + band_scale * (q - q[1])
            smear = pm.log(max(pm.mean(mean_ratio[in_bin]), 1e-6))
            zc = a + b * c
            centers.append(c)
            curves.append([zc + smear, zc + q[0], zc + q[1], zc + q[2]])
        centers_a, curves_a = _strictly_increasing(np.array(centers), np.array(curves), b)
        return cls(centers_a, curves_a, float(b))

    def apply(self, y_hat: np.ndarray) -> LengthPrediction:
        """Mean and quantiles (tokens) for scores ``y_hat``."""
        y_hat = np.asarray(y_hat, dtype=np.float64)
        c = self.centers
        lo, hi = c[0], c[-1]
        out = np.empty((len(y_hat), 4))
        for k in range(4):
            out[:, k] = np.interp(y_hat, c, self.curves[:, k])
        # Linear continuation outside the centres: np.interp would clamp, which is flat.
        out += (self.slope * (np.minimum(y_hat - lo, 0.0) + np.maximum(y_hat - hi, 0.0)))[:, None]
        # Columns rise with y_hat; q10 <= q50 <= q90 keeps that (a max of increasing curves).
        q = np.maximum.accumulate(out[:, 1:], axis=1)
        qt = pm.exp(q)
        return LengthPrediction(pm.exp(out[:, 0]), qt[:, 0], qt[:, 1], qt[:, 2])

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        return {
            f"{prefix}centers": self.centers,
            f"{prefix}curves": self.curves,
            f"{prefix}slope": np.array([self.slope]),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], prefix: str) -> Calibration:
        centers = np.asarray(arrays[f"{prefix}centers"], dtype=np.float64)
        curves = np.asarray(arrays[f"{prefix}curves"], dtype=np.float64)
        slopes = np.asarray(arrays[f"{prefix}slope"], dtype=np.float64).reshape(-1)
        slope = float(slopes[0]) if slopes.size == 1 else float("nan")  # an empty one raised IndexError
        if (
            centers.ndim != 1
            or len(centers) == 0
            or curves.shape != (len(centers), 4)
            or not np.all(np.isfinite(curves))
            or not np.all(np.isfinite(centers))
            or not np.all(np.diff(centers) > 0)
            or not 0 < slope < np.inf
        ):
            raise ValueError(f"calibration {prefix!r} is malformed")
        return cls(centers, curves, slope)


def balanced_band_scale(
    y_hat: np.ndarray,
    lengths: Sequence[np.ndarray],
    groups: np.ndarray,
    n_bins: int = 8,
    level: float = 0.8,
) -> float:
    """Band widening that makes the *group-balanced* out-of-fold coverage reach ``level``.

    With leave-one-source-out residuals, plain conformal calibration reaches
    ``level`` over all held-out rows, dominated by the largest sources. Here
    each source weighs the same: the coverage averaged over sources must reach
    ``level``, because a user's prompts are a new source, and sources unlike
    the others (chat among code) are where the band is too narrow. Found by
    bisection on ``band_scale`` in [1, 4] (coverage rises with it).
    """
    y_hat = np.asarray(y_hat, dtype=np.float64)
    groups = np.asarray(groups)
    counts = np.fromiter((len(a) for a in lengths), dtype=np.int64, count=len(lengths))
    flat = np.concatenate([np.asarray(a, dtype=np.float64) for a in lengths])
    sample_group = np.repeat(groups, counts)
    names = np.unique(groups)
    if len(names) < 2:
        return 1.0

    def balanced(scale: float) -> float:
        p = Calibration.fit(y_hat, lengths, n_bins, band_scale=scale).apply(y_hat)
        inside = (flat >= np.repeat(p.q10, counts)) & (flat <= np.repeat(p.q90, counts))
        return float(np.mean([inside[sample_group == g].mean() for g in names]))

    lo, hi = 1.0, 4.0
    if balanced(lo) >= level:
        return lo
    for _ in range(14):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if balanced(mid) >= level else (mid, hi)
    return hi


def target_band(
    own: Calibration,
    pooled: Calibration,
    shift: float,
    y_hat: np.ndarray,
    lengths: Sequence[np.ndarray],
    groups: np.ndarray,
    pooled_y: np.ndarray,
    pooled_lengths: Sequence[np.ndarray],
    pooled_groups: np.ndarray,
    level: float = 0.8,
) -> tuple[Calibration, float]:
    """One target's calibration: its own level, the pooled band widened by the target's own sources.

    The pooled band (every target's leave-one-source-out residuals about its
    own level) knows how far a level is off on an unseen source, on average
    over targets. A target whose own level shifts more between sources (in
    CASTILLO, Gemma is short on DS1000 and long on chat; Llama-3.2-3B is far
    apart on its two sources) needs a wider band. So the pooled band's
    offsets are widened by a factor ``f >= 1`` until the coverage averaged
    over this target's own held-out sources *and* the pooled residuals
    (counted as one more source: the evidence of all the other targets)
    reaches ``level``. With two to four sources per target, the pooled term
    keeps one odd source from setting the whole band; ``f`` is 1 (the pooled
    band, as before) for a target whose own sources are covered.

    Parameters
    ----------
    own
        The target's calibration (its level and own residual band).
    pooled
        The pooled calibration, fitted on scores shifted to the pooled level.
    shift
        The target's intercept minus the pooled one: the pooled band is read
        at ``y_hat - shift``.
    y_hat, lengths, groups
        The target's out-of-fold scores (its own level), observed lengths,
        and source of each row.
    pooled_y, pooled_lengths, pooled_groups
        The pooled residual set ``pooled`` was fitted on.

    Returns
    -------
    (Calibration, float)
        The target's calibration with the widened pooled band, and ``f``.
    """
    pooled_term = _coverage_by_group(pooled, pooled_y, pooled_lengths, pooled_groups, own=None, shift=0.0)
    own_term = _coverage_by_group(pooled, np.asarray(y_hat, dtype=np.float64), lengths, groups, own=own, shift=shift)

    def balanced(f: float) -> float:
        return float(np.mean(own_term(f) + [float(np.mean(pooled_term(f)))]))

    lo, hi = 1.0, 4.0
    if balanced(lo) >= level:
        f = lo
    else:
        for _ in range(14):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if balanced(mid) >= level else (mid, hi)
        f = hi
    return with_pooled_band(own, pooled, shift, f), f


def fit_calibrations(oof, lengths, train_rows, target_of_row, target_names, icpt, intercepts, fold_of_row, by_group, bins):
    """A trainer's calibrations from its out-of-fold log scores: one per target, then the pooled one.

    Returns ``(calibrations, pooled band scale, per-target band scales)``.
    With leave-one-group-out folds (``by_group``) the pooled band is widened
    until groups count equally (:func:`balanced_band_scale`) and every target
    starts from it, widened by its own groups (:func:`target_band`); random
    folds are in-distribution, and plain conformal is right. The pooled
    residuals are every target's around its own level, so the band is the
    spread of one response, not the spread between models.
    """
    target_scales: dict[str, float] = {}
    tr_lengths = [lengths[i] for i in train_rows]
    if target_of_row is None:
        scale = balanced_band_scale(oof[train_rows], tr_lengths, fold_of_row[train_rows], bins) if by_group else 1.0
        cal = Calibration.fit(oof[train_rows], tr_lengths, bins, band_scale=scale)
        return [cal, cal], float(scale), target_scales
    row_groups = [train_rows[target_of_row[train_rows] == t] for t in range(len(target_names))]
    shift = icpt[target_of_row[train_rows]] - intercepts[-1]
    pooled_y = oof[train_rows] - shift
    pooled_l = [lengths[i] / pm.exp(s) for i, s in zip(train_rows, shift, strict=True)]
    scale = balanced_band_scale(pooled_y, pooled_l, fold_of_row[train_rows], bins) if by_group else 1.0
    pooled = Calibration.fit(pooled_y, pooled_l, bins, band_scale=scale)
    # A target with no training row (its prompts all held out for validation) has the pooled level
    # (the trainers give it the pooled intercept) and so the pooled calibration.
    cals = [Calibration.fit(oof[g], [lengths[i] for i in g], bins) if len(g) else pooled for g in row_groups]
    cals.append(pooled)
    for t, g in enumerate(row_groups if by_group else []):
        if not len(g):
            continue
        cals[t], target_scales[target_names[t]] = target_band(
            cals[t], cals[-1], float(icpt[t] - intercepts[-1]), oof[g], [lengths[i] for i in g],
            fold_of_row[g], pooled_y, pooled_l, fold_of_row[train_rows])  # fmt: skip
    return cals, float(scale), target_scales


def with_pooled_band(own: Calibration, pooled: Calibration, shift: float, scale: float = 1.0) -> Calibration:
    """``own``'s mean and median curves with ``pooled``'s q10/q90 offsets (times ``scale``) about them.

    The curves are tabulated at the union of both calibrations' centres, where
    both are piecewise linear, so between the centres the result equals
    ``own.q50 * (pooled.q10 / pooled.q50) ** scale`` read at ``y_hat - shift``
    (what a shared band gave at ``scale = 1``); outside, every curve
    continues with ``own``'s slope (the pooled offsets are constant there).
    """
    centers = np.unique(np.concatenate([own.centers, pooled.centers + shift]))
    o = own.apply(centers)
    p = pooled.apply(centers - shift)
    q50 = pm.log(o.q50)
    curves = np.column_stack(
        [pm.log(o.mean), q50 + scale * pm.log(p.q10 / p.q50), q50, q50 + scale * pm.log(p.q90 / p.q50)]
    )
    centers_a, curves_a = _strictly_increasing(centers, curves, own.slope)
    return Calibration(centers_a, curves_a, own.slope)


def _coverage_by_group(pooled, y_hat, lengths, groups, *, own, shift):
    """``f -> [coverage of each group]`` of the band ``q50 * (pooled offsets) ** f`` on ``lengths``."""
    groups = np.asarray(groups)
    counts = np.fromiter((len(a) for a in lengths), dtype=np.int64, count=len(lengths))
    flat = pm.log(np.maximum(np.concatenate([np.asarray(a, dtype=np.float64) for a in lengths]), 1.0))
    p = pooled.apply(y_hat - shift)
    z = pm.log(p.q50 if own is None else own.apply(y_hat).q50)
    lo, hi = pm.log(p.q10 / p.q50), pm.log(p.q90 / p.q50)
    r = flat - np.repeat(z, counts)
    lo_s, hi_s = np.repeat(lo, counts), np.repeat(hi, counts)
    sample_group = np.repeat(groups, counts)
    masks = [sample_group == g for g in np.unique(groups)]

    def per_group(f: float) -> list[float]:
        inside = (r >= f * lo_s) & (r <= f * hi_s)
        return [float(inside[m].mean()) for m in masks]

    return per_group


def _level_map(y_hat: np.ndarray, level: np.ndarray) -> tuple[float, float]:
    """``(a, b)`` of the least-squares line ``level ~ a + b * y_hat``, slope clipped."""
    if len(y_hat) < 2 or pm.var(y_hat) < 1e-12:
        return pm.mean(level) - pm.mean(y_hat), 1.0
    # Not np.cov: it multiplies through BLAS, whose order of additions depends on the CPU.
    dy = np.asarray(y_hat, dtype=np.float64) - pm.mean(y_hat)
    b = pm.dot(dy, np.asarray(level, dtype=np.float64) - pm.mean(level)) / pm.dot(dy, dy)
    b = float(np.clip(b, MIN_SLOPE, MAX_SLOPE))
    return pm.mean(level) - b * pm.mean(y_hat), b


def _strictly_increasing(centers: np.ndarray, curves: np.ndarray, slope: float) -> tuple[np.ndarray, np.ndarray]:
    """Merge coincident centres and raise each curve so it climbs by >= MIN_SLOPE*slope per unit."""
    keep = np.concatenate([[True], np.diff(centers) > 1e-9])
    centers, curves = centers[keep], curves[keep].copy()
    rise = MIN_SLOPE * slope
    for j in range(1, len(centers)):
        floor = curves[j - 1] + rise * (centers[j] - centers[j - 1])
        curves[j] = np.maximum(curves[j], floor)
    return centers, curves


def estimate_history_prior(
    y_hat: np.ndarray,
    lengths: Sequence[np.ndarray],
    default_kappa: float,
    targets: Sequence[str] | None = None,
) -> dict[str, Any]:
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
        (``s_w**2``, or ``None`` when unmeasurable), ``history_within_band_var``
        (the same spread measured by its 10-90% range); with ``targets`` (the
        model of each row) also ``history_within_log_var_by_target``: models
        differ several-fold in how much their samples of one prompt vary
        (CASTILLO train: Qwen2.5 ~0.03, Mixtral ~0.2), and a history band
        built on the pooled figure is too wide for one and too narrow for
        the other.
    """
    logs = [pm.log(np.maximum(np.asarray(a, dtype=np.float64), 1.0)) for a in lengths]
    multi = [a for a in logs if len(a) >= 2]
    if not multi:
        return {"history_kappa": default_kappa, "history_within_log_var": None}
    s_w = pm.mean([np.var(a, ddof=1) for a in multi])
    k = np.array([len(a) for a in logs], dtype=np.float64)
    level = np.array([pm.log(max(float(np.mean(a)), 1.0)) for a in lengths])
    # The observed level is itself noisy by s_w / k; remove that from the residual variance.
    s_b = pm.mean((level - y_hat) ** 2 - s_w / k)
    kappa = default_kappa if s_b <= 1e-6 else float(np.clip(s_w / s_b, 0.01, 100.0))
    out: dict[str, Any] = {"history_kappa": kappa, "history_within_log_var": s_w}
    out["history_within_band_var"] = log_band_var(multi)
    if targets is not None:
        by: dict[str, list[np.ndarray]] = {}
        for a, t in zip(logs, targets, strict=True):
            if len(a) >= 2:
                by.setdefault(str(t), []).append(a)
        out["history_within_log_var_by_target"] = {
            t: pm.mean([np.var(a, ddof=1) for a in v]) for t, v in sorted(by.items())
        }
        out["history_within_band_var_by_target"] = {t: log_band_var(v) for t, v in sorted(by.items())}
    return out


def log_band_var(logs: Sequence[np.ndarray]) -> float:
    """``((q90 - q10) / 2.563)**2`` of the deviations of each prompt's log lengths about their mean.

    Log lengths of one prompt are heavy-tailed (a few runaway samples): on
    CASTILLO this is about half their variance, and a history band built on
    the variance covered ~90% instead of 80%. Same estimator as
    :func:`aspc.predict.history.within_band_var`.
    """
    dev = np.concatenate([(a - a.mean()) * np.sqrt(len(a) / (len(a) - 1)) for a in logs])
    q10, q90 = np.quantile(dev, [0.1, 0.9])
    return float(((q90 - q10) / (2 * 1.2816)) ** 2)
