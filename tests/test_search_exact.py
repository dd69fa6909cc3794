"""The faster nominal-count search and max-quantile bisection give the very same floats as the plain ones.

Plans must stay byte-identical, so each speed-up is checked against the
straightforward version it replaced (kept here as the reference): the
one-solve-at-a-time Lagrange search of :mod:`aspc.partition.boundaries`,
and the 60-step bisection that evaluates every row at every step.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

import aspc.partition.boundaries as boundaries
from aspc.anneal.lpt import Z90
from aspc.anneal.lpt_kernel import _BISECT_STEPS, _exp_bounds, _log_cdf_max, _max_quantiles
from aspc.partition.kernel import _partition_kernel

# Interpreted (NUMBA_DISABLE_JIT=1) the DP and the bisection are ~1000x slower:
# the same checks on fewer, smaller inputs, and none at scale.
JIT = not numba.config.DISABLE_JIT
needs_jit = pytest.mark.skipif(not JIT, reason="at scale; too slow interpreted")
MAX_N = 2500 if JIT else 300


def _reference_nominal_count(arr: np.ndarray, b: int, d: int):
    """The search before speculation and inference: one DP at a time, exactly as it was written.

    (exp and log from the C library, as aspc.portable_math gives them to the code under test.)
    """
    target = max(1, round(arr.size / b))
    tol = max(1.0, boundaries._COUNT_TOL * target)
    solved: dict[float, tuple] = {}

    def solve(lam):
        if lam not in solved:
            res = _partition_kernel(arr, b, b - d, b + d, 0.0, lam)
            solved[lam] = (res, res[0].size - 1 - target)
        return solved[lam]

    best, f0 = solve(0.0)
    if d == 0 or f0 <= tol:
        return best
    scale = max(1.0, float(arr.mean()))
    x_lo, f_lo = math.log(scale * 1e-9), float(f0)
    x_hi = math.log(scale)
    res, f_hi = solve(scale)
    solves = 2
    while f_hi > 0 and solves < boundaries._MAX_SOLVES:
        x_lo, f_lo = x_hi, float(f_hi)
        x_hi += math.log(16.0)
        res, f_hi = solve(math.exp(x_hi))
        solves += 1
    best_err = abs(f0)
    if abs(f_hi) < best_err:
        best, best_err = res, abs(f_hi)
    side = 0
    while best_err > tol and solves < boundaries._MAX_SOLVES:
        if f_lo != f_hi:
            x = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo)
        else:
            x = 0.5 * (x_lo + x_hi)
        if not x_lo < x < x_hi:
            x = 0.5 * (x_lo + x_hi)
        res, f = solve(math.exp(x))
        solves += 1
        if abs(f) < best_err:
            best, best_err = res, abs(f)
        if f > 0:
            x_lo, f_lo = x, float(f)
            if side == -1:
                f_hi /= 2.0
            side = -1
        else:
            x_hi, f_hi = x, float(f)
            if side == 1:
                f_lo /= 2.0
            side = 1
    return best


def _lengths(kind: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == 0:
        x = rng.lognormal(5.0, 1.0, n)
    elif kind == 1:
        x = np.round(rng.lognormal(5.0, 1.0, n))  # one known length: integer ties
    elif kind == 2:
        x = np.round(rng.lognormal(5.0, 1.0, n) * 8) / 8  # means of 8 lengths: many ties
    else:
        x = rng.integers(0, 5, n).astype(np.float64)  # a handful of values
    return np.sort(x)


def test_an_answer_known_by_inference_only_is_solved_in_tables_of_its_own(monkeypatch):
    # Found in review: the search's answer, when only inferred (between two solved lambdas of one count), was
    # solved by run(best) without the tables every solve now takes: TypeError in 2 of 3,000 speculated cases.
    monkeypatch.setattr(boundaries, "_SPECULATE_ROWS", 1)
    arr = _lengths(1, 906, 1792925988)
    got = boundaries._nominal_count(arr, 28, 15)
    want = _reference_nominal_count(arr, 28, 15)
    assert np.array_equal(got[0], want[0]) and got[1] == want[1]


@pytest.mark.parametrize("speculate", [True, False])
@settings(max_examples=120 if JIT else 20, deadline=None)
@given(
    kind=st.integers(0, 3),
    n=st.integers(1, MAX_N),
    b=st.integers(1, 40),
    frac=st.floats(0.0, 0.999),
    seed=st.integers(0, 2**32 - 1),
)
def test_nominal_count_same_as_one_solve_at_a_time(speculate, kind, n, b, frac, seed):
    arr = _lengths(kind, n, seed)
    b = min(b, n)
    d = int(frac * b)
    # Speculation normally starts at 100k prompts; forced here so small inputs exercise the threads.
    saved = boundaries._SPECULATE_ROWS
    boundaries._SPECULATE_ROWS = 1 if speculate else 10**12
    try:
        got = boundaries._nominal_count(arr, b, d)
    finally:
        boundaries._SPECULATE_ROWS = saved
    want = _reference_nominal_count(arr, b, d)
    assert np.array_equal(got[0], want[0]) and got[1] == want[1]


@needs_jit
@pytest.mark.parametrize("kind", [0, 1, 2])
def test_nominal_count_same_at_scale(kind, monkeypatch):
    # Above the speculation threshold, with the tie-heavy inputs whose search runs longest.
    arr = _lengths(kind, 120_000, 7 + kind)
    solved = []
    real = boundaries._partition_tables
    monkeypatch.setattr(boundaries, "_partition_tables", lambda *a: solved.append(a[5]) or real(*a))
    got = boundaries._nominal_count(arr, 16, 4)
    monkeypatch.undo()
    want = _reference_nominal_count(arr, 16, 4)
    assert np.array_equal(got[0], want[0]) and got[1] == want[1]
    # Integer ties (kind 1) leave the count flat from lambda = 0+ down to the search's floor: inferred there,
    # 4 solves instead of 17; elsewhere the interior crossing is solved as before (14).
    assert len(solved) == len(set(solved)) and len(solved) <= (4 if kind == 1 else 14)


@njit(cache=False)
def _reference_max_quantiles(mu, sigma, point, nseq, starts, q):
    """Every one of the 60 bisection steps, every row summed: the kernel before its shortcuts."""
    m = starts.size - 1
    out = np.empty(m, dtype=np.float64)
    logq = math.log(q)
    for b in range(m):
        lo_i, hi_i = starts[b], starts[b + 1]
        lo = math.inf
        hi = -math.inf
        for i in range(lo_i, hi_i):
            if sigma[i] > 0.0:
                a, c = mu[i] - 8.0 * sigma[i], mu[i] + 8.0 * sigma[i]
            else:
                a = c = math.log(max(point[i], 1e-9))
            lo = min(lo, a)
            hi = max(hi, c)
        for i in range(lo_i, hi_i):
            if sigma[i] == 0.0:
                lo = max(lo, math.log(max(point[i], 1e-9)))
        if hi <= lo:
            out[b] = math.exp(lo)
            continue
        for _ in range(_BISECT_STEPS):
            mid = 0.5 * (lo + hi)
            if _log_cdf_max(mid, mu, sigma, point, nseq, lo_i, hi_i) < logq:
                lo = mid
            else:
                hi = mid
        out[b] = math.exp(hi)
    return out


def _quantile_inputs(seed: int, n: int, point_share: float, spread: float):
    rng = np.random.default_rng(seed)
    q50 = np.maximum(rng.lognormal(5.5, 0.9, n), 1e-9)
    sig = rng.uniform(0.0, spread, n)
    sig[rng.random(n) < point_share] = 0.0  # point masses (one known length)
    q10, q90 = q50 * np.exp(-Z90 * sig), q50 * np.exp(Z90 * sig)
    mean = np.where(sig > 0, q50 * np.exp(0.5 * sig**2), q50)
    lo, hi = q10, np.maximum(q90, q50)
    s = np.log(np.maximum(hi, 1e-9)) - np.log(np.maximum(lo, 1e-9))
    sigma = np.ascontiguousarray(np.where(hi - lo > 1e-9, np.clip(s, 0.0, 20.0) / (2 * Z90), 0.0))
    nseq = rng.integers(0, 9, n).astype(np.float64)
    sizes = rng.integers(1, 24, n)
    starts = np.r_[0, np.cumsum(sizes)]
    starts = starts[starts < n].astype(np.int64)
    starts = np.r_[starts, n].astype(np.int64)
    return np.log(q50), sigma, mean, nseq, starts


@settings(max_examples=150 if JIT else 30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 400 if JIT else 120),
    point_share=st.sampled_from([0.0, 0.3, 1.0]),
    spread=st.sampled_from([0.05, 1.0, 6.0]),
    q=st.sampled_from([0.1, 0.5, 0.9, 0.999]),
)
def test_max_quantiles_bit_identical_to_full_bisection(seed, n, point_share, spread, q):
    args = _quantile_inputs(seed, n, point_share, spread)
    got = _max_quantiles(*args, q)
    want = _reference_max_quantiles(*args, q)
    assert np.array_equal(got.view(np.int64), want.view(np.int64))


@needs_jit
def test_max_quantiles_bit_identical_at_scale():
    args = _quantile_inputs(3, 200_000, 0.1, 1.2)
    got = _max_quantiles(*args, 0.9)
    want = _reference_max_quantiles(*args, 0.9)
    assert np.array_equal(got.view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("n", range(1, 60))
def test_tables_know_when_the_band_alone_reaches_n(n):
    # The remainder table is allocated up front exactly when no count of in-band sizes sums to n.
    for lo in range(1, 12):
        for hi in range(lo, 16):
            reaches = any(k * lo <= n <= k * hi for k in range(1, n + 1))
            _, g, _, _ = boundaries._tables(n, lo, hi)
            assert (g[0].size == 0) == reaches


def _keys_inputs(seed: int, n: int, point_share: float, spread: float):
    """Quantile inputs in q10/q50/q90 form, with some minibatches repeated, exactly and with one more sample.

    The exact repeats make ties. The others add a sample to the row with the
    smallest median: their bisection brackets start the same, and their
    answers differ by far less than a coarse bracket's width, so only the
    resumed bisection can order them.
    """
    mu, sigma, mean, nseq, starts = _quantile_inputs(seed, n, point_share, spread)
    q50 = np.exp(mu)
    rng = np.random.default_rng(seed)
    parts, extra, bounds = [np.arange(n)], [np.zeros(n)], [starts]
    for _ in range(int(rng.integers(1, 4))):
        b = int(rng.integers(0, starts.size - 1))
        rows = np.arange(starts[b], starts[b + 1])
        for add in (0.0, 0.0, 1.0, 2.0):
            bounds.append(bounds[-1][-1] + np.cumsum([rows.size]))
            parts.append(rows)
            more = np.zeros(rows.size)
            more[np.argmin(q50[rows])] = add
            extra.append(more)
    idx = np.concatenate(parts)
    starts = np.concatenate(bounds).astype(np.int64)
    q50, sigma = q50[idx], sigma[idx]
    return starts, nseq[idx] + np.concatenate(extra), mean[idx], q50 * np.exp(-Z90 * sigma), q50, q50 * np.exp(Z90 * sigma)


@settings(max_examples=120 if JIT else 25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 400 if JIT else 100),
    point_share=st.sampled_from([0.0, 0.3, 1.0]),
    spread=st.sampled_from([1e-6, 0.05, 1.0, 6.0]),
    q=st.sampled_from([0.1, 0.9, 0.999]),
    groups=st.integers(1, 5),
)
def test_lpt_keys_compare_as_the_exact_quantiles(seed, n, point_share, spread, q, groups):
    from aspc.anneal import lpt_keys, lpt_order, max_quantiles

    args = _keys_inputs(seed, n, point_share, spread)
    exact = max_quantiles(*args, q=q)
    keys = lpt_keys(*args, q=q)
    # Every pair compares the same way (<, ==, >), so any comparison sort orders them alike ...
    assert np.array_equal(np.sign(exact[:, None] - exact[None, :]), np.sign(keys[:, None] - keys[None, :]))
    # ... and each key is the exact quantile, or within the bracket the bisection had narrowed it to.
    assert np.allclose(keys, exact, rtol=1e-6, atol=0.0)
    m = exact.size
    g = min(groups, m)
    assignment = np.r_[np.arange(g), np.random.default_rng(seed).integers(0, g, m - g)]
    tie = np.random.default_rng(seed + 1).permutation(m)
    assert np.array_equal(lpt_order(exact, assignment, g, tie), lpt_order(keys, assignment, g, tie))


@needs_jit
def test_lpt_keys_at_scale_skip_most_of_the_bisection():
    from aspc.anneal import lpt_keys, lpt_order, max_quantiles

    args = _keys_inputs(3, 200_000, 0.1, 1.2)
    exact, keys = max_quantiles(*args), lpt_keys(*args)
    assignment = np.arange(exact.size) % 64
    assert np.array_equal(lpt_order(exact, assignment, 64), lpt_order(keys, assignment, 64))
    # Most keys are an upper bracket end, not the exact value: the refinement is the exception.
    assert np.mean(keys == exact) < 0.1


def test_lpt_keys_refine_a_bracket_that_only_touches_a_known_answer():
    # A one-row point-mass minibatch whose answer is exactly the upper end of another's
    # coarse bracket: the two keys would tie unless that bracket is resumed to the end.
    from aspc.anneal import lpt_keys, max_quantiles

    starts, nseq, mean, q10, q50, q90 = _keys_inputs(11, 200, 0.0, 1.0)
    _, blo, bhi, _, hi, exact, _ = _located(starts, nseq, mean, q10, q50, q90, 0.9)
    _, ehi = _exp_bounds(blo, bhi, hi, exact)
    b = int(np.flatnonzero(exact == 0)[0])
    point = ehi[b]
    for _ in range(64):  # a length whose log and back lands on ehi[b] exactly
        if math.exp(math.log(point)) == ehi[b]:
            break
        point = np.nextafter(point, 0.0 if math.exp(math.log(point)) > ehi[b] else np.inf)
    assert math.exp(math.log(point)) == ehi[b]
    grow = lambda a, v: np.r_[a, v]  # noqa: E731
    args2 = (np.r_[starts, starts[-1] + 1], grow(nseq, 1.0), *(grow(a, point) for a in (mean, q10, q50, q90)))
    exact2, keys2 = max_quantiles(*args2), lpt_keys(*args2)
    assert exact2[-1] == ehi[b] and exact2[b] != ehi[b]
    assert np.sign(exact2[b] - exact2[-1]) == np.sign(keys2[b] - keys2[-1])


def _located(starts, nseq, mean, q10, q50, q90, q):
    """``_coarse_quantiles``' output for these rows: (args, blo, bhi, lo, hi, exact, left)."""
    from aspc.anneal.lpt import _lognormal_rows
    from aspc.anneal.lpt_kernel import _coarse_quantiles

    args = _lognormal_rows(starts, nseq, mean, q10, q50, q90, q)
    m = starts.size - 1
    lo, hi, blo, bhi = np.empty(m), np.empty(m), np.empty(m), np.empty(m)
    seen, exact, left = np.empty(m, np.int8), np.empty(m, np.int8), np.empty(m, np.int64)
    _coarse_quantiles(*args, lo, hi, seen, exact, blo, bhi, left)
    return args, blo, bhi, lo, hi, exact, left


@settings(max_examples=120 if JIT else 25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 400 if JIT else 100),
    point_share=st.sampled_from([0.0, 0.3]),
    spread=st.sampled_from([1e-6, 0.05, 1.0, 6.0]),
    q=st.sampled_from([0.1, 0.5, 0.9, 0.999]),
)
def test_every_located_interval_holds_the_exact_quantile(seed, n, point_share, spread, q):
    # Newton's intervals and the coarse brackets alike hold the full bisection's answer: the
    # oracle is _max_quantiles, 60 bisection steps from the initial bracket.
    args, blo, bhi, _, hi, exact, left = _located(*_keys_inputs(seed, n, point_share, spread), q)
    answer = _max_quantiles(*args)
    elo, ehi = _exp_bounds(blo, bhi, hi, exact)
    assert np.all(elo <= answer) and np.all(answer <= ehi)
    assert np.array_equal(elo[exact != 0], answer[exact != 0]) and np.array_equal(ehi[exact != 0], answer[exact != 0])
    open_ = exact == 0
    # A minibatch Newton located keeps its initial bracket, so finishing it runs the whole bisection.
    assert set(np.unique(left[open_]).tolist()) <= {_BISECT_STEPS, _BISECT_STEPS - 30}


def test_newton_locates_the_quantile_of_a_minibatch_of_lognormal_rows():
    # One minibatch, rows without point masses, q = 0.9: Newton's interval, a few units of 1e-9 wide.
    rng = np.random.default_rng(5)
    q50 = rng.lognormal(5.5, 0.9, 16)
    sig = rng.uniform(0.1, 1.5, 16)
    starts, nseq = np.array([0, 16]), np.full(16, 8.0)
    args, blo, bhi, _, _, exact, left = _located(
        starts, nseq, q50 * np.exp(sig**2 / 2), q50 * np.exp(-Z90 * sig), q50, q50 * np.exp(Z90 * sig), 0.9
    )
    assert exact[0] == 0 and left[0] == _BISECT_STEPS  # Newton's, not the coarse bisection's
    assert 0 < bhi[0] - blo[0] < 1e-7
    assert math.exp(blo[0]) <= _max_quantiles(*args)[0] <= math.exp(bhi[0])


@needs_jit
def test_newton_locates_most_quantiles_at_scale():
    # The realistic mix (a tenth point masses, bands up to 1.2 wide): the coarse bisection is the exception.
    _, _, _, _, _, exact, left = _located(*_keys_inputs(3, 200_000, 0.1, 1.2), 0.9)
    assert np.mean((exact == 0) & (left == _BISECT_STEPS)) > 0.9  # 0.974 when written
