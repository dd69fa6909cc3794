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
The median moves the same way toward the observations' mean log (their
median level), and the band narrows because the prompt's level is now better
known (see :func:`blend_history`); with two or more observations the band's
width is also blended toward the observed spread, by
``(k - 1) / (k - 1 + BAND_KAPPA)``, so it moves slower than the level.
:class:`HistoryPredictor` estimates ``kappa`` from the observations
(empirical Bayes) and, for several epochs, puts older epochs on the newest
one's level and weighs them by the drift it measures
(:func:`aspc.predict.history_estimates.epoch_alignment`).

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

from aspc import portable_math as pm
from aspc.errors import ConfigError, PredictorError
from aspc.predict.base import LengthPrediction, Predictor, finite_number, hash_arrays, text_list
from aspc.predict.history_estimates import (
    epoch_alignment,
    estimate_kappa,
    flat_weights,
    ragged_quantiles,
    within_band_var,
    within_log_var_of,
)

DEFAULT_KAPPA = 0.5  # used when the base predictor did not estimate one
BAND_KAPPA = 8.0
"""Extra observations (beyond the first) that count as much as the base band's width: with two
earlier epochs (k=2) the band moved 90% of the way to the two samples' spread before, and covered
44% of the other eight CASTILLO samples instead of 80%."""
def blend_history(
    base: LengthPrediction,
    observed: Sequence[np.ndarray | None],
    kappa: float,
    within_log_var: float | None = None,
    weights: Sequence[np.ndarray | None] | None = None,
    within_band_var: float | None = None,
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
        less, see :data:`~aspc.predict.history_estimates.EPOCH_DECAY`). ``None``: all weigh 1.
    within_band_var
        The within-prompt spread the band is built from, as the variance of a
        normal with the same 10-90% range (:func:`within_band_var`; log
        lengths of one prompt are heavy-tailed, so this is about half
        ``within_log_var``, and a band from the variance covers 90% instead
        of 80%). ``None``: ``within_log_var``.

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
    if weights is not None and len(weights) != len(observed):
        raise ValueError(f"{len(weights)} weight entries for {len(observed)} observations")
    # All prompts' observations in one flat array (a million prompts: a few vector passes).
    seen = np.array([i for i, a in enumerate(observed) if a is not None and len(a)], dtype=np.int64)
    arrays = [np.asarray(observed[i], dtype=np.float64) for i in seen]
    counts = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    flat = np.concatenate(arrays) if arrays else np.empty(0)
    wf = None if weights is None or not len(seen) else flat_weights(weights, seen, arrays, starts)
    return _blend(at_least_one_token(base), seen, counts, flat, kappa, wf, within_log_var, within_band_var)


def blend_history_flat(
    base: LengthPrediction, seen: np.ndarray, counts: np.ndarray, values: np.ndarray, kappa: float,
) -> LengthPrediction:  # fmt: skip
    """:func:`blend_history` (no weights, no within-prompt spread) of observations given flat: prompt
    ``seen[j]`` observed ``counts[j] >= 1`` lengths, in ``values`` one prompt after another.

    The same figures, bit for bit, as the list of per-prompt arrays, without building it.
    """
    if kappa <= 0:
        raise ConfigError(f"history kappa {kappa} must be positive")
    seen = np.asarray(seen, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    return _blend(at_least_one_token(base), seen, counts, np.asarray(values, dtype=np.float64), kappa, None, None, None)


def _blend(
    base: LengthPrediction, seen: np.ndarray, counts: np.ndarray, flat: np.ndarray, kappa: float,
    wf: np.ndarray | None, within_log_var: float | None, within_band_var: float | None,
) -> LengthPrediction:  # fmt: skip
    n = len(base)
    k = np.zeros(n)
    obs_mean = np.ones(n)
    obs_log = np.zeros(n)  # weighted mean log length: the observed median's level
    obs_lo = np.zeros(n)  # observed log(q10/q50) and log(q90/q50) where k >= 2
    obs_hi = np.zeros(n)
    if len(seen):
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        flat = np.maximum(flat, 1.0)
        logs = pm.log(flat)
        if wf is None:
            k[seen] = counts
            obs_mean[seen] = np.add.reduceat(flat, starts) / counts
            obs_log[seen] = np.add.reduceat(logs, starts) / counts
        else:
            k[seen] = np.add.reduceat(wf, starts)
            obs_mean[seen] = np.add.reduceat(wf * flat, starts) / k[seen]
            obs_log[seen] = np.add.reduceat(wf * logs, starts) / k[seen]
        multi = counts >= 2
        if multi.any():
            q10, q50, q90 = ragged_quantiles(flat, starts, counts, (0.1, 0.5, 0.9))
            obs_lo[seen[multi]] = pm.log(q10 / q50)[multi]
            obs_hi[seen[multi]] = pm.log(q90 / q50)[multi]
    w = k / (k + kappa)
    shift = w * (pm.log(obs_mean) - pm.log(base.mean))
    scale = pm.exp(shift)
    mean = base.mean * scale
    # The median moves toward the observed *median* level (mean log), not by the mean's factor:
    # the base's mean/median gap is mostly its own uncertainty, which history removes; keeping it
    # put the band too low (CASTILLO: 15-25% of new samples above q90, 4-8% below q10).
    q50 = base.q50 * pm.exp(np.where(k > 0, w * (obs_log - pm.log(base.q50)), 0.0))
    # Posterior log-sd of one response under the normal model behind kappa: the within-prompt
    # spread (its 10-90% range) plus the level's remaining uncertainty s_w**2 / (k + kappa). The base band is only
    # narrowed toward it, never widened, and a base band already narrower is kept.
    base_lo = pm.log(base.q10 / base.q50)
    base_hi = pm.log(base.q90 / base.q50)
    if within_log_var is not None and within_log_var > 0:
        band_var = within_log_var if within_band_var is None else within_band_var
        post_sd = np.sqrt(band_var + within_log_var / (k + kappa))
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
    return LengthPrediction(mean, q50 * pm.exp(np.minimum(lo, 0.0)), q50, q50 * pm.exp(np.maximum(hi, 0.0)))


def at_least_one_token(pred: LengthPrediction) -> LengthPrediction:
    """``pred`` with every figure at least 1 token, as observed lengths are counted here.

    Known lengths of 0 (a response that ended at once) give a plan's prediction of 0, and the
    blend works in log space: log(0) made every figure NaN, refused as 'length nan'. Figures of
    1 token or more are unchanged.
    """
    if all(float(np.min(a, initial=1.0)) >= 1.0 for a in (pred.mean, pred.q10, pred.q50, pred.q90)):
        return pred
    return LengthPrediction(*(np.maximum(a, 1.0) for a in (pred.mean, pred.q10, pred.q50, pred.q90)))


def check_history_prior(meta: Mapping[str, Any]) -> None:
    """Refuse a base predictor's ``history_*`` metadata that training could not have written.

    Read only here, they were used unchecked: a string raised ValueError or a NumPy loop error, a
    number where a mapping belongs AttributeError, and a NaN or negative kappa went into the plan.
    """
    fields = {
        "history_kappa": "a positive number",
        "history_within_log_var": "a non-negative number",
        "history_within_band_var": "a non-negative number",
        "history_within_log_var_by_target": "a mapping of target names to non-negative numbers",
        "history_within_band_var_by_target": "a mapping of target names to non-negative numbers",
    }
    for field, what in fields.items():
        value = meta.get(field)
        if value is None:  # absent, or null where no prompt had two lengths: the defaults apply
            continue
        if field.endswith("_by_target"):
            good = isinstance(value, Mapping) and all(_variance(v) for v in value.values())
        else:
            good = _variance(value) and (field != "history_kappa" or value > 0)
        if not good:
            name = meta.get("name") or "base"
            raise PredictorError(f"predictor {name}: metadata {field} {repr(value)[:80]} is not {what}; retrain it")


def _variance(x: Any) -> bool:
    return finite_number(x) and x >= 0


class HistoryPredictor(Predictor):
    """A base predictor plus observed lengths keyed by prompt id.

    Built at compile time from run logs or datasets (``aspc.io.read_lengths``);
    it is not saved as a directory of its own: save the base predictor and keep
    the run logs.

    Shrinkage is estimated from the observations (empirical Bayes) unless
    ``kappa`` is given: ``kappa = s_w**2 / s_b**2``, where ``s_b**2`` is the
    base predictor's mean squared error on the observed prompts of the batch
    predicted (the squared residual of each prompt's observed log mean about
    the base, less its sampling part ``s_w**2 / k``), and ``s_w**2`` the
    within-prompt variance of log lengths: measured on the observations when
    enough prompts have two or more (several samples or several epochs),
    else the base predictor's own figure for its target model, else its
    pooled one. A policy unlike the base's training data (a larger error)
    thus trusts its history more, and a base that already fits trusts it
    less. With fewer than :data:`~aspc.predict.history_estimates.MIN_PROMPTS` observed prompts the base's
    trained ``history_kappa`` is used.
    """

    kind = "history"

    def __init__(
        self,
        base: Predictor,
        observations: Mapping[str, np.ndarray],
        kappa: float | None = None,
        weights: Mapping[str, np.ndarray] | None = None,
        within_log_var: float | None = None,
    ) -> None:
        self.base = base
        suffix = _scout_suffix()
        self.observations = {str(k): np.asarray(v, dtype=np.float64) for k, v in observations.items()
                             if not str(k).endswith(suffix)}  # fmt: skip
        # Per-observation weights (older epochs < 1); None: every observation weighs 1.
        self.weights = None if weights is None else {str(k): np.asarray(v, dtype=np.float64) for k, v in weights.items()}
        meta = getattr(base, "metadata", {}) or {}
        check_history_prior(meta)
        if kappa is not None and kappa <= 0:
            raise ConfigError(f"history kappa {kappa} must be positive")
        self.fixed_kappa = kappa
        self.kappa = float(kappa if kappa is not None else meta.get("history_kappa") or DEFAULT_KAPPA)
        # Within-prompt spread: measured on the observations when they allow it, else the base's
        # figure for its target model, else its pooled one.
        target = str(meta.get("target"))
        measured = within_log_var if within_log_var is not None else within_log_var_of(self.observations.values())
        band = within_band_var(self.observations.values()) if measured is not None else None
        if measured is None:
            measured = (meta.get("history_within_log_var_by_target") or {}).get(target)
            band = (meta.get("history_within_band_var_by_target") or {}).get(target)
        self.within_log_var = measured if measured is not None else meta.get("history_within_log_var")
        self.within_band_var = band if band is not None else meta.get("history_within_band_var")
        self.metadata: dict[str, Any] = {
            "base": base.identity(),
            "kappa": self.kappa,
            "n_observed": len(self.observations),
        }

    @classmethod
    def from_epochs(
        cls,
        base: Predictor,
        epochs: Sequence[Mapping[str, np.ndarray]],
        kappa: float | None = None,
        decay: float | None = None,
    ) -> HistoryPredictor:
        """History from several earlier epochs, oldest first, on the newest epoch's level.

        Each older epoch is first rescaled to the newest one by the ratio of
        their geometric mean lengths over the prompts both saw (RL length
        growth is mostly such a common factor; see :func:`~aspc.predict.history_estimates.epoch_alignment`).
        Then epoch ``e`` of ``E`` weighs ``s_w**2 / (s_w**2 + q (E-1-e))``:
        an old observation is a measurement of today's level whose error has
        grown by the per-prompt drift ``q`` per epoch. ``q`` is estimated
        from the epochs (about 0 for a policy that does not drift: the epochs
        pool equally); where it cannot be, the older epochs weigh
        :data:`~aspc.predict.history_estimates.EPOCH_DECAY` per epoch. ``decay`` given: fixed weights
        ``decay**(E-1-e)`` after the rescaling.
        """
        if decay is not None and not 0 < decay <= 1:
            raise ConfigError(f"epoch decay {decay} must be in (0, 1]")
        suffix = _scout_suffix()
        epochs = [{str(k): np.atleast_1d(np.asarray(v, dtype=np.float64)) for k, v in e.items()
                   if not str(k).endswith(suffix)} for e in epochs]  # fmt: skip
        align = epoch_alignment(epochs)
        obs: dict[str, list[np.ndarray]] = {}
        wts: dict[str, list[np.ndarray]] = {}
        n_ep = len(epochs)
        for e, epoch in enumerate(epochs):
            lag = n_ep - 1 - e
            w = align.weight(lag) if decay is None else decay**lag
            for key, a in epoch.items():
                obs.setdefault(key, []).append(a * align.scale[e])
                wts.setdefault(key, []).append(np.full(len(a), w))
        hp = cls(
            base,
            {k: np.concatenate(v) for k, v in obs.items()},
            kappa,
            {k: np.concatenate(v) for k, v in wts.items()},
            within_log_var=align.within_log_var,
        )
        hp.metadata["epochs"] = align.summary()
        return hp

    def predict(self, texts: Sequence[str], *, ids: Sequence[str] | None = None) -> LengthPrediction:
        if ids is None:
            raise ConfigError("history predictions need prompt ids; pass ids= (PromptTable.ids)")
        if len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} prompts")
        ids = text_list(ids)  # an Arrow column too (PromptTable.id_array)
        base = self.base.predict(texts, ids=ids)
        w = None if self.weights is None else [self.weights.get(str(i)) for i in ids]
        observed = [self.observations.get(str(i)) for i in ids]
        kappa = self.kappa
        if self.fixed_kappa is None and self.within_log_var:
            kappa = estimate_kappa(base, observed, w, float(self.within_log_var), kappa)
        self.metadata["kappa_used"] = kappa
        return blend_history(base, observed, kappa, self.within_log_var, w, self.within_band_var)

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


def _scout_suffix() -> str:
    """The id suffix of a rolling scout's rows in a run log: no observations of a prompt, so never history.

    A cut scout response is truncated, and a kept one stands beside its prompt's other samples (those
    are enough, as for training pairs); counted, a rolling-scout log used as history reported twice its
    prompts in ``n_observed``.
    """
    from aspc.emit.schema import SCOUT_ID_SUFFIX

    return SCOUT_ID_SUFFIX
