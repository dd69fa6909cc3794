"""Prediction metrics against brute-force definitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.predict.base import LengthPrediction
from aspc.predict.metrics import (
    METRIC_KEYS,
    average_ranks,
    baseline_prediction,
    bucket_accuracy,
    coverage,
    evaluate,
    kendall_tau,
    marginal_summary,
    mean_over,
    spearman,
)


def naive_tau_b(x, y) -> float:
    """O(n^2) Kendall tau-b straight from the definition."""
    conc = disc = tx = ty = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            tx += 1
        elif dy == 0:
            ty += 1
        elif dx == dy:
            conc += 1
        else:
            disc += 1
    denom = np.sqrt((conc + disc + tx) * (conc + disc + ty))
    return 0.0 if denom == 0 else (conc - disc) / denom


def naive_ranks(a) -> np.ndarray:
    a = list(a)
    return np.array([sum(v < x for v in a) + (sum(v == x for v in a) + 1) / 2 for x in a])


small_ints = st.lists(st.integers(0, 6), min_size=0, max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_kendall_matches_brute_force(data) -> None:
    x = data.draw(small_ints)
    y = data.draw(st.lists(st.integers(0, 6), min_size=len(x), max_size=len(x)))
    assert kendall_tau(x, y) == pytest.approx(naive_tau_b(x, y), abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=30))
def test_average_ranks_match_brute_force(a) -> None:
    np.testing.assert_allclose(average_ranks(a), naive_ranks(a))


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_spearman_is_pearson_of_ranks(data) -> None:
    x = data.draw(st.lists(st.integers(0, 5), min_size=2, max_size=30))
    y = data.draw(st.lists(st.integers(0, 5), min_size=len(x), max_size=len(x)))
    rx, ry = naive_ranks(x), naive_ranks(y)
    expected = 0.0 if rx.std() == 0 or ry.std() == 0 else float(np.corrcoef(rx, ry)[0, 1])
    assert spearman(x, y) == pytest.approx(expected, abs=1e-9)


def test_kendall_extremes_and_scale() -> None:
    x = np.arange(1000.0)
    assert kendall_tau(x, x) == pytest.approx(1.0)
    assert kendall_tau(x, -x) == pytest.approx(-1.0)
    assert kendall_tau(np.ones(10), x[:10]) == 0.0
    # Large input: must be fast (O(n log n)), and near 0 for independent samples.
    rng = np.random.default_rng(0)
    assert abs(kendall_tau(rng.random(200_000), rng.random(200_000))) < 0.01


def test_bucket_accuracy_and_coverage() -> None:
    target = np.arange(100.0)
    assert bucket_accuracy(target, target) == 1.0
    assert bucket_accuracy(np.full(100, 50.0), target) == pytest.approx(0.1)
    pred = LengthPrediction(np.ones(2), np.array([1.0, 10.0]), np.array([2.0, 11.0]), np.array([3.0, 12.0]))
    assert coverage(pred, [np.array([1.0, 2.0, 4.0]), np.array([12.0])]) == pytest.approx(3 / 4)


def test_evaluate_keys_and_baseline() -> None:
    rng = np.random.default_rng(1)
    lengths = [rng.lognormal(5, 0.3, size=4) for _ in range(200)]
    marg = marginal_summary(lengths)
    base = evaluate(baseline_prediction(200, marg), lengths)
    assert set(METRIC_KEYS) <= set(base)
    assert base["kendall_tau"] == 0.0 and base["n"] == 200
    # The marginal band covers ~80% of the very lengths it was computed from.
    assert base["coverage_q10_q90"] == pytest.approx(0.8, abs=0.02)
    means = np.array([a.mean() for a in lengths])
    perfect = evaluate(LengthPrediction(means, means * 0.5, means, means * 2), lengths)
    assert perfect["kendall_tau"] == pytest.approx(1.0) and perfect["mae"] == pytest.approx(0.0)


@pytest.mark.parametrize("n", [0, 1, 2, 9, 10])
def test_figures_too_few_prompts_cannot_define_are_none(n) -> None:
    # Kendall τ of one prompt read 0.000 and its 10-bucket accuracy 1.000, as if measured.
    rng = np.random.default_rng(n)
    lengths = [rng.lognormal(5, 0.3, size=3) for _ in range(n)]
    means = np.array([a.mean() for a in lengths])
    got = evaluate(LengthPrediction(means, means * 0.5, means, means * 2), lengths)
    assert got["n"] == n
    assert (got["kendall_tau"] is None) == (got["spearman"] is None) == (n < 2)
    assert (got["bucket_accuracy"] is None) == (n < 10)
    assert (got["mae"] is None) == (got["coverage_q10_q90"] is None) == (n == 0)
    if n >= 2:
        assert got["kendall_tau"] == pytest.approx(1.0) and got["spearman"] == pytest.approx(1.0)
    # Averages over several sets skip the ones that leave a figure undefined.
    full = evaluate(LengthPrediction(means, means * 0.5, means, means * 2), lengths) if n >= 10 else None
    per = {"a": got, "b": {**got, "kendall_tau": 0.5, "bucket_accuracy": None}}
    avg = mean_over(per)
    assert avg["kendall_tau"] == pytest.approx(0.5 if n < 2 else 0.75)
    assert avg["bucket_accuracy"] == (None if full is None else full["bucket_accuracy"])


def test_rank_figures_of_equal_observed_lengths_are_none_and_of_a_flat_prediction_zero() -> None:
    rng = np.random.default_rng(0)
    equal = [np.full(3, 100.0) for _ in range(40)]
    pred = LengthPrediction(*(rng.uniform(50, 150, size=(4, 40)).cumsum(axis=0)))
    got = evaluate(pred, equal)
    assert got["kendall_tau"] is None and got["spearman"] is None and got["bucket_accuracy"] is None
    varied = [rng.lognormal(5, 0.3, size=3) for _ in range(40)]
    flat = evaluate(baseline_prediction(40, marginal_summary(varied)), varied)
    assert flat["kendall_tau"] == 0.0 and flat["spearman"] == 0.0  # a flat predictor ranks nothing


def test_length_prediction_validates_shapes() -> None:
    with pytest.raises(ValueError):
        LengthPrediction(np.ones(2), np.ones(3), np.ones(2), np.ones(2))
    p = LengthPrediction([1, 2], [1, 2], [1, 2], [1, 2])
    assert p.mean.dtype == np.float64 and len(p.take([1])) == 1
    assert len(LengthPrediction.concat([p, p])) == 4
