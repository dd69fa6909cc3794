"""Epoch runs found wanting by a hunt: partial output on bad lengths, advice that was then refused, the run's -n."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import invoke_cli, one_line_error

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def data(tmp_path):
    lines = (ROOT / "examples" / "prompts.jsonl").read_text().splitlines()[:120]
    full = tmp_path / "p.jsonl"
    full.write_text("\n".join(lines) + "\n")
    missing = tmp_path / "missing.jsonl"
    missing.write_text("\n".join(lines[:100]) + "\n")
    return full, missing


def _plan(tmp_path, src, n="4"):
    plan = tmp_path / f"plan{n}.parquet"
    r = invoke_cli("compile", src, "-n", n, "-o", plan, "-q")
    assert r.exit_code == 0, r.output
    return plan


def test_an_epochs_run_on_a_lengths_file_missing_prompts_writes_nothing_and_the_fixed_command_runs(tmp_path, data):
    # It left plans/epoch-1.parquet, and the corrected command was refused ("already holds epoch plans").
    full, missing = data
    plan, log = _plan(tmp_path, full), tmp_path / "R"
    args = ["run", plan, "--epochs", "2", "--log", log, "--length-field", "lengths", "-q"]
    r = invoke_cli(*args, "--actual-lengths", missing)
    assert r.exit_code == 2
    assert "20 of 120 plan prompts have no length in missing.jsonl" in one_line_error(r)
    assert not log.exists()
    r = invoke_cli(*args, "--actual-lengths", full)
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("extra", [[], ["--epochs", "2"]])
def test_a_folder_holding_no_run_log_is_not_offered_overwrite_or_resume(tmp_path, data, extra):
    # Both refuse such a folder ("not an aspc run log"): the first message offered them anyway.
    plan, log = _plan(tmp_path, data[0]), tmp_path / "foo"
    log.mkdir()
    (log / "x").write_text("mine")
    r = invoke_cli("run", plan, "--log", log, "-q", *extra)
    assert r.exit_code != 0
    msg = one_line_error(r)
    assert "holds no aspc run log; pick a new path" in msg and "--overwrite" not in msg and "--resume" not in msg
    assert (log / "x").read_text() == "mine"


def test_later_epochs_plan_the_samples_per_prompt_the_run_generates(tmp_path, data):
    # A plan of 8 samples a prompt run with -n 2: epoch 2 was compiled (and balanced) for 8.
    full, _ = data
    plan, log = _plan(tmp_path, full, n="8"), tmp_path / "R"
    r = invoke_cli("run", plan, "-n", "2", "--epochs", "2", "--log", log, "--actual-lengths", full,
                   "--length-field", "lengths", "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert set(pq.read_table(log / "plans" / "epoch-2.parquet").column("n_samples").to_pylist()) == {2}


def test_epoch_one_replays_zero_lengths_as_a_run_without_epochs_does(tmp_path, data):
    # Epochs floored every replayed length at 1 token: a response that ended at once came back 1 long.
    import json

    import pyarrow.dataset as ds

    rows = [json.loads(x) for x in data[0].read_text().splitlines()]
    for i, r in enumerate(rows):
        if i % 3 == 0:
            r["lengths"][0] = 0
    src = tmp_path / "zeros.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = _plan(tmp_path, src, n="2")
    common = ["--actual-lengths", src, "--length-field", "lengths", "-q"]
    assert invoke_cli("run", plan, "--log", tmp_path / "one", *common).exit_code == 0
    assert invoke_cli("run", plan, "--epochs", "2", "--log", tmp_path / "two", *common).exit_code == 0

    def lengths(d):
        t = ds.dataset(d / "samples").to_table().sort_by([("prompt_id", "ascending"), ("sample_index", "ascending")])
        return t.column("response_len").to_pylist()

    plain = lengths(tmp_path / "one")
    assert plain.count(0) == 40
    assert lengths(tmp_path / "two" / "epoch-1") == plain


def test_a_seed_the_epochs_would_carry_past_the_largest_is_refused_before_any_epoch(tmp_path, data):
    # Epoch 1 ran in full, then epoch 2 was refused for seed 2**63, which the user never gave.
    full, _ = data
    plan, log = _plan(tmp_path, full), tmp_path / "R"
    r = invoke_cli("run", plan, "--epochs", "2", "--seed", str(2**63 - 1), "--log", log, "--actual-lengths", full,
                   "--length-field", "lengths", "-q")  # fmt: skip
    assert "use a --seed of at most 9223372036854775806" in one_line_error(r, 2)
    assert not log.exists()


def test_a_plan_compiled_with_the_largest_seed_is_refused_before_any_epoch(tmp_path, data):
    # The same for the plan's compile seed, which epoch k's plan carries on (+ k - 1).
    full, _ = data
    plan, log = tmp_path / "top.parquet", tmp_path / "R"
    assert invoke_cli("compile", full, "-o", plan, "--seed", str(2**63 - 1), "-q").exit_code == 0
    args = ["run", plan, "--log", log, "--actual-lengths", full, "--length-field", "lengths", "-q"]
    r = invoke_cli(*args, "--epochs", "2")
    assert "compile the plan with a --seed of at most 9223372036854775806" in one_line_error(r, 2)
    assert not log.exists()
    assert invoke_cli(*args, "--epochs", "1").exit_code == 0  # one epoch compiles nothing
