"""Options whose behaviour disagreed with their --help text or the README (a hunt of 2026-12-07).

Each case failed on the code before its fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import invoke_cli, one_line_error

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "prompts.jsonl"


@pytest.mark.parametrize(
    ("extra", "want"),
    [
        (["--backend", "hf"], "simulate runs the simulator only, not --backend hf"),
        (["--backend", "vllm"], "run it with 'aspc run PLAN --backend vllm --model DIR'"),
        (["--engine", "ray"], "simulate runs the simulator in this process, not --engine ray"),
    ],
)
def test_simulate_refuses_a_backend_it_cannot_run(small, extra, want):
    # --help offered hf|vllm and ray; hf then asked for a --model that simulate does not take.
    assert want in one_line_error(invoke_cli("simulate", small, "--length-field", "lengths", *extra, "-q"), 2)


def test_simulate_help_does_not_offer_them(small):
    out = invoke_cli("simulate", "--help").output
    assert "--backend" not in out and "--engine" not in out
    r = invoke_cli("simulate", small, "--length-field", "lengths", "--backend", "sim", "--engine", "local", "-q")
    assert r.exit_code == 0, r.output  # the simulator's own, given explicitly, still runs


@pytest.mark.parametrize("extra", [["--strategy", "random"], ["--strategy", "sorted"], ["--order", "ascending"]])
def test_equal_samples_unused_is_said_once(tmp_path, extra):
    # A second note went on to say how equal "swapping their minibatches" had made the groups: no swap ran.
    r = invoke_cli("compile", EXAMPLE, "--length-field", "lengths", "-o", tmp_path / "p.parquet", "--equal-samples",
                   *extra)  # fmt: skip
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert text.count("--equal-samples:") == 1 and "not used" in text and "swapping" not in text, text


def test_a_trailing_slash_is_answered_with_a_name_the_command_takes(tmp_path, small, plan):
    # Every command suggested DIR/plan.parquet, which calibrate (JSON) and a JSONL export then refused.
    log = tmp_path / "R"
    assert invoke_cli("run", plan, "--log", log, "-q").exit_code == 0
    cases = [
        (["calibrate", log], "cost.json"),
        (["export", plan, "--format", "jsonl", "--no-source"], "train.jsonl"),
        (["export", plan, "--format", "verl", "--no-source"], "train.parquet"),
        (["predict", "default", small], "preds.parquet"),
        (["compile", small], "plan.parquet"),
    ]
    for i, (args, name) in enumerate(cases):
        out = f"{tmp_path / f'o{i}'}/"
        line = one_line_error(invoke_cli(*args, "-o", out), 2)
        assert line.endswith(f"give a file path, e.g. {out}{name}"), line
        fixed = invoke_cli(*args, "-o", f"{out}{name}", "-q")
        assert fixed.exit_code == 0, (args, fixed.output)


def test_run_quiet_without_a_log_keeps_its_table(tmp_path, plan):
    # It printed nothing at all: --quiet drops the table only where a file is the result (README).
    r = invoke_cli("run", plan, "-q")
    assert r.exit_code == 0 and "mean_iteration_time" in r.output, r.output
    r = invoke_cli("run", plan, "-q", "--log", tmp_path / "R")
    assert r.exit_code == 0 and r.output == "", r.output
