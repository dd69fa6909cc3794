"""Kernel edge inputs through their public wrappers: the same answer compiled and under NUMBA_DISABLE_JIT=1."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from aspc.predict.features import FeatureConfig, featurize
from aspc.predict.lexical_kernel import hashed_scores


def test_featurize_tail_bytes_zero_matches_bulk_kernel() -> None:
    # tail_bytes=0 is a valid FeatureConfig (0..MAX_SLICE_BYTES), e.g. from a saved predictor's config.
    # Training uses featurize, prediction hashed_scores: they must see the same words.
    cfg = FeatureConfig(bits=10, head_bytes=8, tail_bytes=0, word_bigrams=True)
    texts = ["alpha beta gamma delta epsilon zeta eta theta", "short", "one two three four five six seven"]
    beta = np.random.default_rng(0).normal(size=1 << cfg.bits)
    score, dense = hashed_scores(texts, cfg, beta)
    f = featurize(texts, cfg)
    np.testing.assert_array_equal(f.dense, dense)  # word counts (dense col) from the same bytes
    np.testing.assert_allclose(f.hashed_matvec(beta), score, rtol=0, atol=1e-9)


def test_balance_subnormal_costs_do_not_crash() -> None:
    # Costs this small come from a user's file: known lengths such as 5e-324 with -b 1
    # (`aspc compile f.jsonl --length-field length -b 1 -g 2` exits 1 with a traceback under JIT,
    # and succeeds under NUMBA_DISABLE_JIT=1, where np.float64 / 0.0 is inf).
    from aspc.anneal import balance

    costs = np.array([5e-324] * 3 + [1e-323] * 3 + [0.0] * 2)
    with warnings.catch_warnings():
        # Interpreted, 1 / (2 sum(costs)) overflowing to inf made the energy inf * 0 = NaN (a warning).
        warnings.simplefilter("error", RuntimeWarning)
        res = balance(costs, 2, seed=0)
    assert res.iterations_run > 0  # the annealer ran (at temperature 0)
    assert np.array_equal(np.bincount(res.assignment, minlength=2), [4, 4])
    assert res.loads.max() <= 5e-324 * 5  # as good as the start: 2+2+1+0 units of 5e-324


def test_minibatch_costs_rejects_short_sample_counts() -> None:
    # One sample count for three rows: compiled, the kernel reads two values past the end and
    # returns a number; under NUMBA_DISABLE_JIT=1 the same call raises IndexError.
    from aspc.costs import minibatch_costs
    from aspc.errors import ConfigError

    with pytest.raises(ConfigError, match="n_samples must hold one count per row"):
        minibatch_costs("padded", np.array([0, 3]), np.array([1.0]), np.array([1.0, 2.0, 3.0]))
    with pytest.raises(ConfigError, match="q10 must hold one prediction per row"):
        minibatch_costs(
            "expected-max", np.array([0, 3]), np.ones(3), np.array([1.0, 2.0, 3.0]),
            np.array([1.0]), np.array([2.0]), np.array([3.0]),
        )  # fmt: skip


@pytest.mark.parametrize("qs", [[float("nan")], [0.5, float("nan")], [-0.1], [1.5]])
def test_ragged_stats_refuses_quantiles_outside_0_1_nan_included(qs) -> None:
    # NaN passed the range check (every comparison with it is false) and reached the kernel.
    from aspc.io.ragged import RaggedLengths

    ragged = RaggedLengths(np.array([1.0, 2.0, 3.0]), np.array([0, 2, 3]))
    with pytest.raises(ValueError, match="quantiles must be"):
        ragged.stats(qs)
