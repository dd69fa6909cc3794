"""Minibatch cost models against independent oracles."""

from __future__ import annotations

import naive
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.costs import minibatch_costs
from aspc.costs.kernel import Z90
from aspc.errors import ConfigError


@settings(max_examples=50, deadline=None)
@given(
    lens=st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=30),
    cuts=st.lists(st.integers(1, 29), max_size=6),
    n=st.integers(1, 4),
)
def test_padded_matches_brute_force(lens, cuts, n):
    x = np.asarray(lens)
    starts = np.unique(np.r_[0, [c for c in cuts if c < x.size], x.size]).astype(np.int64)
    got = minibatch_costs("padded", starts, np.full(x.size, n), x)
    want = naive.padded_costs(x, starts, n)
    np.testing.assert_allclose(got, want)


def _lognormal_emax_mc(q10, q50, q90, n, draws=400_000, seed=0):
    rng = np.random.default_rng(seed)
    mu = np.log(q50)
    sigma = (np.log(q90) - np.log(q10)) / (2 * Z90)
    samples = rng.lognormal(mu[:, None, None], sigma[:, None, None], size=(mu.size, n, draws // 100))
    return samples.max(axis=(0, 1)).mean()


@pytest.mark.parametrize("n", [1, 4])
def test_expected_max_matches_monte_carlo(n):
    q10 = np.array([80.0, 200.0, 150.0])
    q50 = np.array([100.0, 260.0, 300.0])
    q90 = np.array([130.0, 330.0, 600.0])
    got = minibatch_costs("expected-max", np.array([0, 3]), np.full(3, n), q50, q10, q50, q90)[0]
    want = 3 * n * _lognormal_emax_mc(q10, q50, q90, n)
    assert got == pytest.approx(want, rel=0.01)


def test_expected_max_point_masses_reduce_to_padded():
    x = np.array([10.0, 40.0, 25.0, 7.0])
    starts = np.array([0, 2, 4])
    got = minibatch_costs("expected-max", starts, np.full(4, 2), x, x, x, x)
    np.testing.assert_allclose(got, minibatch_costs("padded", starts, np.full(4, 2), x))


def test_expected_max_exceeds_max_median():
    q50 = np.array([100.0, 100.0])
    got = minibatch_costs("expected-max", np.array([0, 2]), np.ones(2), q50, q50 * 0.7, q50, q50 * 1.4)[0]
    assert got > 2 * 100.0


def test_bad_boundaries_and_model():
    with pytest.raises(ConfigError, match="start at 0"):
        minibatch_costs("padded", np.array([1, 3]), np.ones(3), np.ones(3))
    with pytest.raises(ConfigError, match="empty minibatch"):
        minibatch_costs("padded", np.array([0, 2, 2, 3]), np.ones(3), np.ones(3))
    with pytest.raises(ConfigError, match="unknown cost model"):
        minibatch_costs("wat", np.array([0, 3]), np.ones(3), np.ones(3))
