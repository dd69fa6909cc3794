"""Tests of :func:`aspc.partition.partition` against the brute-force oracle."""

from __future__ import annotations

import naive
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.errors import ConfigError, InputError
from aspc.partition import padded_cost, partition


def sizes_of(boundaries):
    return tuple(int(s) for s in np.diff(boundaries))


@st.composite
def instances(draw, max_n=12):
    n = draw(st.integers(1, max_n))
    # Integer-valued lengths keep every float sum exact, so costs compare exactly.
    lengths = sorted(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)))
    batch = draw(st.integers(1, 6))
    slack = draw(st.integers(0, batch - 1))
    return np.array(lengths, dtype=np.float64), batch, slack


@settings(max_examples=300, deadline=None)
@given(instances())
def test_matches_brute_force_exactly(inst):
    lengths, batch, slack = inst
    boundaries = partition(lengths, batch, slack)
    cost, sizes = naive.partition(lengths, batch, slack)
    assert padded_cost(lengths, boundaries) == cost
    assert sizes_of(boundaries) == sizes


@settings(max_examples=200, deadline=None)
@given(instances(), st.integers(0, 8))
def test_overhead_matches_brute_force_exactly(inst, kappa):
    lengths, batch, slack = inst
    boundaries = partition(lengths, batch, slack, overhead=kappa)
    cost, sizes = naive.partition(lengths, batch, slack, overhead=kappa)
    assert padded_cost(lengths, boundaries, overhead=kappa) == cost
    assert sizes_of(boundaries) == sizes


def test_overhead_moves_sizes_toward_the_top_of_the_band():
    lengths = np.sort(np.random.default_rng(0).lognormal(5.5, 0.8, size=4000))
    mean_size = [np.diff(partition(lengths, 16, 4, overhead=k)).mean() for k in (0.0, 4.0, 16.0, 1e6)]
    assert mean_size == sorted(mean_size)
    assert mean_size[0] < 13 and mean_size[-1] > 19


@pytest.mark.parametrize("sigma", [0.3, 0.8, 1.5])
def test_nominal_count_mode_averages_batch_size(sigma):
    lengths = np.sort(np.random.default_rng(1).lognormal(5.5, sigma, size=5000))
    b = partition(lengths, 16, 4, overhead=None)
    sizes = np.diff(b)
    assert abs(sizes.size - round(5000 / 16)) <= 1
    assert sizes.min() >= 12 and sizes.max() <= 20
    # Lagrangian optimality: no feasible partition with as many minibatches
    # pads less. Comparator: the same count, sizes as equal as possible.
    even = np.r_[0, np.cumsum([len(c) for c in np.array_split(np.arange(5000), sizes.size)])]
    near_fixed = even
    assert padded_cost(lengths, b) <= padded_cost(lengths, near_fixed)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=10),
    st.integers(1, 5),
    st.data(),
)
def test_float_lengths_cost_is_optimal(values, batch, data):
    slack = data.draw(st.integers(0, batch - 1))
    lengths = np.sort(np.array(values))
    cost, _ = naive.partition(lengths, batch, slack)
    assert padded_cost(lengths, partition(lengths, batch, slack)) == pytest.approx(cost, rel=1e-12, abs=1e-9)


@pytest.mark.parametrize(
    ("n", "batch", "slack", "expected"),
    [
        (1, 1, 0, (1,)),
        (1, 4, 0, (1,)),
        (3, 4, 1, (3,)),  # n = B - slack: one in-band minibatch
        (2, 4, 1, (2,)),  # n < B - slack: a single remainder minibatch
        (8, 4, 0, (4, 4)),
        (10, 4, 0, (4, 4, 2)),  # equal lengths: the tie rule puts the remainder last
        (12, 4, 1, (4, 4, 4)),  # equal lengths: sizes stay at B when they can
    ],
)
def test_edge_cases_equal_lengths(n, batch, slack, expected):
    boundaries = partition(np.full(n, 7.0), batch, slack)
    assert sizes_of(boundaries) == expected
    assert padded_cost(np.full(n, 7.0), boundaries) == 7.0 * n


def test_remainder_goes_where_it_is_cheapest():
    # One long outlier: the remainder should isolate it rather than pad 3 prompts to 100.
    lengths = np.array([1, 1, 1, 1, 1, 1, 100], dtype=float)
    assert sizes_of(partition(lengths, 3, 0)) == (3, 3, 1)
    lengths = np.array([1, 50, 50, 50, 60, 60, 60], dtype=float)
    assert sizes_of(partition(lengths, 3, 0)) == (1, 3, 3)


def test_no_remainder_when_band_tiles():
    rng = np.random.default_rng(3)
    for n in range(12, 200):
        lengths = np.sort(rng.lognormal(5, 1, n))
        sizes = np.diff(partition(lengths, 8, 4))
        assert sizes.min() >= 4 and sizes.max() <= 12


def test_boundaries_cover_input():
    rng = np.random.default_rng(1)
    lengths = np.sort(rng.lognormal(6, 1, 4992))
    b = partition(lengths, 16, 4)
    assert b.dtype == np.int64 and b[0] == 0 and b[-1] == 4992
    assert np.all(np.diff(b) >= 12) and np.all(np.diff(b) <= 20)
    # Never worse than fixed chunks of B, which are one feasible answer here.
    fixed = np.arange(0, 4993, 16)
    assert padded_cost(lengths, b) <= padded_cost(lengths, fixed)


def test_accepts_ints_and_lists():
    assert sizes_of(partition([1, 2, 3, 4], 2, 0)) == (2, 2)
    assert sizes_of(partition(np.arange(4, dtype=np.int32), 2, 0)) == (2, 2)


@pytest.mark.parametrize(
    ("lengths", "exc"),
    [
        ([], InputError),
        ([3.0, 1.0], InputError),
        ([1.0, np.nan], InputError),
        ([-1.0, 2.0], InputError),
        ([[1.0, 2.0]], InputError),
        (["a"], InputError),
    ],
)
def test_bad_lengths(lengths, exc):
    with pytest.raises(exc):
        partition(lengths, 2, 0)


@pytest.mark.parametrize(("batch", "slack"), [(0, 0), (4, 4), (4, -1), (2.5, 0), (True, 0), (4, 1.0)])
def test_bad_config(batch, slack):
    with pytest.raises(ConfigError):
        partition([1.0, 2.0], batch, slack)


@pytest.mark.skipif(__import__("numba").config.DISABLE_JIT, reason="a complexity guard for the compiled kernel")
def test_a_remainder_under_a_narrow_band_costs_no_n_times_b_scan():
    # slack 0 and n not a multiple of B: only multiples of B are reachable without the remainder. Scanning all
    # B - 1 remainder sizes at every prefix was O(n B): `aspc compile` of a million prompts took 79 s at -b 16384
    # and did not answer Ctrl-C; here (3e10 steps) about a minute. Visiting reachable prefixes only: milliseconds.
    import time

    n, b = 300_001, 100_000
    lengths = np.sort(np.random.default_rng(0).lognormal(5.0, 1.0, n))
    partition(lengths[:10], 3, 0)  # compile outside the clock
    start = time.perf_counter()
    boundaries = partition(lengths, b, 0)
    assert time.perf_counter() - start < 10.0
    assert sorted(sizes_of(boundaries)) == [1, b, b, b]


@pytest.mark.skipif(__import__("numba").config.DISABLE_JIT, reason="about the compiled kernel")
def test_ctrl_c_stops_a_long_partition_at_once(tmp_path):
    # One DP solve is O(n (B + slack)): the old code exited ~40 s after the signal here. Ran in the main thread, the compiled kernel kept the
    # signal's handler waiting to its end; now it waits in join, which a signal interrupts.
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 300_000
    src, out = tmp_path / "big.parquet", tmp_path / "plan.parquet"
    lengths = np.random.default_rng(0).lognormal(5.0, 1.0, n).round()
    pq.write_table(pa.table({"prompt": [str(i) for i in range(n)], "length": lengths}), src)
    aspc = str(Path(sys.executable).with_name("aspc"))
    cmd = [aspc, "compile", str(src), "--length-field", "length", "-b", "16384", "-o", str(out), "-q"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(4.0)  # past start-up and the read: inside the partition
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    waited = time.monotonic() - sent
    assert proc.returncode != 0 and "interrupted by SIGINT" in err, err
    assert waited < 5.0, f"exited {waited:.1f} s after SIGINT"
    assert not out.exists()


def _scan_reference(cost, dev, j, s0, s1, last, overhead, penalty, batch_size, best, best_dev, best_size):
    """One scan in ascending size order with strict comparisons: the first size of the least (cost, deviation)."""
    for s in range(s0, s1 + 1):
        c = cost[j - s] + (s + overhead) * last + penalty
        e = dev[j - s] + abs(s - batch_size)
        if c < best or (c == best and e < best_dev):
            best, best_dev, best_size = c, e, s
    return best, best_dev, best_size


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(0, 3))
def test_band_scan_lanes_agree_with_one_ascending_scan(seed, width, incoming):
    # Four lanes and a merge against the scan they replace: tie-heavy costs, unreachable (inf) prefixes, and a
    # remainder's best coming in (smaller size, maybe an equal cost and deviation).
    from aspc.partition.kernel import _band_scan

    rng = np.random.default_rng(seed)
    j, s0 = 60, int(rng.integers(1, 10))
    s1 = min(j, s0 + width - 1)
    cost = rng.integers(0, 4, j + 1).astype(np.float64) * 8.0
    cost[rng.random(j + 1) < 0.3] = np.inf
    dev = rng.integers(0, 3, j + 1).astype(np.int64)
    last, overhead, penalty, b = float(rng.integers(0, 3)), float(rng.integers(0, 2)), 0.0, int(rng.integers(1, 20))
    start = [(np.inf, 0, 0), (0.0, 0, 0), (float(cost[j - s0] + (s0 + overhead) * last), 0, max(0, s0 - 1)),
             (float(rng.integers(0, 40)), int(rng.integers(0, 3)), max(0, s0 - 1))][incoming]  # fmt: skip
    args = (cost, dev, j, s0, s1, last, overhead, penalty, b, *start)
    assert tuple(_band_scan(*args)) == _scan_reference(*args)


def test_band_scan_keeps_the_first_size_of_a_tie_across_the_tail():
    # Sizes 1 and 5 tie on (cost 0, deviation 2), both in lane 0 (5 is the tail past the four lanes): size 1.
    from aspc.partition.kernel import _band_scan

    j = 10
    cost, dev = np.zeros(j + 1), np.full(j + 1, 5, np.int64)
    dev[j - 1] = dev[j - 5] = 0
    args = (cost, dev, j, 1, 5, 0.0, 0.0, 0.0, 3, np.inf, 0, 0)
    assert tuple(_band_scan(*args)) == _scan_reference(*args) == (0.0, 2, 1)


def test_lengths_whose_costs_overflow_are_refused_not_walked_out_of_bounds():
    # Every cost inf: no size recorded, and the walk back looped on size 0 writing past its array (a crash).
    with pytest.raises(ConfigError, match="overflow the partition's float64 costs"):
        partition(np.array([0.0] * 20 + [1.7e308] * 50), 28, 10, overhead=3.0)
    with pytest.raises(ConfigError, match="overflow"):
        partition(np.array([0.0] * 20 + [1.7e308] * 50), 28, 10, overhead=None)


@pytest.mark.skipif(__import__("numba").config.DISABLE_JIT, reason="about the compiled kernel")
def test_an_interrupted_partition_leaves_no_solve_running():
    # A KeyboardInterrupt in library use (a notebook) reached the caller at once, but the solve's thread ran on
    # for its whole DP (minutes at a large B) beside what the caller did next.
    import resource
    import signal
    import time

    lengths = np.sort(np.random.default_rng(0).lognormal(5.0, 1.0, 300_000).round())
    partition(lengths[:50], 8, 2, overhead=None)  # compile outside the clock

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(KeyboardInterrupt):
            partition(lengths, 16384, 4096, overhead=None)  # ~20 s of DP
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    time.sleep(0.5)  # the solve sees the flag at its next prefix
    before = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    time.sleep(1.5)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_utime - before < 0.3  # no thread left computing
