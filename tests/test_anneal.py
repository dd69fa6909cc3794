"""Tests of :func:`aspc.anneal.balance` (KK / LPT start + simulated annealing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import naive
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.anneal import balance
from aspc.errors import ConfigError, InputError
from aspc.partition import partition

REPO = Path(__file__).resolve().parents[1]
JIT = not numba.config.DISABLE_JIT
# Interpreted (NUMBA_DISABLE_JIT=1, as `make test` runs these files) proposals
# cost ~30 us: check the logic on fewer, smaller instances and leave quality
# at scale to the compiled run.
needs_jit = pytest.mark.skipif(not JIT, reason="quality at scale; too slow interpreted")


@st.composite
def tiny(draw):
    m = draw(st.integers(1, 8))
    g = draw(st.integers(1, min(3, m)))
    # Integer costs: sums are exact, so optima compare exactly.
    costs = draw(st.lists(st.integers(0, 40), min_size=m, max_size=m))
    return np.array(costs, dtype=np.float64), g


def check_invariants(result, costs, n_groups, caps=None):
    a = result.assignment
    assert a.dtype == np.int32 and a.shape == costs.shape
    counts = np.bincount(a, minlength=n_groups)
    assert counts.size == n_groups and counts.min() >= 1
    expected = naive.group_capacities(costs.size, n_groups) if caps is None else list(caps)
    assert counts.tolist() == expected
    np.testing.assert_allclose(result.loads, np.bincount(a, weights=costs, minlength=n_groups))
    assert result.loads.max() >= result.cardinality_bound * (1 - 1e-12) >= result.lower_bound * (1 - 1e-12)
    assert result.imbalance <= result.init_imbalance


@settings(max_examples=150 if JIT else 10, deadline=None, derandomize=True)
@given(tiny())
def test_reaches_brute_force_optimum(inst):
    # Exact: on these tiny instances the annealer is expected to find the optimum every time.
    costs, g = inst
    result = balance(costs, g, seed=1)
    check_invariants(result, costs, g)
    assert result.loads.max() == naive.balance(costs, g)


@settings(max_examples=60 if JIT else 15, deadline=None)
@given(
    st.lists(st.floats(0, 1e6, allow_nan=False), min_size=2, max_size=60),
    st.integers(1, 8),
    st.sampled_from(["kk", "lpt"]),
    st.integers(0, 2**32),
)
def test_never_worse_than_start(values, g, init, seed):
    costs = np.array(values)
    g = min(g, costs.size)
    start = balance(costs, g, iterations=0, init=init)
    result = balance(costs, g, init=init, seed=seed, iterations=3000)
    check_invariants(result, costs, g)
    assert result.loads.max() <= start.loads.max()
    assert result.init_imbalance == start.imbalance


@needs_jit
@pytest.mark.parametrize(("n_groups", "seed"), [(8, 0), (40, 1), (120, 2)])
def test_lognormal_within_tenth_percent_of_bound(n_groups, seed):
    rng = np.random.default_rng(seed)
    costs = rng.lognormal(8, 0.5, 16 * n_groups + n_groups // 2)
    result = balance(costs, n_groups, seed=seed)
    check_invariants(result, costs, n_groups)
    assert result.lower_bound == pytest.approx(costs.sum() / n_groups)
    assert result.imbalance <= 1e-3


@needs_jit
def test_heavy_tail_reaches_cardinality_bound():
    # One minibatch costs more than a mean group: the best group holding it
    # is that minibatch plus the cheapest others, which the bound states.
    rng = np.random.default_rng(5)
    costs = rng.lognormal(0, 1.2, 16 * 50)
    result = balance(costs, 50)
    assert costs.max() > costs.sum() / 50
    assert result.loads.max() == pytest.approx(result.cardinality_bound, rel=1e-12)


def test_same_seed_same_assignment():
    costs = np.random.default_rng(3).lognormal(0, 1, 300)
    a = balance(costs, 20, seed=7)
    b = balance(costs, 20, seed=7)
    assert np.array_equal(a.assignment, b.assignment)
    assert a.iterations_run == b.iterations_run


def test_kk_and_lpt_starts():
    costs = np.random.default_rng(4).lognormal(0, 0.5, 200)
    for init in ("kk", "lpt"):
        start = balance(costs, 10, init=init, iterations=0)
        assert start.init == init and start.iterations_run == 0
        assert start.imbalance == start.init_imbalance
        check_invariants(start, costs, 10)


def test_kk_hand_trace():
    # Balanced differencing on {8,7,6,5,4} + dummy 0, 2 groups: layers (8,7) (6,5) (4,0).
    # Widest (4,0) meets (8,7): {4+7, 0+8} = (11, 8); then with (6,5): {11+5, 8+6} = (16, 14).
    costs = np.array([8.0, 7, 6, 5, 4])
    start = balance(costs, 2, iterations=0)
    assert sorted(start.loads.tolist()) == [14.0, 16.0]
    assert sorted(balance(costs, 2).loads.tolist()) == [15.0, 15.0]


def test_edge_group_counts():
    costs = np.array([3.0, 1.0, 2.0])
    one = balance(costs, 1)
    assert one.assignment.tolist() == [0, 0, 0] and one.imbalance == 0.0
    each = balance(costs, 3)
    assert sorted(each.assignment.tolist()) == [0, 1, 2] and each.imbalance == 0.0
    zeros = balance(np.zeros(5), 2)
    assert zeros.imbalance == 0.0 and zeros.lower_bound == 0.0


def test_custom_group_sizes():
    costs = np.random.default_rng(6).lognormal(0, 0.5, 30)
    caps = [5, 10, 15]
    result = balance(costs, 3, group_sizes=caps, init="lpt")
    check_invariants(result, costs, 3, caps)
    with pytest.raises(ConfigError, match="init='lpt'"):
        balance(costs, 3, group_sizes=caps)
    kk = balance(np.append(costs, 1.0), 3, group_sizes=[10, 11, 10])
    check_invariants(kk, np.append(costs, 1.0), 3, [10, 11, 10])


def test_equal_samples_keeps_sample_counts():
    rng = np.random.default_rng(8)
    lengths = np.sort(rng.lognormal(6, 1, 3000))
    bounds = partition(lengths, 16, 4)
    sizes = np.diff(bounds)
    costs = sizes * lengths[bounds[1:] - 1]
    g = sizes.size // 16
    start = balance(costs, g, sample_sizes=sizes, equal_samples=True, iterations=0)
    result = balance(costs, g, sample_sizes=sizes, equal_samples=True)
    check_invariants(result, costs, g)
    assert result.init == "samples-lpt"
    samples = np.bincount(result.assignment, weights=sizes, minlength=g)
    np.testing.assert_array_equal(samples, np.bincount(start.assignment, weights=sizes, minlength=g))
    # Swaps only exchange equal sizes: each group keeps its multiset of sizes.
    for k in range(g):
        assert sorted(sizes[result.assignment == k]) == sorted(sizes[start.assignment == k])
    assert samples.max() - samples.min() <= sizes.max()
    assert result.imbalance < start.imbalance


@settings(max_examples=80 if JIT else 20, deadline=None)
@given(st.data())
def test_equal_samples_spread_at_most_largest_size(data):
    m = data.draw(st.integers(2, 40))
    g = data.draw(st.integers(1, m))
    sizes = np.array(data.draw(st.lists(st.integers(1, 20), min_size=m, max_size=m)))
    costs = np.array(data.draw(st.lists(st.floats(0, 100), min_size=m, max_size=m)))
    result = balance(costs, g, sample_sizes=sizes, equal_samples=True, iterations=500)
    check_invariants(result, costs, g)
    samples = np.bincount(result.assignment, weights=sizes, minlength=g)
    assert samples.max() - samples.min() <= sizes.max()


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"n_groups": 5}, ConfigError, "--groups <= M"),
        ({"n_groups": 0}, ConfigError, "--groups"),
        ({"n_groups": 2, "init": "random"}, ConfigError, "init"),
        ({"n_groups": 2, "seed": -1}, ConfigError, "seed"),
        ({"n_groups": 2, "iterations": -5}, ConfigError, "iterations"),
        ({"n_groups": 2, "group_sizes": [1, 1]}, ConfigError, "add up"),
        ({"n_groups": 2, "group_sizes": [4, 0]}, InputError, "group_sizes"),
        ({"n_groups": 2, "equal_samples": True}, ConfigError, "sample_sizes"),
        ({"n_groups": 2, "sample_sizes": [1, 2]}, InputError, "sample_sizes"),
    ],
)
def test_bad_options(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        balance(np.ones(4), **kwargs)


@pytest.mark.parametrize("costs", [[], [1.0, np.nan], [1.0, -2.0], [[1.0, 2.0]]])
def test_bad_costs(costs):
    with pytest.raises(InputError):
        balance(costs, 1)


# Run by both this process (compiled) and a NUMBA_DISABLE_JIT=1 subprocess.
_PIPELINE = """
import json, numpy as np
from aspc.partition import partition
from aspc.anneal import balance, dispatch_order
lengths = np.sort(np.random.default_rng(11).lognormal(5, 1, 400))
b = partition(lengths, 8, 2)
sizes = np.diff(b)
costs = sizes * lengths[b[1:] - 1]
r = balance(costs, 5, seed=3, iterations=1500)
e = balance(costs, 5, seed=3, iterations=1500, sample_sizes=sizes, equal_samples=True, init="lpt")
o = dispatch_order(costs, sizes, r.assignment, 5)
print(json.dumps({"b": b.tolist(), "a": r.assignment.tolist(), "e": e.assignment.tolist(),
                  "o": o.tolist(), "loads": r.loads.tobytes().hex(), "runs": [r.iterations_run, e.iterations_run]}))
"""


@pytest.mark.skipif(not JIT, reason="compares the compiled run with an interpreted one")
def test_identical_without_jit():
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    child = subprocess.run(
        [sys.executable, "-c", _PIPELINE], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stderr
    here = {}
    exec(_PIPELINE.replace("print(", "here['out'] = ("), {"here": here})
    assert json.loads(child.stdout) == json.loads(here["out"])
