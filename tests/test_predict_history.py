"""History blending: moves toward observations, monotonically, with sane quantiles."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.errors import ConfigError, PredictorError
from aspc.predict import HistoryPredictor, LengthPrediction, Predictor, blend_history


def base_pred(mean: float, n: int = 1) -> LengthPrediction:
    m = np.full(n, mean)
    return LengthPrediction(m, m * 0.5, m * 0.95, m * 1.8)


class Constant(Predictor):
    kind = "constant"

    def __init__(self, mean: float) -> None:
        self.mean = mean
        self.metadata: dict[str, Any] = {"history_kappa": 0.5, "history_within_log_var": 0.05}

    def predict(self, texts: Sequence[str], *, ids: Sequence[str] | None = None) -> LengthPrediction:
        return base_pred(self.mean, len(texts))

    def save(self, path) -> None:  # pragma: no cover - not used
        raise NotImplementedError

    def content_hash(self) -> str:
        return "c" * 64


lengths_st = st.floats(1.0, 20000.0)


@settings(max_examples=200, deadline=None)
@given(base=lengths_st, obs=lengths_st, kappa=st.floats(0.01, 10.0), k=st.integers(1, 12))
def test_moves_monotonically_toward_observations(base, obs, kappa, k) -> None:
    pred = base_pred(base)
    prev = pred.mean[0]
    lo, hi = min(base, obs), max(base, obs)
    for j in range(1, k + 1):
        out = blend_history(pred, [np.full(j, obs)], kappa)
        m = out.mean[0]
        assert lo * (1 - 1e-9) <= m <= hi * (1 + 1e-9)
        # Each extra observation moves the estimate further toward it, never past it.
        assert abs(np.log(m) - np.log(obs)) <= abs(np.log(prev) - np.log(obs)) + 1e-12
        assert out.q10[0] <= out.q50[0] <= out.q90[0]
        prev = m


@settings(max_examples=100, deadline=None)
@given(base=lengths_st, a=lengths_st, b=lengths_st, kappa=st.floats(0.01, 10.0))
def test_monotone_in_the_observed_value(base, a, b, kappa) -> None:
    lo, hi = min(a, b), max(a, b)
    out = blend_history(base_pred(base, 2), [np.array([lo]), np.array([hi])], kappa, within_log_var=0.1)
    assert out.mean[0] <= out.mean[1] * (1 + 1e-12)
    assert out.q50[0] <= out.q50[1] * (1 + 1e-12)


def test_weights_follow_k_over_k_plus_kappa() -> None:
    pred = base_pred(100.0, 3)
    out = blend_history(pred, [None, np.array([400.0]), np.full(9, 400.0)], kappa=1.0)
    assert out.mean[0] == 100.0 and out.q90[0] == pred.q90[0]  # no history: unchanged
    np.testing.assert_allclose(np.log(out.mean[1] / 100), 0.5 * np.log(4))
    np.testing.assert_allclose(np.log(out.mean[2] / 100), 0.9 * np.log(4))


def test_band_narrows_and_follows_observed_spread() -> None:
    pred = base_pred(300.0, 3)
    obs = [np.array([300.0]), np.array([290.0, 300.0, 310.0, 305.0, 295.0] * 4), np.array([300.0])]
    out = blend_history(pred, obs, kappa=0.5, within_log_var=0.01)
    base_width = np.log(pred.q90 / pred.q10)
    width = np.log(out.q90 / out.q10)
    assert width[0] < base_width[0]
    assert width[1] < width[0]  # many tightly clustered observations: a tight band
    keep = blend_history(pred, obs, kappa=0.5)  # no within-prompt variance: width kept for k = 1
    np.testing.assert_allclose(np.log(keep.q90[0] / keep.q10[0]), base_width[0])


def test_history_predictor_uses_ids() -> None:
    hp = HistoryPredictor(Constant(100.0), {"a": np.array([1000.0]), "b": np.array([10.0, 12.0])})
    out = hp.predict(["x", "y", "z"], ids=["a", "b", "c"])
    assert out.mean[0] > 100 > out.mean[1] and out.mean[2] == 100
    assert hp.coverage(["a", "c"]) == 1 and hp.kappa == 0.5
    ident = hp.identity()
    assert ident["kind"] == "history" and ident["base"]["kind"] == "constant" and len(ident["hash"]) == 64
    with pytest.raises(ConfigError, match="ids"):
        hp.predict(["x"])
    with pytest.raises(PredictorError, match="base predictor"):
        hp.save("anywhere")
    with pytest.raises(ConfigError, match="kappa"):
        HistoryPredictor(Constant(1.0), {}, kappa=0.0)


def test_recent_epochs_weigh_more() -> None:
    from aspc.predict.base import LengthPrediction
    from aspc.predict.history import HistoryPredictor

    class Flat:
        kind = "flat"
        metadata = {"history_kappa": 1.0}

        def predict(self, texts, *, ids=None):
            n = len(texts)
            return LengthPrediction(np.full(n, 100.0), np.full(n, 50.0), np.full(n, 100.0), np.full(n, 200.0))

        def identity(self):
            return {"kind": "flat"}

        def content_hash(self):
            return "0"

    old, new = {"a": np.array([100.0])}, {"a": np.array([400.0])}
    equal = HistoryPredictor.from_epochs(Flat(), [old, new], decay=1.0).predict(["x"], ids=["a"]).mean[0]
    recent = HistoryPredictor.from_epochs(Flat(), [old, new]).predict(["x"], ids=["a"]).mean[0]
    swapped = HistoryPredictor.from_epochs(Flat(), [new, old]).predict(["x"], ids=["a"]).mean[0]
    assert swapped < equal < recent
    # One epoch only: the same as the plain history predictor.
    plain = HistoryPredictor(Flat(), new).predict(["x"], ids=["a"]).mean[0]
    assert HistoryPredictor.from_epochs(Flat(), [new]).predict(["x"], ids=["a"]).mean[0] == pytest.approx(plain)
