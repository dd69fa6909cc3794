"""``aspc run``, ``aspc simulate`` and ``aspc calibrate`` through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.errors import AspcError

RUN_KEYS = {
    "mean_iteration_time",
    "p95_iteration_time",
    "makespan",
    "lower_bound",
    "trainer_wait_fraction",
    "worker_busy_fraction",
    "policy_lag_mean",
    "policy_lag_max",
    "samples_generated",
    "samples_consumed",
    "n_trainer_steps",
}


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def plan(dataset: Path, tmp_path: Path) -> Path:
    """A plan compiled from the known lengths of ``dataset`` (no predictor needed)."""
    out = tmp_path / "plan.parquet"
    from aspc.compiler import CompileConfig, InputOptions, compile_file
    from aspc.emit import write_plan

    plan = compile_file(dataset, InputOptions(length_field="lengths"), CompileConfig(samples_per_prompt=4))
    write_plan(plan, out)
    return out


def test_run_with_no_options_simulates_and_says_lengths_are_drawn(plan):
    r = invoke("run", plan)
    assert r.exit_code == 0, r.output
    assert "mean_iteration_time" in r.stdout
    assert "drawn" in r.stderr and "predicted_q10..q90" in r.stderr


def test_run_contract_json(plan, dataset):
    r = invoke(
        "run",
        plan,
        "--backend",
        "sim",
        "--actual-lengths",
        dataset,
        "--length-field",
        "lengths",
        "--workers",
        "8",
        "--global-batch",
        "64",
        "--json",
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert RUN_KEYS <= set(out)
    assert out["samples_generated"] == 1600
    assert out["samples_consumed"] == out["n_trainer_steps"] * 64
    assert out["length_source"] == "actual"


def test_run_log_then_calibrate_then_run_with_the_fit(plan, dataset, tmp_path):
    run_dir = tmp_path / "RUN"
    r = invoke(
        "run",
        plan,
        "--actual-lengths",
        dataset,
        "--length-field",
        "lengths",
        "--workers",
        "4",
        "--global-batch",
        "32",
        "--log",
        run_dir,
        "--quiet",
    )
    assert r.exit_code == 0, r.output
    t = ds.dataset(run_dir / "samples").to_table()
    assert t.num_rows == 1600
    assert {
        "prompt_id",
        "sample_index",
        "response_len",
        "minibatch",
        "worker",
        "weights_version",
        "consumed_step",
    } <= set(t.column_names)
    r = invoke("calibrate", run_dir, "-o", tmp_path / "cost.json", "--json")
    assert r.exit_code == 0, r.output
    fit = json.loads(r.stdout)
    assert fit["r2_generation"] == pytest.approx(1.0)
    r = invoke("run", plan, "--cost-model", tmp_path / "cost.json", "--json", "--seed", "3")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workers", "0"], "--workers must be >= 1"),
        (["--global-batch", "64", "--queue-capacity", "10"], "smaller than one global batch"),
        (["--backend", "hf"], "--model"),
        (["--engine", "ray"], "local engine"),
        (["--speed-probe"], "the sim backend has no machine speed"),
    ],
)
def test_run_bad_options(plan, tmp_path, args, message):
    r = invoke("run", plan, *args, "--log", tmp_path / "RUN")
    assert r.exit_code != 0
    assert message in r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "RUN").exists()


def test_run_missing_lengths_and_bad_cost_model(plan, tmp_path):
    partial = tmp_path / "partial.jsonl"
    partial.write_text(json.dumps({"id": "p00000", "lengths": [5]}) + "\n")
    r = invoke(
        "run", plan, "--actual-lengths", partial, "--length-field", "lengths", "--log", tmp_path / "RUN"
    )
    assert r.exit_code != 0 and "399 of 400 plan prompts have no length" in r.output
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"decode_base": 0.1, "alpha": 2}))
    r = invoke("run", plan, "--cost-model", cost, "--log", tmp_path / "RUN")
    assert r.exit_code != 0 and "unknown keys ['alpha']" in r.output
    assert not (tmp_path / "RUN").exists()


def test_run_refuses_a_plan_of_another_schema_version(plan, tmp_path):
    t = pq.read_table(plan)
    meta = dict(t.schema.metadata)
    meta[b"aspc.schema_version"] = b"9.0"
    newer = tmp_path / "newer.parquet"
    pq.write_table(t.replace_schema_metadata(meta), newer)
    r = invoke("run", newer)
    assert r.exit_code != 0 and "schema 9.0" in r.output


def test_run_and_inspect_refuse_a_plan_that_check_refuses(plan, tmp_path):
    import numpy as np
    import pyarrow as pa

    t = pq.read_table(plan)
    pred = t.column("predicted_len").to_numpy().copy()
    pred[3] *= 5  # the structure still holds; only the rows hash and the metrics tell
    edited = tmp_path / "edited.parquet"
    table = t.set_column(t.schema.get_field_index("predicted_len"), "predicted_len", pa.array(pred))
    pq.write_table(table.replace_schema_metadata(t.schema.metadata), edited)
    assert np.isclose(pq.read_table(edited).column("predicted_len").to_numpy()[3], pred[3])
    for args in (("check", edited), ("run", edited, "--log", tmp_path / "RUN"), ("inspect", edited)):
        r = invoke(*args)
        assert r.exit_code != 0, args
        assert "edited by hand?" in r.output and "recompile the plan" in r.output, (args, r.output)
        assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "RUN").exists()
    assert invoke("inspect", plan).exit_code == 0


def test_run_says_when_the_global_batch_is_more_than_the_plan(plan):
    n = pq.read_table(plan).num_rows * 4  # the fixture's samples_per_prompt
    r = invoke("run", plan, "--global-batch", n + 1, "--json")
    assert r.exit_code == 0
    said = " ".join(r.stderr.split())  # rich wraps notes to the terminal's width
    assert f"--global-batch {n + 1} is more than the plan's {n} samples: the trainer takes no step" in said
    assert json.loads(r.stdout)["n_trainer_steps"] == 0
    r = invoke("run", plan, "--global-batch", n, "--json")
    assert "more than the plan" not in r.stderr and json.loads(r.stdout)["n_trainer_steps"] == 1
    # With --samples-per-prompt the plan's samples are counted as overridden.
    r = invoke("run", plan, "--global-batch", n, "--samples-per-prompt", 3, "--json")
    assert f"the plan's {n // 4 * 3} samples" in " ".join(r.stderr.split())


def test_simulate_contract_json(dataset):
    predict = pytest.importorskip("aspc.predict")
    try:
        predict.load_predictor("default")
    except (AttributeError, AspcError):
        pytest.skip("the default predictor is not in this checkout yet")
    r = invoke(
        "simulate",
        dataset,
        "--length-field",
        "lengths",
        "--samples-per-prompt",
        "4",
        "--workers",
        "8",
        "--global-batch",
        "64",
        "--seed",
        "0",
        "--strategies",
        "random,sorted,asp,oracle",
        "--json",
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)["strategies"]
    assert set(out) == {"random", "sorted", "asp", "oracle"}
    for d in out.values():
        assert RUN_KEYS <= set(d)
        assert d["samples_generated"] == 1600
    assert out["random"]["mean_iteration_time_vs_random"] == 1.0
    assert out["oracle"]["mean_iteration_time"] < out["random"]["mean_iteration_time"]


def test_simulate_oracle_only_table_and_errors(dataset):
    r = invoke("simulate", dataset, "--length-field", "lengths", "-n", "2", "--strategies", "oracle")
    assert r.exit_code == 0, r.output
    assert "oracle" in r.stdout and "strategy" in r.stdout
    r = invoke("simulate", dataset, "--strategies", "oracle")
    assert r.exit_code != 0 and "needs actual response lengths" in r.output
    r = invoke("simulate", dataset, "--length-field", "lengths", "--strategies", "oracle,fifo")
    assert r.exit_code != 0 and "unknown strategies ['fifo']" in r.output


@pytest.mark.parametrize("cmd", ["run", "simulate", "calibrate"])
def test_help(cmd):
    r = invoke(cmd, "--help")
    assert r.exit_code == 0 and len(r.output) > 200


def test_real_backend_options_on_the_sim_backend_are_named_as_ignored(plan):
    # --device, --temperature and --replay-lengths were taken silently by the sim backend.
    r = CliRunner().invoke(main, ["run", str(plan), "--device", "cpu", "--temperature", "0.5", "--top-k", "4"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "--device, --temperature, --top-k are ignored by the sim backend" in text
    r = CliRunner().invoke(main, ["run", str(plan), "--device", "auto", "--temperature", "1"])
    assert r.exit_code == 0 and "ignored by the sim backend" not in r.output  # the defaults say nothing


def test_a_simulation_past_the_available_memory_is_refused_in_one_line(dataset, monkeypatch):
    # -n 1000000 on 600 prompts was killed by the kernel's OOM killer, exit 137 and no word.
    import aspc.memory

    monkeypatch.setattr(aspc.memory, "available_bytes", lambda: 2**20)
    r = CliRunner().invoke(main, ["simulate", str(dataset), "--length-field", "lengths", "-n", "1000", "-q"])
    assert r.exit_code == 2 and "samples needs at least" in r.output and "GiB available" in r.output, r.output
    monkeypatch.setattr(aspc.memory, "available_bytes", lambda: None)  # unknown (no /proc): not refused
    r = CliRunner().invoke(main, ["simulate", str(dataset), "--length-field", "lengths", "-n", "2", "-q",
                                  "--strategies", "asp"])  # fmt: skip
    assert r.exit_code == 0, r.output


def test_a_plan_copy_that_cannot_be_written_after_the_run_says_the_run_is_complete(plan, tmp_path, monkeypatch):
    # The log was already marked complete; "free space or write elsewhere" did not say --resume keeps it.
    import aspc.predict.pairs as pairs
    from aspc.errors import OutputError

    def full(plan_path, log_dir):
        raise OutputError(f"no space left on the device holding {log_dir}/plan.parquet; free space or write elsewhere")

    monkeypatch.setattr(pairs, "keep_plan_in_log", full)
    run_dir = tmp_path / "RUN"
    r = CliRunner().invoke(main, ["run", str(plan), "--log", str(run_dir), "-q"])
    assert r.exit_code == 2 and "the run itself is complete" in r.output and "write elsewhere" not in r.output
    monkeypatch.undo()
    r = CliRunner().invoke(main, ["run", str(plan), "--log", str(run_dir), "-q", "--resume"])
    assert r.exit_code == 0 and (run_dir / "plan.parquet").is_file()
