"""History: blend a base prediction with lengths observed for the same prompt id.

In multi-epoch RL the same prompts come back, and the lengths generated for a
prompt last epoch are the best predictor of its lengths this epoch. The blend
is a shrinkage estimator in log space: with ``k`` observations of mean
``m_obs`` and a base prediction ``m_base``,

    log m = (1 - w) log m_base + w log m_obs,   w = k / (k + kappa),

so one observation moves the prediction part way and many observations are
trusted almost fully. ``kappa`` is the ratio of the within-prompt variance of
log lengths to the base predictor's error variance (estimated when the base
predictor is trained; see :func:`aspc.predict.calibration.estimate_history_prior`).
All quantiles move by the same factor, and the band narrows because the
prompt's level is now better known (see :func:`blend_history`); with two or
more observations the band's width is also blended toward the observed
spread, by ``(k - 1) / (k - 1 + kappa)``, so it moves slower than the level.

Notes
-----
The empirical-Bayes / credibility form ``k / (k + kappa)`` is Bühlmann's
credibility estimator (Bühlmann & Gisler, *A Course in Credibility Theory*,
2005, chapter 3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aspc.errors import ConfigError, PredictorError
from aspc.predict.base import LengthPrediction, Predictor, hash_arrays

DEFAULT_KAPPA = 0.5  # used when the base predictor did not estimate one
BAND_KAPPA = 8.0
"""Extra observations (beyond the first) that count as much as the base band's width: with two
earlier epochs (k=2) the band moved 90% of the way to the two samples' spread before, and covered
44% of the other eight CASTILLO samples instead of 80%."""
EPOCH_DECAY = 0.7
"""Weight of an epoch's observations relative to the next newer epoch's. RL policies drift
(responses usually lengthen as training goes on), so older epochs count less; on data without
drift (CASTILLO's fixed models) 0.7 costs under 0.005 tau against equal weights with 2-4
earlier epochs (``benchmarks/predict_quality.py``, history rows)."""


def blend_history(
    base: LengthPrediction,
    observed: Sequence[np.ndarray | None],
    kappa: float,
    within_log_var: float | None = None,
    weights: Sequence[np.ndarray | None] | None = None,
) -> LengthPrediction:
    """Move each prompt's prediction toward its observed lengths.

    Parameters
    ----------
    base
        The base prediction, one entry per prompt.
    observed
        Per prompt, the lengths observed before (tokens), or ``None`` / an empty
        array when the prompt has none.
    kappa
        Shrinkage constant (``> 0``): the number of observations that count as
        much as the base prediction.
    within_log_var
        Variance of one response's log length about its prompt's level
        (``s_w**2``); when given, the band narrows as observations pin down
        the level, but never below what ``s_w`` and the remaining level
        uncertainty imply. ``None`` keeps the base band's width.
    weights
        Optional weight of each observation (same shapes as ``observed``, in
        ``(0, 1]``): an observation of weight ``w`` counts as ``w``
        observations in ``k`` and in the observed mean (older epochs weigh
        less, see :data:`EPOCH_DECAY`). ``None``: all weigh 1.

    Returns
    -------
    LengthPrediction
        Unchanged where nothing was observed. Elsewhere every figure lies
        between the base and the observation (in log space) and moves toward
        the observation as ``k`` grows.
    """
    if kappa <= 0:
        raise ConfigError(f"history kappa {kappa} must be positive")
    if len(observed) != len(base):
        raise ValueError(f"{len(observed)} history entries for {len(base)} predictions")
    n = len(base)
    k = np.zeros(n)
    obs_mean = np.ones(n)
    obs_lo = np.zeros(n)  # observed log(q10/q50) and log(q90/q50) where k >= 2
    obs_hi = np.zeros(n)
    if weights is not None and len(weights) != len(observed):
        raise ValueError(f"{len(weights)} weight entries for {len(observed)} observations")
    for i, a in enumerate(observed):
        if a is None or len(a) == 0:
            continue
        a = np.maximum(np.asarray(a, dtype=np.float64), 1.0)
        w_i = None if weights is None or weights[i] is None else np.asarray(weights[i], dtype=np.float64)
        if w_i is None:
            k[i] = len(a)
            obs_mean[i] = a.mean()
        else:
            if w_i.shape != a.shape or not np.all((w_i > 0) & (w_i <= 1)):
                raise ValueError(f"prompt {i}: weights must match its observations and lie in (0, 1]")
            k[i] = w_i.sum()
            obs_mean[i] = float(w_i @ a / w_i.sum())
        if len(a) >= 2:
            q10, q50, q90 = np.quantile(a, [0.1, 0.5, 0.9])
            obs_lo[i] = np.log(q10 / q50)
            obs_hi[i] = np.log(q90 / q50)
    w = k / (k + kappa)
    shift = w * (np.log(obs_mean) - np.log(base.mean))
    scale = np.exp(shift)
    mean = base.mean * scale
    q50 = base.q50 * scale
    # Posterior log-sd of one response under the normal model behind kappa: the within-prompt
    # spread plus the level's remaining uncertainty s_w**2 / (k + kappa). The base band is only
    # narrowed toward it, never widened, and a base band already narrower is kept.
    base_lo = np.log(base.q10 / base.q50)
    base_hi = np.log(base.q90 / base.q50)
    if within_log_var is not None and within_log_var > 0:
        post_sd = np.sqrt(within_log_var * (1.0 + 1.0 / (k + kappa)))
        base_sd = np.maximum((base_hi - base_lo) / (2 * 1.2816), 1e-9)  # 1.2816 = z of the 90% quantile
        narrow = np.where(k > 0, np.minimum(1.0, post_sd / base_sd), 1.0)
        base_lo = narrow * base_lo
        base_hi = narrow * base_hi
    # With two or more observations the band also moves toward their own spread, slowly: the
    # 10-90% range of n samples covers only about (n-1)/(n+1) of the distribution, so a spread
    # needs many more observations than a level (BAND_KAPPA, not kappa).
    extra = np.maximum(k - 1, 0.0)
    w2 = extra / (extra + BAND_KAPPA)
    lo = (1 - w2) * base_lo + w2 * obs_lo
    hi = (1 - w2) * base_hi + w2 * obs_hi
    return LengthPrediction(mean, q50 * np.exp(np.minimum(lo, 0.0)), q50, q50 * np.exp(np.maximum(hi, 0.0)))


class HistoryPredictor(Predictor):
    """A base predictor plus observed lengths keyed by prompt id.

    Built at compile time from run logs or datasets (``aspc.io.read_lengths``);
    it is not saved as a directory of its own: save the base predictor and keep
    the run logs.
    """

    kind = "history"

    def __init__(
        self,
        base: Predictor,
        observations: Mapping[str, np.ndarray],
        kappa: float | None = None,
        weights: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self.base = base
        self.observations = {str(k): np.asarray(v, dtype=np.float64) for k, v in observations.items()}
        # Per-observation weights (older epochs < 1); None: every observation weighs 1.
        self.weights = None if weights is None else {str(k): np.asarray(v, dtype=np.float64) for k, v in weights.items()}
        if kappa is None:
            kappa = float(base.metadata.get("history_kappa") or DEFAULT_KAPPA)
        self.within_log_var = base.metadata.get("history_within_log_var")
        if kappa <= 0:
            raise ConfigError(f"history kappa {kappa} must be positive")
        self.kappa = kappa
        self.metadata: dict[str, Any] = {
            "base": base.identity(),
            "kappa": kappa,
            "n_observed": len(self.observations),
        }

    @classmethod
    def from_epochs(
        cls,
        base: Predictor,
        epochs: Sequence[Mapping[str, np.ndarray]],
        kappa: float | None = None,
        decay: float = EPOCH_DECAY,
    ) -> HistoryPredictor:
        """History from several earlier epochs, oldest first: epoch ``e`` of ``E`` weighs ``decay**(E-1-e)``."""
        if not 0 < decay <= 1:
            raise ConfigError(f"epoch decay {decay} must be in (0, 1]")
        obs: dict[str, list[np.ndarray]] = {}
        wts: dict[str, list[np.ndarray]] = {}
        for e, epoch in enumerate(epochs):
            w = decay ** (len(epochs) - 1 - e)
            for key, v in epoch.items():
                a = np.atleast_1d(np.asarray(v, dtype=np.float64))
                obs.setdefault(str(key), []).append(a)
                wts.setdefault(str(key), []).append(np.full(len(a), w))
        return cls(
            base,
            {k: np.concatenate(v) for k, v in obs.items()},
            kappa,
            {k: np.concatenate(v) for k, v in wts.items()},
        )

    def predict(self, texts: Sequence[str], *, ids: Sequence[str] | None = None) -> LengthPrediction:
        if ids is None:
            raise ConfigError("history predictions need prompt ids; pass ids= (PromptTable.ids)")
        if len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} prompts")
        base = self.base.predict(texts, ids=ids)
        w = None if self.weights is None else [self.weights.get(str(i)) for i in ids]
        return blend_history(
            base, [self.observations.get(str(i)) for i in ids], self.kappa, self.within_log_var, w
        )

    def coverage(self, ids: Sequence[str]) -> int:
        """How many of ``ids`` have at least one observation."""
        return sum(1 for i in ids if str(i) in self.observations)

    def content_hash(self) -> str:
        keys = sorted(self.observations)
        arrays = {
            "base": np.frombuffer(self.base.content_hash().encode(), dtype=np.uint8),
            "kappa": np.array([self.kappa]),
            "ids": np.frombuffer("\x00".join(keys).encode(), dtype=np.uint8),
            "obs": np.concatenate([self.observations[k] for k in keys]) if keys else np.empty(0),
        }
        if self.weights is not None:
            arrays["weights"] = np.concatenate([self.weights[k] for k in keys]) if keys else np.empty(0)
        return hash_arrays(arrays)

    def identity(self) -> dict[str, Any]:
        ident = super().identity()
        ident.update(base=self.base.identity(), kappa=self.kappa, n_observed=len(self.observations))
        return ident

    def save(self, path: str | Path) -> None:
        raise PredictorError(
            "a history predictor is built from run logs at compile time; save its base predictor"
        )
