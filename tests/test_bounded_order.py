"""The "ascending" order: asp's plan for a run under --max-staleness K (aspc.choices.ORDERS)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.cli import main
from aspc.compiler import CompileConfig, compile_plan
from aspc.emit import schema as S
from aspc.emit.check import check_plan
from aspc.io.prompts import PromptTable
from aspc.predict.base import LengthPrediction


def _inputs(n: int, seed: int):
    rng = np.random.default_rng(seed)
    ids = [f"p{i}" for i in range(n)]
    table = PromptTable(ids, ids, ids, np.arange(n, dtype=np.int64), np.full(n, 20, dtype=np.int64), None, "0" * 64)
    mean = np.exp(rng.normal(6.0, 1.0, n))
    return table, LengthPrediction(mean, 0.5 * mean, mean, 2.0 * mean)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(8, 400), batch=st.integers(1, 24), samples=st.integers(1, 4), seed=st.integers(0, 50))
def test_ascending_plans_equal_minibatches_shortest_first(n, batch, samples, seed):
    table, pred = _inputs(n, seed)
    batch = min(batch, n)
    cfg = CompileConfig(samples_per_prompt=samples, batch_size=batch, order="ascending", seed=seed)
    plan = compile_plan(table, pred, cfg)
    t = plan.table
    assert check_plan(plan).ok
    mb = t.column(S.MINIBATCH).to_numpy()
    sizes = np.bincount(mb)
    assert np.all(sizes[:-1] == batch) and 1 <= sizes[-1] <= 2 * batch  # equal, the remainder in the last
    pred_len = t.column(S.PREDICTED_LEN).to_numpy()
    assert np.all(np.diff(pred_len) >= 0)  # every prompt after every shorter one: minibatches too
    groups = t.column(S.GROUP).to_numpy()
    assert np.all(np.diff(groups) >= 0)  # consecutive minibatches form the groups
    assert plan.metrics is not None
    again = compile_plan(table, pred, cfg).table
    assert again.equals(t)  # same input and seed, same plan


def test_constant_predictions_arrange_as_random_does():
    table, pred = _inputs(200, 0)
    flat = LengthPrediction(*(np.full(200, 300.0) * f for f in (1.0, 0.5, 1.0, 2.0)))
    asc = compile_plan(table, flat, CompileConfig(batch_size=8, order="ascending", seed=3)).table
    rnd = compile_plan(table, flat, CompileConfig(batch_size=8, strategy="random", seed=3)).table
    assert asc.column(S.PROMPT_ID).equals(rnd.column(S.PROMPT_ID))


@pytest.fixture
def dataset(tmp_path):
    rng = np.random.default_rng(4)
    path = tmp_path / "in.jsonl"
    with open(path, "w") as f:
        for i in range(160):
            level = rng.normal(5.5, 1.0)
            lens = np.clip(np.round(np.exp(level + 0.3 * rng.normal(size=4))), 1, 4096).astype(int).tolist()
            f.write(json.dumps({"id": f"p{i}", "prompt": f"question {i} " + "word " * int(level * 3),
                                "lengths": lens}) + "\n")  # fmt: skip
    return path


def test_simulate_plans_asp_for_the_bound_unless_told(dataset):
    args = ["simulate", str(dataset), "--length-field", "lengths", "--samples-per-prompt", "4", "--workers", "4",
            "--global-batch", "64", "--strategies", "random,asp", "--json", "--quiet"]  # fmt: skip
    runner = CliRunner()

    def asp(*extra):
        r = runner.invoke(main, [*args, *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["strategies"]["asp"]

    bounded = asp("--max-staleness", "2")
    assert bounded == asp("--max-staleness", "2", "--order", "ascending")
    lpt = asp("--max-staleness", "2", "--order", "lpt")
    assert lpt != bounded and lpt["policy_lag_max"] <= 2 and bounded["policy_lag_max"] <= 2
    assert asp() == asp("--order", "lpt")  # unbounded: lpt, as before


def test_run_notes_an_unbounded_order_under_a_bound(dataset, tmp_path):
    runner = CliRunner()
    for order in ("lpt", "ascending"):
        plan = tmp_path / f"{order}.parquet"
        r = runner.invoke(main, ["compile", str(dataset), "-n", "4", "--order", order, "-o", str(plan), "--quiet"])
        assert r.exit_code == 0, r.output
        r = runner.invoke(main, ["run", str(plan), "--max-staleness", "2", "--global-batch", "64", "--actual-lengths",
                                 str(dataset), "--length-field", "lengths", "--json"])  # fmt: skip
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["policy_lag_max"] <= 2
        assert ("--order ascending" in r.stderr) == (order == "lpt"), r.stderr


def test_epochs_under_a_bound_are_planned_for_it(dataset, tmp_path):
    from aspc.emit import read_plan

    plan = tmp_path / "plan.parquet"
    assert CliRunner().invoke(main, ["compile", str(dataset), "-n", "4", "-o", str(plan), "--quiet"]).exit_code == 0
    r = CliRunner().invoke(main, ["run", str(plan), "--epochs", "2", "--max-staleness", "2", "--global-batch", "64",
                                  "--actual-lengths", str(dataset), "--length-field", "lengths",
                                  "--log", str(tmp_path / "RUN"), "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert read_plan(tmp_path / "RUN" / "plans" / "epoch-2.parquet").config["order"] == "ascending"


def test_a_bound_no_minibatch_can_meet_is_refused_with_values_that_work(dataset, tmp_path):
    # 8 samples per prompt and the default global batch (64): a minibatch of 20 prompts is 160 samples, more
    # than K = 2 global batches. One line that names the values that would work, no run log; both do.
    plan = tmp_path / "plan.parquet"
    runner = CliRunner()
    assert runner.invoke(main, ["compile", str(dataset), "-n", "8", "-o", str(plan), "--quiet"]).exit_code == 0
    args = ["run", str(plan), "--actual-lengths", str(dataset), "--length-field", "lengths", "--json"]
    r = runner.invoke(main, [*args, "--max-staleness", "2", "--log", str(tmp_path / "RUN")])
    assert r.exit_code != 0 and "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "RUN").exists()
    import re

    k, gb = map(int, re.search(r"--max-staleness to (\d+) or --global-batch to (\d+)", r.stderr).groups())
    for extra in (["--max-staleness", str(k)], ["--max-staleness", "2", "--global-batch", str(gb)]):
        ok = runner.invoke(main, [*args, *extra])
        assert ok.exit_code == 0, ok.output
        assert json.loads(ok.stdout)["policy_lag_max"] <= int(extra[1])
