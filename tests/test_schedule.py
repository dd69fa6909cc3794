"""The asp dispatch order: longest first on the upper quantile, never worse than random when uninformed."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspc.anneal import lpt_order, max_quantiles
from aspc.compiler import CompileConfig, InputOptions, compile_plan, prediction_from_lengths
from aspc.io.prompts import PromptTable
from aspc.predict.base import LengthPrediction
from aspc.runtime import RunConfig, run

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _naive_lpt(key, assignment, tie):
    groups = sorted(set(assignment))
    peak = {g: max(key[k] for k in range(len(key)) if assignment[k] == g) for g in groups}
    gtie = {g: min(tie[k] for k in range(len(key)) if assignment[k] == g) for g in groups}
    out = []
    for g in sorted(groups, key=lambda g: (-peak[g], gtie[g])):
        members = [k for k in range(len(key)) if assignment[k] == g]
        out += sorted(members, key=lambda k: (-key[k], tie[k]))
    return out


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    m=st.integers(1, 30),
    g=st.integers(1, 8),
)
def test_lpt_order_matches_brute_force(data, m, g):
    g = min(g, m)
    assignment = list(range(g)) + data.draw(st.lists(st.integers(0, g - 1), min_size=m - g, max_size=m - g))
    # Few distinct keys, so ties happen.
    key = data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.5, 7.0, 100.0]), min_size=m, max_size=m))
    tie = data.draw(st.permutations(list(range(m))))
    got = lpt_order(np.array(key), np.array(assignment), g, np.array(tie))
    assert got.tolist() == _naive_lpt(key, assignment, tie)


def test_max_quantiles_match_monte_carlo():
    rng = np.random.default_rng(0)
    n = 12
    q50 = rng.lognormal(5, 0.5, n)
    sig = rng.uniform(0.1, 0.9, n)
    q10, q90 = q50 * np.exp(-1.2816 * sig), q50 * np.exp(1.2816 * sig)
    starts = np.array([0, 5, 12])
    nseq = np.full(n, 4)
    got = max_quantiles(starts, nseq, q50, q10, q50, q90, q=0.9)
    draws = rng.lognormal(np.log(q50)[None, :, None], sig[None, :, None], size=(20000, n, 4)).max(axis=2)
    for b in range(2):
        mx = draws[:, starts[b] : starts[b + 1]].max(axis=1)
        assert got[b] == pytest.approx(np.quantile(mx, 0.9), rel=0.03)
    # Point masses: the quantile is the largest of them.
    pm = max_quantiles(np.array([0, 3]), np.ones(3), np.array([5.0, 9.0, 7.0]), *(np.array([5.0, 9.0, 7.0]),) * 3)
    assert pm[0] == pytest.approx(9.0)


def _table(n: int, seed: int) -> tuple[PromptTable, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    ids = [f"p{i}" for i in range(n)]
    lens = {pid: np.maximum(1, rng.lognormal(rng.normal(5.5, 0.8), 0.6, size=4)) for pid in ids}
    t = PromptTable(ids, ids, ids, np.arange(n, dtype=np.int64), np.full(n, 30, dtype=np.int64), None, "0" * 64)
    return t, lens


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(40, 400),
    b=st.integers(2, 12),
    workers=st.integers(1, 8),
    gb=st.integers(4, 64),
    seed=st.integers(0, 50),
    value=st.floats(10, 2000),
)
def test_constant_predictions_asp_within_2pct_of_random(n, b, workers, gb, seed, value):
    table, lens = _table(n, seed)
    flat = LengthPrediction(*(np.full(n, value) for _ in range(4)))
    rc = RunConfig(workers=workers, global_batch=gb, seed=seed)
    res = {}
    for strategy in ("random", "asp"):
        cfg = CompileConfig(samples_per_prompt=4, batch_size=b, seed=seed, strategy=strategy, workers=workers)
        res[strategy] = run(compile_plan(table, flat, cfg), config=rc, actual_lengths=lens).summary
    r, a = res["random"].mean_iteration_time, res["asp"].mean_iteration_time
    if r is None:
        assert a is None
    else:
        assert abs(a / r - 1) <= 0.02


def test_lpt_beats_interleave_on_heavy_tails():
    # Informative predictions on heavy-tailed lengths: the longest-first order
    # ends the run sooner than the interleaved one (same minibatches).
    table, lens = _table(1200, 3)
    pred = prediction_from_lengths([lens[p] for p in table.ids])
    rc = RunConfig(workers=8, global_batch=64, reload_time=0.0)  # the bound excludes reloads
    out = {}
    for order in ("lpt", "interleave"):
        cfg = CompileConfig(samples_per_prompt=4, workers=8, order=order)
        out[order] = run(compile_plan(table, pred, cfg), config=rc, actual_lengths=lens).summary
    assert out["lpt"].makespan <= out["interleave"].makespan
    assert out["lpt"].makespan_over_lower_bound < 1.05


def test_shuffling_the_input_does_not_move_asp_outside_the_spread(tmp_path):
    from aspc.simulate import comparison_table, simulate_strategies

    src = ROOT / "examples" / "prompts.jsonl"
    lines = src.read_text().splitlines()
    random.Random(7).shuffle(lines)
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("\n".join(lines) + "\n")
    inputs = InputOptions(length_field="lengths")
    cfg = CompileConfig(samples_per_prompt=4, workers=4)
    rc = RunConfig(workers=4, global_batch=64)
    stats = []
    for path in (src, shuffled):
        res = simulate_strategies(path, inputs, cfg, rc, strategies=["random", "asp"], repeats=5)
        stats.append(comparison_table(res)["asp"]["repeats"]["mean_iteration_time_vs_random"])
    (a, b) = stats
    spread = max(a["std"], b["std"])
    assert abs(a["mean"] - b["mean"]) <= 2 * spread + 1e-9, json.dumps(stats)


def test_plan_does_not_depend_on_input_order_for_tied_predictions():
    # Equal predictions: the plan's minibatches come from the seeded permutation,
    # so the same prompts in another file order give the same groups of ids.
    table, _ = _table(64, 0)
    flat = prediction_from_lengths([np.array([100.0])] * 64)
    cfg = CompileConfig(samples_per_prompt=1, batch_size=8, seed=1)
    p1 = compile_plan(table, flat, cfg)
    assert p1.metrics["order"] == "random (constant predictions)"
    rnd = compile_plan(table, flat, CompileConfig(samples_per_prompt=1, batch_size=8, seed=1, strategy="random"))
    assert p1.table.column("prompt_id").to_pylist() == rnd.table.column("prompt_id").to_pylist()


@pytest.mark.parametrize("order", ["lpt", "interleave", "ascending"])
def test_tied_predictions_give_the_same_plan_in_any_line_order(tmp_path, order):
    # Known lengths (means of ten integers) tie often: 22 of the example's prompts did. A seeded
    # permutation of row positions broke them by line order; the seeded key of each id does not.
    import pyarrow.parquet as pq

    from tests.conftest import invoke_cli

    lines = (ROOT / "examples" / "prompts.jsonl").read_text().splitlines()
    means = [np.mean(json.loads(ln)["lengths"]) for ln in lines]
    assert len(set(means)) < len(means)  # the case this test is about
    random.Random(3).shuffle(lines)
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("\n".join(lines) + "\n")
    cols = []
    for i, src in enumerate((ROOT / "examples" / "prompts.jsonl", shuffled)):
        out = tmp_path / f"p{i}.parquet"
        res = invoke_cli("compile", src, "--length-field", "lengths", "--order", order, "-o", out, "-q")
        assert res.exit_code == 0, res.output
        cols.append(pq.read_table(out, columns=["prompt_id", "minibatch", "group"]).to_pydict())
    assert cols[0] == cols[1]


@pytest.mark.parametrize(("groups", "equal"), [("4", True), ("7", False)])
def test_equal_samples_records_and_says_how_equal_the_groups_are(tmp_path, groups, equal):
    # --equal-samples is best effort (minibatches of 12-20 prompts); it said nothing when groups held 147-159.
    # Swaps level 4 groups to 150 samples each; 600 samples cannot split evenly in 7.
    import pyarrow.parquet as pq

    from aspc.emit.plan import read_plan
    from tests.conftest import invoke_cli

    out = tmp_path / "eq.parquet"
    res = invoke_cli("compile", ROOT / "examples" / "prompts.jsonl", "--length-field", "lengths", "--equal-samples",
                     "--groups", groups, "-o", out)  # fmt: skip
    assert res.exit_code == 0, res.output
    t = pq.read_table(out, columns=["group", "n_samples"]).to_pydict()
    per_group = np.bincount(t["group"], weights=t["n_samples"]).astype(int)
    lo, hi = read_plan(out).metrics["group_samples_range"]
    assert (lo, hi) == (per_group.min(), per_group.max())
    said = f"--equal-samples: groups hold {lo}-{hi} samples" in " ".join(res.output.split())
    assert (lo == hi) is equal
    assert said is (lo != hi)
