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


def _epochs(rng, n_prompts: int, n_epochs: int, growth: float, prompt_drift: float, sd: float = 0.3):
    """Epochs of one sample per prompt: levels grow by ``growth`` per epoch and wander by ``prompt_drift``."""
    level = rng.normal(5.5, 0.8, size=n_prompts)
    out = []
    for _ in range(n_epochs):
        out.append({f"p{i}": np.exp([level[i] + rng.normal(0, sd)]) for i in range(n_prompts)})
        level = level + np.log(growth) + rng.normal(0, prompt_drift, size=n_prompts)
    return out, level - np.log(growth) - 0  # the newest epoch's levels (before the last step)


def test_drifting_epochs_are_rescaled_and_recent_ones_weigh_more() -> None:
    from aspc.predict.history_estimates import epoch_alignment

    rng = np.random.default_rng(0)
    epochs, _ = _epochs(rng, 300, 3, growth=1.5, prompt_drift=0.25)
    align = epoch_alignment(epochs)
    # Older epochs are lifted to the newest one's level: 1.5**2 and 1.5 (within sampling error).
    np.testing.assert_allclose(align.scale, [2.25, 1.5, 1.0], rtol=0.08)
    w = [align.weight(lag) for lag in (2, 1, 0)]
    assert w[0] < w[1] < w[2] == 1.0  # prompts wander on their own: older epochs count less
    hp = HistoryPredictor.from_epochs(Constant(100.0), epochs)
    ids = list(epochs[-1])
    pred = hp.predict(ids, ids=ids)
    newest = np.array([epochs[-1][k][0] for k in ids])
    # Followed to the newest level (not dragged down to the average of the three epochs).
    assert abs(np.mean(np.log(pred.q50)) - np.mean(np.log(newest))) < 0.06
    assert hp.metadata["epochs"]["weights"][-1] == 1.0


def test_epochs_that_do_not_drift_are_pooled_nearly_equally() -> None:
    from aspc.predict.history_estimates import epoch_alignment

    rng = np.random.default_rng(1)
    for n_epochs in (2, 3, 4):
        epochs, _ = _epochs(rng, 400, n_epochs, growth=1.0, prompt_drift=0.0)
        align = epoch_alignment(epochs)
        np.testing.assert_allclose(align.scale, 1.0, atol=0.04)
        assert min(align.weight(lag) for lag in range(n_epochs)) > 0.85, (n_epochs, align)
        assert align.within_log_var == pytest.approx(0.09, rel=0.25)  # measured from the epochs


def test_pure_growth_of_two_epochs_follows_the_newest() -> None:
    """Two epochs, every prompt 2x longer in the newer one: the prediction sits at the newer level."""
    rng = np.random.default_rng(2)
    level = rng.normal(5.5, 0.8, size=100)
    old = {f"p{i}": np.exp([level[i]]) for i in range(100)}
    new = {f"p{i}": np.exp([level[i] + np.log(2.0)]) for i in range(100)}
    ids = list(new)
    pred = HistoryPredictor.from_epochs(Constant(100.0), [old, new]).predict(ids, ids=ids)
    # log 2 = 0.69 between the epochs; what is left is the prior's small pull (kappa ~ 0.03).
    np.testing.assert_allclose(np.log(pred.q50), np.log([new[k][0] for k in ids]), atol=0.1)
    swapped = HistoryPredictor.from_epochs(Constant(100.0), [new, old]).predict(ids, ids=ids)
    np.testing.assert_allclose(np.log(swapped.q50), np.log([old[k][0] for k in ids]), atol=0.1)


def test_empirical_bayes_kappa_from_the_observations() -> None:
    """kappa = s_w^2 / s_b^2 estimated from how far the base is off on the observed prompts."""
    from aspc.predict.history_estimates import estimate_kappa

    rng = np.random.default_rng(3)
    n, s_w, s_b = 3000, 0.3, 0.6
    theta = rng.normal(5.5, 1.0, size=n)
    m = np.exp(theta + rng.normal(0, s_b, size=n))
    base = LengthPrediction(m, m * 0.5, m, m * 2)
    for k in (1, 3):
        obs = [np.exp(t + rng.normal(0, s_w, size=k)) for t in theta]
        # log of the arithmetic mean of k lognormal samples sits ~s_w^2/2 above theta: allow for it.
        assert estimate_kappa(base, obs, None, s_w**2, 9.0) == pytest.approx(s_w**2 / s_b**2, rel=0.25)
    assert estimate_kappa(base, [None] * n, None, s_w**2, 9.0) == 9.0  # nothing observed: the fallback
    few = [np.array([100.0])] * 5 + [None] * (n - 5)
    assert estimate_kappa(base, few, None, s_w**2, 9.0) == 9.0


def test_history_band_covers_new_samples_of_heavy_tailed_prompts() -> None:
    """The band from two epochs covers ~80% of a prompt's next samples, also with runaway samples."""
    rng = np.random.default_rng(4)
    n = 2000
    level = rng.normal(5.5, 0.8, size=n)

    def draw(size):  # mostly N(0, 0.15), 8% runaways 1.0 log-units long: heavy-tailed
        e = rng.normal(0, 0.15, size=(n, size))
        return e + np.where(rng.random((n, size)) < 0.08, rng.normal(0, 1.0, size=(n, size)), 0.0)

    past = np.exp(level[:, None] + draw(2))
    future = np.exp(level[:, None] + draw(8))
    ids = [f"p{i}" for i in range(n)]
    epochs = [{k: past[i, e : e + 1] for i, k in enumerate(ids)} for e in (0, 1)]
    pred = HistoryPredictor.from_epochs(Constant(300.0), epochs).predict(ids, ids=ids)
    inside = (future >= pred.q10[:, None]) & (future <= pred.q90[:, None])
    assert inside.mean() == pytest.approx(0.8, abs=0.05)


def test_within_spread_estimators_equal_their_per_prompt_definitions() -> None:
    from aspc.predict.calibration import log_band_var
    from aspc.predict.history_estimates import MIN_PROMPTS, within_band_var, within_log_var_of

    rng = np.random.default_rng(6)
    obs = [rng.lognormal(5.0, 0.5, size=int(rng.integers(1, 6))) for _ in range(300)] + [None, np.empty(0)]
    multi = [np.log(np.maximum(a, 1.0)) for a in obs if a is not None and len(a) >= 2]
    assert within_log_var_of(obs) == pytest.approx(np.mean([np.var(a, ddof=1) for a in multi]), rel=1e-9)
    assert within_band_var(obs) == pytest.approx(log_band_var(multi), rel=1e-9)
    assert within_log_var_of(obs[: MIN_PROMPTS // 2]) is None and within_band_var([np.ones(1)] * 100) is None


def _blend_oracle(base, observed, kappa, within_log_var, weights, within_band):
    """blend_history written prompt by prompt with np.quantile: what the flat passes must equal."""
    from aspc.predict.history import BAND_KAPPA

    out = [[], [], [], []]
    for i, a in enumerate(observed):
        m, q10, q50, q90 = base.mean[i], base.q10[i], base.q50[i], base.q90[i]
        lo, hi = np.log(q10 / q50), np.log(q90 / q50)
        if a is not None and len(a):
            a = np.maximum(np.asarray(a, dtype=np.float64), 1.0)
            w_i = np.ones(len(a)) if weights is None or weights[i] is None else np.asarray(weights[i])
            k = w_i.sum()
            w = k / (k + kappa)
            new_m = m * np.exp(w * (np.log(w_i @ a / k) - np.log(m)))
            new_q50 = q50 * np.exp(w * (w_i @ np.log(a) / k - np.log(q50)))
            if within_log_var:
                post = np.sqrt((within_band or within_log_var) + within_log_var / (k + kappa))
                narrow = min(1.0, post / max((hi - lo) / (2 * 1.2816), 1e-9))
                lo, hi = narrow * lo, narrow * hi
            if len(a) >= 2:
                p10, p50, p90 = np.quantile(a, [0.1, 0.5, 0.9])
                w2 = max(k - 1, 0.0) / (max(k - 1, 0.0) + BAND_KAPPA)
                lo, hi = (1 - w2) * lo + w2 * np.log(p10 / p50), (1 - w2) * hi + w2 * np.log(p90 / p50)
            m, q50 = new_m, new_q50
        for j, v in enumerate((m, q50 * np.exp(min(lo, 0.0)), q50, q50 * np.exp(max(hi, 0.0)))):
            out[j].append(v)
    return [np.array(o) for o in out]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 40),
    weighted=st.booleans(),
    spread=st.sampled_from([None, (0.05, None), (0.08, 0.03)]),
)
def test_flat_blend_equals_the_per_prompt_definition(seed, n, weighted, spread) -> None:
    rng = np.random.default_rng(seed)
    m = rng.lognormal(5.5, 1.0, size=n)
    base = LengthPrediction(m, m * rng.uniform(0.2, 0.9, n), m * rng.uniform(0.9, 1.0, n), m * rng.uniform(1.1, 3, n))
    observed = [None if rng.random() < 0.2 else rng.lognormal(5.5, 0.7, size=int(rng.integers(0, 7))) for _ in range(n)]
    if rng.random() < 0.3 and n:
        observed[0] = np.array([0.0, 0.5, 3.0])  # below one token: counted as 1
    weights = None
    if weighted:
        weights = [None if a is None or rng.random() < 0.3 else rng.uniform(0.05, 1.0, len(a)) for a in observed]
    s_w, s_band = spread if spread else (None, None)
    got = blend_history(base, observed, 0.3, s_w, weights, s_band)
    want = _blend_oracle(base, observed, 0.3, s_w, weights, s_band)
    for g, w in zip((got.mean, got.q10, got.q50, got.q90), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-9)


def test_bad_weights_name_the_prompt() -> None:
    pred = base_pred(100.0, 2)
    with pytest.raises(ValueError, match="prompt 1"):
        blend_history(pred, [np.array([1.0]), np.array([5.0, 6.0])], 1.0, weights=[None, np.array([0.5, 1.5])])
    with pytest.raises(ValueError, match="prompt 0"):
        blend_history(pred, [np.array([1.0]), None], 1.0, weights=[np.array([0.5, 0.5]), None])


def test_a_zero_length_base_blends_as_one_token() -> None:
    # Known lengths of 0 give a plan's prediction of 0; the blend works in log space and made
    # every figure NaN ('length nan', refused), so 'aspc run --epochs 2' failed at epoch 2.
    zero = LengthPrediction(*(np.array([0.0, 0.0, 200.0]) for _ in range(4)))
    got = blend_history(zero, [np.array([0.0, 0.0]), None, np.array([300.0])], 4.0)
    for a in (got.mean, got.q10, got.q50, got.q90):
        assert np.all(np.isfinite(a)) and np.all(a >= 1.0)
    assert got.mean[1] == 1.0  # nothing observed: the base, counted as 1 token like an observation


def test_epochs_run_over_prompts_whose_responses_were_all_empty(tmp_path) -> None:
    import json

    from click.testing import CliRunner

    from aspc.cli import main

    rng = np.random.default_rng(0)
    data = tmp_path / "z.jsonl"
    with open(data, "w") as fh:
        for i in range(80):
            lens = [0, 0, 0] if i == 5 else rng.integers(1, 500, size=3).tolist()
            fh.write(json.dumps({"id": f"p{i}", "prompt": f"question {i}", "lengths": lens}) + "\n")
    plan = tmp_path / "plan.parquet"
    assert CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "-o", str(plan), "-q"]).exit_code == 0
    r = CliRunner().invoke(main, ["run", str(plan), "--epochs", "2", "--actual-lengths", str(data), "--length-field",
                                  "lengths", "--log", str(tmp_path / "RUN"), "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
