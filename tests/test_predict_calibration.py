"""Calibration keeps the ranking of the raw scores, is never flat, and the bulk kernel equals featurize."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.predict import load_predictor
from aspc.predict.base import LengthPrediction
from aspc.predict.calibration import MIN_SLOPE, Calibration, balanced_band_scale
from aspc.predict.ease import EASE_FAR_SLOPE, EASE_MARGIN, ease_lengths
from aspc.predict.features import FeatureConfig, featurize
from aspc.predict.lexical_kernel import hashed_scores
from aspc.predict.lexical_train import train_lexical
from aspc.predict.metrics import coverage, kendall_tau

ROOT = Path(__file__).resolve().parents[1]
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
NAMES = ["Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Mark", "Tina", "Ken", "Alexis"]
ITEMS = ["clips", "apples", "pages", "dollars", "eggs", "marbles", "cookies", "tickets", "books", "miles"]


def gsm8k_style(n: int, seed: int = 0) -> list[dict]:
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them: a chat prompt, question + instruction."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        name, item = NAMES[rng.integers(len(NAMES))], ITEMS[rng.integers(len(ITEMS))]
        a, b, c = (int(x) for x in rng.integers(2, 400, size=3))
        steps = " ".join(
            f"Then {NAMES[rng.integers(len(NAMES))]} gives away {int(rng.integers(1, 50))} {item}."
            for _ in range(int(rng.integers(0, 5)))
        )
        q = (
            f"{name} sold {item} to {a} of her friends in April, and then she sold half as many {item} "
            f"in May. {steps} Each of the {b} boxes holds {c} {item}. How many {item} did {name} sell "
            f"altogether in April and May?"
        )
        rows.append({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{q} {GSM8K_INSTRUCTION}"}],
                     "ability": "math", "extra_info": {"index": i}})  # fmt: skip
    return rows


def _texts_of(rows: list[dict]) -> list[str]:
    return ["\n\n".join(m["content"] for m in r["prompt"]) for r in rows]


def test_default_is_never_flat_on_gsm8k_and_examples() -> None:
    pred = load_predictor("default")
    gsm = pred.predict(_texts_of(gsm8k_style(300)))
    assert len(np.unique(gsm.mean)) >= 150, "at least half of the predictions must be distinct"
    ex = [json.loads(line)["prompt"] for line in (ROOT / "examples" / "prompts.jsonl").read_text().splitlines()]
    p = pred.predict(ex)
    assert len(np.unique(p.mean)) >= len(ex) // 2
    assert np.all(p.q10 <= p.q50) and np.all(p.q50 <= p.q90) and np.all(p.q10 > 0)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(60, 400), noise=st.floats(0.0, 3.0))
def test_calibration_is_strictly_increasing(seed: int, n: int, noise: float) -> None:
    rng = np.random.default_rng(seed)
    y = rng.normal(5.5, 1.0, size=n)
    # Scores may be unrelated to the truth (noise large): the map must still not flatten.
    level = 5.5 + (y - 5.5) * rng.uniform(-0.5, 1.0) + rng.normal(0, noise, size=n)
    lengths = [np.exp(lv + rng.normal(0, 0.4, size=rng.integers(1, 6))) for lv in level]
    cal = Calibration.fit(y, lengths)
    grid = np.sort(np.concatenate([y, np.linspace(y.min() - 3, y.max() + 3, 200)]))
    p = cal.apply(grid)
    for a in (p.mean, p.q50, p.q90):
        assert np.all(np.diff(np.log(a)) > 0)
    assert np.all(np.diff(np.log(p.mean)) >= MIN_SLOPE * cal.slope * np.diff(grid) - 1e-12)
    assert np.all(p.q10 <= p.q50) and np.all(p.q50 <= p.q90)
    assert kendall_tau(p.mean, grid) == pytest.approx(1.0)


def test_band_is_honest_out_of_fold() -> None:
    rng = np.random.default_rng(1)
    y = rng.normal(5.5, 0.8, size=3000)
    lengths = [np.exp(v + rng.normal(0, 0.3) + rng.normal(0, 0.35, size=4)) for v in y]
    cal = Calibration.fit(y[:2000], lengths[:2000])
    assert coverage(cal.apply(y[2000:]), lengths[2000:]) == pytest.approx(0.8, abs=0.03)


def test_balanced_band_scale_widens_for_an_odd_source() -> None:
    rng = np.random.default_rng(2)
    groups = np.repeat(np.arange(4), [600, 600, 600, 100])
    y = rng.normal(5.5, 0.8, size=len(groups))
    shift = np.where(groups == 3, 1.0, 0.0)  # one small source the scores know nothing about
    lengths = [np.exp(v + s + rng.normal(0, 0.3, size=3)) for v, s in zip(y, shift, strict=True)]
    scale = balanced_band_scale(y, lengths, groups)
    assert scale > 1.05
    p = Calibration.fit(y, lengths, band_scale=scale).apply(y)
    per = [coverage(p.take(np.flatnonzero(groups == g)), [lengths[i] for i in np.flatnonzero(groups == g)])
           for g in range(4)]  # fmt: skip
    assert np.mean(per) >= 0.8 - 1e-6


def test_malformed_calibration_arrays_are_rejected() -> None:
    arrays = {"c_centers": np.array([1.0, 0.5]), "c_curves": np.zeros((2, 4)), "c_slope": np.array([1.0])}
    with pytest.raises(ValueError, match="malformed"):
        Calibration.from_arrays(arrays, "c_")


@pytest.mark.parametrize(
    "config",
    [FeatureConfig(), FeatureConfig(head_bytes=40, tail_bytes=16), FeatureConfig(word_bigrams=False, bits=12)],
)
def test_bulk_kernel_equals_featurize(config: FeatureConfig) -> None:
    rng = np.random.default_rng(3)
    vocab = ["abc", "DEF", "gh\nij", "k_l", "12", "é", "ü", "中文", "—", "x\x00y", "\n", "  ", "\ud800", "a.b"]
    texts = [" ".join(rng.choice(vocab, size=int(rng.integers(0, 900)))) for _ in range(200)]
    texts += ["", " ", "!!!", "a", "A" * 5000]
    beta = rng.normal(size=1 << config.bits)
    f = featurize(texts, config)
    score, dense = hashed_scores(texts, config, beta)
    np.testing.assert_allclose(score, f.hashed_matvec(beta), rtol=0, atol=1e-9)
    np.testing.assert_array_equal(dense, f.dense)


def test_bulk_kernel_rejects_char_ngrams() -> None:
    with pytest.raises(ValueError, match="char n-grams|word and bigram"):
        hashed_scores(["x"], FeatureConfig(char_ngrams=(3,)), np.zeros(1 << 18))


def test_target_band_widens_only_a_target_whose_sources_disagree() -> None:
    from aspc.predict.calibration import target_band, with_pooled_band

    rng = np.random.default_rng(5)
    groups = np.repeat(np.arange(4), 500)
    y = rng.normal(5.5, 0.8, size=len(groups))

    def lengths_for(source_shift):
        return [np.exp(v + source_shift[g] + rng.normal(0, 0.3, size=3)) for v, g in zip(y, groups, strict=True)]

    calm = lengths_for(np.zeros(4))
    odd = lengths_for(np.array([0.0, 0.0, 0.0, 1.2]))  # this target is far off on one source
    pooled_l = calm + odd
    pooled_y, pooled_g = np.concatenate([y, y]), np.concatenate([groups, groups])
    pooled = Calibration.fit(pooled_y, pooled_l)
    for lengths, widened in ((calm, False), (odd, True)):
        own = Calibration.fit(y, lengths)
        cal, f = target_band(own, pooled, 0.0, y, lengths, groups, pooled_y, pooled_l, pooled_g)
        assert (f > 1.05) == widened, f
        p = cal.apply(y)
        np.testing.assert_allclose(p.q50, own.apply(y).q50, rtol=1e-9)  # the level is the target's own
        assert np.all(p.q10 <= p.q50) and np.all(p.q50 <= p.q90)
    # Scale 1: exactly the shared band (pooled offsets read at y - shift about the own median).
    own = Calibration.fit(y, calm)
    grid = np.linspace(y.min() - 1, y.max() + 1, 300)
    b = with_pooled_band(own, pooled, 0.4, 1.0).apply(grid)
    o, pb = own.apply(grid), pooled.apply(grid - 0.4)
    np.testing.assert_allclose(b.q90, o.q50 * pb.q90 / pb.q50, rtol=1e-6)
    np.testing.assert_allclose(b.q10, o.q50 * pb.q10 / pb.q50, rtol=1e-6)


def test_scores_far_past_the_training_prompts_stay_sane_lengths() -> None:
    """A model fitted on prompts of at most 4 KB, asked about 1 KB to 1 MB ones (a pasted document).

    The lexical features grow with log-size squared; a straight continuation of the calibration took
    the 1 MB prompt to 1.5e10 tokens and ``aspc compile`` refused its own predictions.
    """
    rows = [json.loads(line) for line in (ROOT / "examples" / "prompts.jsonl").read_text().splitlines()][:200]
    pred = train_lexical([r["prompt"] for r in rows], [np.asarray(r["lengths"][:1], float) for r in rows], seed=0)
    longest = max(r["lengths"][0] for r in rows)
    doc = (ROOT / "README.md").read_text() * 40
    p = pred.predict(["Summarize this document:\n" + doc[: k * 1000] for k in (1, 5, 20, 50, 1000)])
    for a in (p.mean, p.q10, p.q50, p.q90):
        assert np.all(np.isfinite(a)) and np.all(a > 0)
    assert p.q90.max() < 100 * longest, f"{p.q90.max():.3g} tokens for prompts whose answers ran to {longest}"


def test_lengths_past_the_bounds_ease_to_the_least_slope() -> None:
    seen = (np.log(10.0), np.log(1000.0))
    lo, hi = 10.0 / EASE_MARGIN, 1000.0 * EASE_MARGIN
    a = np.array([lo, 500.0, hi, hi * (1 + 1e-9), hi * np.exp(50.0), lo * np.exp(-50.0)])
    p = ease_lengths(LengthPrediction(a, a, a, a), seen)
    np.testing.assert_allclose(p.mean[:3], a[:3], rtol=1e-12)  # within the bounds: as they were
    assert np.log(p.mean[3] / hi) == pytest.approx(1e-9, rel=1e-3)  # slope 1 at the bound
    # 50 e-folds past: EASE_FAR_SLOPE * 50 + (1 - EASE_FAR_SLOPE) * ln 2, not 50.
    far = EASE_FAR_SLOPE * 50 + (1 - EASE_FAR_SLOPE) * np.log(2.0)
    assert np.log(p.mean[4] / hi) == pytest.approx(far, rel=1e-9)
    assert np.log(lo / p.mean[5]) == pytest.approx(far, rel=1e-9)
    grid = np.exp(np.linspace(-100, 100, 20001))
    assert np.all(np.diff(ease_lengths(LengthPrediction(grid, grid, grid, grid), seen).q90) > 0)  # ranks kept
