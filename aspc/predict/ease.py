"""Predictions far outside the lengths a predictor was fitted on, pulled in (extrapolation kept in bounds).

A predictor asked about a prompt far unlike its training prompts extrapolates:
the lexical features grow with log-size squared, and a 1 MB prompt through a
model fitted on 4 KB ones got 1.5e10 tokens, which ``aspc compile`` then
refused as its own predictions (a 50 KB one got 1.1M, silently).
"""

from __future__ import annotations

import math

import numpy as np

from aspc import portable_math as pm
from aspc.errors import PredictorError
from aspc.predict.base import LengthPrediction, finite_number
from aspc.predict.calibration import Calibration

EASE_MARGIN = 4.0
"""How far (a factor) past the lengths a predictor was fitted on :func:`ease_lengths` leaves its
predictions as they are."""
EASE_FAR_SLOPE = 0.02
"""Slope (log tokens per log token) :func:`ease_lengths` eases to far past its bounds: small, so a prompt
unlike any seen stays near the bound, but positive, so distinct predictions stay distinct."""


def ease_lengths(p: LengthPrediction, seen: tuple[float, float]) -> LengthPrediction:
    """``p`` with medians far outside ``seen`` (log tokens) pulled in, by one increasing map.

    The bounds are ``EASE_MARGIN`` times beyond ``seen`` (:func:`seen_lengths`), so
    extrapolation that stays near the lengths the predictor was fitted on is kept. Past a bound by
    ``d`` (log tokens) the median moves ``EASE_FAR_SLOPE * d + (1 - EASE_FAR_SLOPE) * ln 2 * tanh(d / ln 2)``:
    about a factor of two more, then barely rising; mean, q10 and q90 move with it by the same
    factor, so the band keeps its width (a prompt unlike any seen is no more certain). The map is
    strictly increasing (ranks kept) and leaves a prediction whose median is within the bounds as it was.
    """
    margin = math.log(EASE_MARGIN)
    lo, hi = seen[0] - margin, seen[1] + margin
    lo_t, hi_t = (float(x) for x in pm.exp(np.array([lo, hi])))
    inside = (p.q50 >= lo_t) & (p.q50 <= hi_t)
    if np.all(inside):
        return p
    v = pm.log(np.maximum(p.q50, np.finfo(np.float64).tiny))
    eased = np.clip(v, lo, hi) + _eased(np.maximum(v - hi, 0.0)) - _eased(np.maximum(lo - v, 0.0))
    with np.errstate(invalid="ignore"):  # an inf or nan median (corrupt weights) stays nan: callers refuse it
        factor = np.where(inside, 1.0, pm.exp(eased - v))
    return LengthPrediction(*(np.where(inside, a, a * factor) for a in (p.mean, p.q10, p.q50, p.q90)))


def seen_lengths(metadata: dict, *cals: Calibration, spread: tuple[float, float] | None = None) -> tuple[float, float]:
    """The log lengths a predictor was fitted on: the training lengths' range (``marginal`` ``min`` and
    ``max`` in its metadata; predictors saved before it was recorded have none), widened to what its
    calibrations reach (q10 at the lowest centre, q90 at the highest) or to ``spread``.

    Raises PredictorError if the recorded range is malformed (a hand edit).
    """
    lo, hi = np.inf, -np.inf
    for c in cals:
        lo, hi = min(lo, float(c.curves[0].min())), max(hi, float(c.curves[-1].max()))
    if spread is not None:
        lo, hi = min(lo, spread[0]), max(hi, spread[1])
    fitted = marginal_range(metadata)
    if fitted is not None:
        lo, hi = min(lo, math.log(max(fitted[0], 1.0))), max(hi, math.log(max(fitted[1], 1.0)))
    return lo, hi


def marginal_range(metadata: dict) -> tuple[float, float] | None:
    """The training lengths' ``marginal`` ``min`` and ``max`` (``None`` where not recorded).

    Raises PredictorError if they are malformed (a hand edit); loading checks this up front, so the
    error names the predictor's directory instead of surfacing later at the first prediction.
    """
    marginal = metadata.get("marginal")
    if not (isinstance(marginal, dict) and ("min" in marginal or "max" in marginal)):
        return None
    a, b = marginal.get("min"), marginal.get("max")
    if not all(finite_number(x) and x >= 0 for x in (a, b)) or a > b:
        shown = f"{repr(a)[:40]}/{repr(b)[:40]}"  # a JSON integer may have hundreds of digits
        raise PredictorError(f"predictor metadata marginal min/max {shown} are not lengths min <= max; retrain it")
    return float(a), float(b)


def _eased(d: np.ndarray) -> np.ndarray:
    """``EASE_FAR_SLOPE * d + (1 - EASE_FAR_SLOPE) * s * tanh(d / s)`` for ``d >= 0``, ``s = ln 2``; tanh
    through the portable expm1 (NumPy's tanh is SIMD code whose bits vary by CPU)."""
    s = math.log(2.0)
    e = pm.expm1(2.0 * np.minimum(d / s, 20.0))  # tanh(20) is 1.0 in float64; inf / inf would be nan
    return EASE_FAR_SLOPE * d + (1.0 - EASE_FAR_SLOPE) * s * (e / (e + 2.0))
