"""Estimates from observed history: within-prompt spread, the base's error, epoch drift.

What :mod:`aspc.predict.history` needs to know about a user's own
observations before it blends them with a base prediction: how much one
prompt's lengths vary (:func:`within_band_var`, :func:`within_log_var_of`), how far
the base predictor is off on the observed prompts (:func:`estimate_kappa`,
empirical Bayes), and how earlier epochs relate to the newest one
(:func:`epoch_alignment`: a common scale, and the per-prompt drift that makes
older epochs count less). All of them work on flat arrays of all prompts'
observations, so a million prompts cost a few vector passes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aspc import portable_math as pm
from aspc.predict.base import LengthPrediction

EPOCH_DECAY = 0.7
"""Weight of an epoch's observations relative to the next newer epoch's when the drift cannot be
estimated (fewer than :data:`MIN_PROMPTS` prompts seen in two epochs); otherwise the weights come
from the estimated drift (:func:`epoch_alignment`): equal for epochs that do not drift."""


def flat_weights(weights, seen: np.ndarray, arrays: list[np.ndarray], starts: np.ndarray) -> np.ndarray:
    """The observations' weights in the flat order of ``arrays`` (missing: 1), checked."""
    parts = []
    for i, a in zip(seen, arrays, strict=True):
        w_i = weights[i]
        w_i = np.ones(len(a)) if w_i is None else np.asarray(w_i, dtype=np.float64)
        if w_i.shape != a.shape:
            raise ValueError(f"prompt {i}: weights must match its observations and lie in (0, 1]")
        parts.append(w_i)
    wf = np.concatenate(parts)
    bad = np.flatnonzero(~((wf > 0) & (wf <= 1)))
    if len(bad):
        i = seen[np.searchsorted(starts, bad[0], side="right") - 1]
        raise ValueError(f"prompt {i}: weights must match its observations and lie in (0, 1]")
    return wf


def ragged_quantiles(flat: np.ndarray, starts: np.ndarray, counts: np.ndarray, qs) -> list[np.ndarray]:
    """Per group of ``flat`` (``counts[j]`` values from ``starts[j]``): its quantiles ``qs``.

    NumPy's default (linear) definition, as ``np.quantile`` of each group.
    """
    group = np.repeat(np.arange(len(counts)), counts)
    v = flat[np.lexsort((flat, group))]
    out = []
    for q in qs:
        pos = q * (counts - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, counts - 1)
        t = pos - lo
        a, b = v[starts + lo], v[starts + hi]
        out.append(np.where(t >= 0.5, b - (b - a) * (1 - t), a + (b - a) * t))
    return out


MIN_PROMPTS = 20
"""Fewest prompts an estimate from the observations needs (within-prompt variance, the base's
error, an epoch's scale); below it the base predictor's trained figures are used."""


def _multi_logs(observations) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Log lengths of the prompts with >= 2 observations, flat, with each prompt's start and count.

    ``None`` below :data:`MIN_PROMPTS` such prompts. Flat arrays, so that a million prompts cost
    a few vector passes, not a NumPy call each.
    """
    arrays = [a for a in observations if a is not None and len(a) >= 2]
    if len(arrays) < MIN_PROMPTS:
        return None
    counts = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    flat = pm.log(np.maximum(np.concatenate(arrays).astype(np.float64), 1.0))
    return flat, np.concatenate([[0], np.cumsum(counts)[:-1]]), counts


def within_log_var_of(observations) -> float | None:
    """Pooled within-prompt variance of log lengths over prompts with >= 2 observations, or None."""
    multi = _multi_logs(observations)
    if multi is None:
        return None
    flat, starts, n = multi
    total = np.add.reduceat(flat, starts)
    var = (np.add.reduceat(flat * flat, starts) - total * total / n) / (n - 1)
    return pm.mean(np.maximum(var, 0.0))


def within_band_var(observations) -> float | None:
    """Within-prompt spread of log lengths as a band sees it: ``((q90 - q10) / 2.563)**2``.

    Deviations of each prompt's log lengths about their mean (prompts with
    >= 2), scaled by ``sqrt(n / (n - 1))`` so that few samples per prompt do
    not understate the spread (as :func:`aspc.predict.calibration.log_band_var`
    on training data); ``None`` below :data:`MIN_PROMPTS` prompts.
    """
    multi = _multi_logs(observations)
    if multi is None:
        return None
    flat, starts, n = multi
    dev = (flat - np.repeat(np.add.reduceat(flat, starts) / n, n)) * np.repeat(np.sqrt(n / (n - 1)), n)
    q10, q90 = np.quantile(dev, [0.1, 0.9])
    return float(((q90 - q10) / (2 * 1.2816)) ** 2)


def estimate_kappa(
    base: LengthPrediction,
    observed: Sequence[np.ndarray | None],
    weights: Sequence[np.ndarray | None] | None,
    within_log_var: float,
    fallback: float,
) -> float:
    """Empirical-Bayes shrinkage ``s_w**2 / s_b**2`` from the base's error on the observed prompts.

    ``s_b**2`` is the mean of ``(log mean_obs - log base.mean)**2 - s_w**2 / k``
    over prompts with observations (``k``: their weight sum); ``fallback``
    when fewer than :data:`MIN_PROMPTS` prompts were observed or the base
    looks exact (``s_b**2 <= 0``). Clipped to ``[0.01, 100]``.
    """
    seen = [i for i, a in enumerate(observed) if a is not None and len(a)]
    if len(seen) < MIN_PROMPTS:
        return fallback
    arrays = [np.maximum(np.asarray(observed[i], dtype=np.float64), 1.0) for i in seen]
    flat = np.concatenate(arrays)
    w = np.concatenate(
        [np.ones(len(a)) if weights is None or weights[i] is None else np.asarray(weights[i], dtype=np.float64)
         for i, a in zip(seen, arrays, strict=True)]
    )  # fmt: skip
    starts = np.cumsum([0] + [len(a) for a in arrays[:-1]])
    k = np.add.reduceat(w, starts)
    r2 = (pm.log(np.add.reduceat(w * flat, starts) / k) - pm.log(base.mean[seen])) ** 2
    inv_k = 1.0 / k
    s_b = pm.mean(r2) - within_log_var * pm.mean(inv_k)
    return fallback if s_b <= 1e-6 else float(np.clip(within_log_var / s_b, 0.01, 100.0))


@dataclass(frozen=True)
class EpochAlignment:
    """How earlier epochs are put on the newest one's level, and how much each then counts."""

    scale: list[float]  # per epoch, oldest first: factor onto the newest epoch's level (newest: 1)
    drift: float | None  # q: per-prompt variance of log level added per epoch of age; None: unknown
    within_log_var: float | None  # s_w**2 measured on the epochs, None when unmeasurable

    def weight(self, lag: int) -> float:
        """Weight of an observation ``lag`` epochs older than the newest."""
        if lag == 0:
            return 1.0
        if self.drift is None or not self.within_log_var:
            return EPOCH_DECAY**lag
        return float(self.within_log_var / (self.within_log_var + self.drift * lag))

    def summary(self) -> dict[str, Any]:
        n = len(self.scale)
        return {
            "scale": [round(x, 6) for x in self.scale],
            "weights": [round(self.weight(n - 1 - e), 6) for e in range(n)],
            "drift": None if self.drift is None else round(self.drift, 6),
        }


def epoch_alignment(epochs: Sequence[Mapping[str, np.ndarray]]) -> EpochAlignment:
    """Scale of each epoch relative to the newest, per-prompt drift and within-prompt variance.

    With ``x`` a prompt's mean log length in an epoch, ``c_e`` (the log scale
    of epoch ``e``) is the mean of ``x_new - x_e`` over the prompts both saw,
    shrunk toward 0 by its standard error (positive-part James-Stein), so
    noise is not mistaken for growth. After rescaling, the squared
    difference of two epochs ``L`` apart has expectation ``s_w**2 h + q L``
    (``h = 1/n_a + 1/n_b``, samples per prompt). ``s_w**2`` is measured from
    prompts with several samples in one epoch when there are enough; then
    ``q`` follows from the pairs with the newest epoch. Without such
    replicates, three or more epochs give both by least squares over all
    pairs (``L`` varies); two epochs cannot tell drift from noise, and
    ``q`` is taken as ``c**2``: prompts are assumed to drift individually by
    about as much as they drift together (no common drift: no decay).
    """
    n_ep = len(epochs)
    scale = [1.0] * n_ep
    if n_ep < 2:
        return EpochAlignment(scale, None, within_log_var_of([a for e in epochs for a in e.values()]))
    # Per epoch: each prompt's mean log length and sample count (flat passes; epochs are big).
    level, count = [], []
    for e in epochs:
        keys = [k for k, a in e.items() if len(a)]
        n = np.fromiter((len(e[k]) for k in keys), dtype=np.int64, count=len(keys))
        flat = pm.log(np.maximum(np.concatenate([e[k] for k in keys]), 1.0)) if keys else np.empty(0)
        sums = np.add.reduceat(flat, np.concatenate([[0], np.cumsum(n)[:-1]])) if keys else np.empty(0)
        level.append(dict(zip(keys, (sums / np.maximum(n, 1)).tolist(), strict=True)))
        count.append(dict(zip(keys, n.tolist(), strict=True)))
    newest = level[-1]
    log_c = [0.0] * n_ep
    for e in range(n_ep - 1):
        common = [k for k in level[e] if k in newest]
        if len(common) < MIN_PROMPTS:
            continue
        diff = np.array([newest[k] - level[e][k] for k in common])
        c_hat, se2 = pm.mean(diff), pm.var(diff, ddof=1) / len(diff)
        log_c[e] = c_hat * max(0.0, 1.0 - se2 / c_hat**2) if c_hat != 0 else 0.0
        scale[e] = float(pm.exp(log_c[e]))
    within = within_log_var_of([a for e in epochs for a in e.values()])
    # Pairs of epochs: mean squared difference after rescaling, noise factor h, lag L.
    rows = []
    for a in range(n_ep):
        for b in range(a + 1, n_ep):
            common = [k for k in level[a] if k in level[b]]
            if len(common) < MIN_PROMPTS:
                continue
            d = np.array([level[b][k] - level[a][k] for k in common]) + (log_c[b] - log_c[a])
            h = pm.mean([1 / count[a][k] + 1 / count[b][k] for k in common])
            rows.append((pm.mean((d - pm.mean(d)) ** 2), h, b - a, b == n_ep - 1))
    if not rows:
        return EpochAlignment(scale, None, within)
    newest_rows = [r for r in rows if r[3]]
    if within is not None and newest_rows:
        q = sum(max(0.0, m - within * h) for m, h, _, _ in newest_rows) / sum(lag for *_, lag, _ in newest_rows)
        return EpochAlignment(scale, float(q), within)
    if len({r[2] for r in rows}) >= 2:
        x = np.array([[h, lag] for _, h, lag, _ in rows], dtype=np.float64)
        y = np.array([m for m, *_ in rows])
        # Least squares of y ~ s_w * h + q * lag by its 2x2 normal equations (no LAPACK:
        # its rounding depends on the machine, and this feeds plans).
        hh, hl, ll = pm.dot(x[:, 0], x[:, 0]), pm.dot(x[:, 0], x[:, 1]), pm.dot(x[:, 1], x[:, 1])
        hy, ly = pm.dot(x[:, 0], y), pm.dot(x[:, 1], y)
        det = hh * ll - hl * hl
        if det <= 1e-12 * hh * ll:
            return EpochAlignment(scale, None, None)
        s_w, q = (ll * hy - hl * ly) / det, (hh * ly - hl * hy) / det
        if s_w <= 0:
            return EpochAlignment(scale, None, None)
        if q < 0:  # no growth of the error with age: pure noise
            s_w, q = pm.dot(y, x[:, 0]) / pm.dot(x[:, 0], x[:, 0]), 0.0
        return EpochAlignment(scale, float(q), float(s_w))
    m, h, lag, _ = rows[0]
    c = log_c[0] / max(n_ep - 1, 1)
    q = c * c
    return EpochAlignment(scale, q, max(m - q * lag, 0.0) / h or None)
