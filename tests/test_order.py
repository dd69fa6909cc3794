"""Tests of the dispatch order and the delivery-drift metric."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.anneal import balance, delivery_drift, dispatch_order, group_order
from aspc.errors import ConfigError, InputError
from aspc.partition import partition


def pipeline(seed, n=20_000, batch=16, slack=4, group_size=16, sigma=1.0):
    lengths = np.sort(np.random.default_rng(seed).lognormal(6, sigma, n))
    bounds = partition(lengths, batch, slack)
    sizes = np.diff(bounds)
    costs = sizes * lengths[bounds[1:] - 1]
    n_groups = max(1, sizes.size // group_size)
    return costs, sizes, balance(costs, n_groups, seed=seed).assignment, n_groups


def test_drift_by_hand():
    # x = 0, .5, 1; y = 0, .25, 1  ->  drift .25
    assert delivery_drift([1.0, 3.0], [2, 2]) == 0.25
    assert delivery_drift([3.0, 1.0], [2, 2]) == 0.25
    assert delivery_drift([2.0, 2.0, 2.0], [1, 1, 1]) == 0.0
    assert delivery_drift([5.0], [7]) == 0.0


def test_drift_degenerate_totals():
    assert delivery_drift([], []) == 0.0
    assert delivery_drift([0.0, 0.0], [1, 1]) == 0.0
    assert delivery_drift([1.0, 2.0], [0, 0]) == 0.0


@pytest.mark.parametrize(
    ("costs", "sizes"), [([1.0, 2.0], [1]), ([1.0, -1.0], [1, 1]), ([np.nan], [1]), ([[1.0]], [[1]])]
)
def test_drift_bad_input(costs, sizes):
    with pytest.raises(InputError):
        delivery_drift(costs, sizes)


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="quality at scale; too slow interpreted")
@pytest.mark.parametrize(("seed", "sigma"), [(0, 1.0), (1, 0.5), (2, 1.0)])
def test_asp_order_beats_sorted(seed, sigma):
    costs, sizes, assignment, n_groups = pipeline(seed, sigma=sigma)
    order = dispatch_order(costs, sizes, assignment, n_groups)
    sorted_drift = delivery_drift(costs, sizes)  # partition output is ascending in cost
    asp_drift = delivery_drift(costs[order], sizes[order])
    # No order beats half the largest single step of the work-minus-samples gap.
    floor = np.max(np.abs(costs / costs.sum() - sizes / sizes.sum())) / 2
    assert sorted_drift > 0.15
    assert asp_drift < 0.05 * sorted_drift
    assert asp_drift <= 1.2 * floor


def test_order_is_grouped_permutation():
    costs, sizes, assignment, n_groups = pipeline(3, n=5000)
    order = dispatch_order(costs, sizes, assignment, n_groups)
    assert order.dtype == np.int64
    np.testing.assert_array_equal(np.sort(order), np.arange(costs.size))
    groups = group_order(order, assignment)
    np.testing.assert_array_equal(np.sort(groups), np.arange(n_groups))
    # Contiguous: the group sequence changes exactly G - 1 times.
    seq = assignment[order]
    assert np.count_nonzero(seq[1:] != seq[:-1]) == n_groups - 1
    np.testing.assert_array_equal(order, dispatch_order(costs, sizes, assignment, n_groups))


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_order_properties(data):
    m = data.draw(st.integers(1, 30))
    g = data.draw(st.integers(1, m))
    costs = np.array(data.draw(st.lists(st.floats(0, 1e4), min_size=m, max_size=m)))
    sizes = np.array(data.draw(st.lists(st.integers(1, 20), min_size=m, max_size=m)))
    assignment = np.array(
        list(range(g)) + data.draw(st.lists(st.integers(0, g - 1), min_size=m - g, max_size=m - g))
    )
    assignment = data.draw(st.permutations(assignment))
    assignment = np.array(assignment)
    order = dispatch_order(costs, sizes, assignment, g)
    np.testing.assert_array_equal(np.sort(order), np.arange(m))
    seq = assignment[order]
    assert np.count_nonzero(seq[1:] != seq[:-1]) == g - 1
    assert 0.0 <= delivery_drift(costs[order], sizes[order]) <= 1.0


def test_single_group_interleaves():
    # One group: short and long alternate rather than running sorted.
    costs = np.array([1.0, 2, 3, 4, 5, 6, 7, 8])
    sizes = np.ones(8)
    order = dispatch_order(costs, sizes, np.zeros(8, np.int32), 1)
    assert delivery_drift(costs[order], sizes[order]) < 0.5 * delivery_drift(costs, sizes)


def test_group_order_rejects_split_groups():
    with pytest.raises(InputError):
        group_order(np.arange(4), np.array([0, 1, 0, 1]))


@pytest.mark.parametrize(
    ("assignment", "n_groups", "exc"),
    [
        ([0, 1, 2], 2, InputError),  # out of range
        ([0, 0, 0], 2, InputError),  # empty group
        ([0.0, 1.0, 0.0], 2, InputError),  # not integers
        ([0, 1], 2, InputError),  # wrong length
        ([0, 1, 0], 0, ConfigError),
    ],
)
def test_order_bad_input(assignment, n_groups, exc):
    with pytest.raises(exc):
        dispatch_order([1.0, 2.0, 3.0], [1, 1, 1], np.array(assignment), n_groups)
