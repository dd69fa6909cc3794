"""Plans a user hunt edited (with aspc's own reader and writer) that broke check, inspect, report and export:
each case failed on the code before its fix (a traceback, an output left behind, invalid JSON, a plan that
passed check and then failed in run, loads that disagreed between commands).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from aspc.emit import schema as S
from aspc.emit.plan import Plan, plan_cost_model, read_plan, write_plan
from aspc.errors import InputError, PlanError
from tests.conftest import invoke_cli as _run
from tests.conftest import one_line_error as _one_line_error
from tests.conftest import write_jsonl

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "prompts.jsonl"


def _with(plan_path: Path, out: Path, *, metrics: dict | None = None, config: dict | None = None,
          drop: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """``plan_path`` rewritten by aspc's writer (rows hash intact) with metadata keys set or dropped."""
    p = read_plan(plan_path)
    m = {k: v for k, v in {**p.metrics, **(metrics or {})}.items() if k not in drop}
    write_plan(dataclasses.replace(p, metrics=m, config={**p.config, **(config or {})}), out)
    return out


def _strict(text: str) -> object:
    def refuse(name: str) -> None:
        raise ValueError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


# --- 1. verl settings from the plan's prompt token metrics


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("prompt_tokens_max", "abc"),  # was a traceback (int('abc')) with out.parquet left behind
        ("prompt_tokens_max", -5),  # these went into data.max_prompt_length as they were
        ("prompt_tokens_max", 1e30),
        ("prompt_tokens_max", 1.5),
        ("prompt_tokens_max", True),
        ("prompt_tokens_exact", "yes"),
        ("n_excluded_overlong", "x"),
    ],
)
def test_export_refuses_bad_prompt_token_metrics(tmp_path, plan, key, value):
    bad = _with(plan, tmp_path / "bad.parquet", metrics={key: value})
    out = tmp_path / "out.parquet"
    msg = _one_line_error(_run("export", bad, "--format", "verl", "--no-source", "-o", out), 2)
    assert f"plan metadata aspc.metrics {key} must be" in msg and "recompile the plan" in msg
    assert not out.exists()


def test_verl_settings_are_made_before_the_export_is_written(tmp_path, plan, monkeypatch):
    import aspc.export

    def refuse(*args, **kwargs):
        raise InputError("no settings for this plan")

    monkeypatch.setattr(aspc.export, "verl_settings", refuse)
    out = tmp_path / "out.parquet"
    assert "no settings for this plan" in _one_line_error(_run("export", plan, "--no-source", "-o", out), 2)
    assert not out.exists()


# --- 2. one cost model for check, inspect and report


def test_plan_without_cost_model_metric_gives_check_inspect_and_report_the_same_loads(tmp_path, plan):
    from aspc.report.data import plan_view

    assert read_plan(plan).config["cost_model"] == "expected-max"
    old = _with(plan, tmp_path / "old.parquet", drop=("cost_model",))  # older plans keep it only in their config
    assert plan_cost_model(read_plan(old)) == "expected-max"
    r = _run("check", old, "--json")
    assert r.exit_code == 0, r.output
    want = _strict(r.output)["max_group_load"]
    r = _run("inspect", old, "--json")
    assert r.exit_code == 0, r.output
    assert max(_strict(r.output)["group_loads"]) == pytest.approx(want, rel=1e-12)
    view = plan_view(read_plan(old), old.name)
    assert view.minibatch_cost == "expected-max"
    assert float(view.group_loads.max()) == pytest.approx(want, rel=1e-12)


def test_plan_cost_model_order():
    t = pa.table({})
    assert plan_cost_model(Plan(t, config={"cost_model": "padded"}, metrics={"cost_model": "expected-max"})) == (
        "expected-max"
    )
    assert plan_cost_model(Plan(t, config={"minibatch_cost": "padded", "cost_model": "expected-max"})) == "padded"
    assert plan_cost_model(Plan(t)) == "padded"


# --- 3. a one-group plan is balanced


def test_one_group_plan_passes_max_imbalance_zero(tmp_path):
    out = tmp_path / "g1.parquet"
    r = _run("compile", EXAMPLE, "--length-field", "lengths", "--groups", "1", "-o", out, "-q")
    assert r.exit_code == 0, r.output
    assert read_plan(out).metrics["group_imbalance"] == 0.0  # was 2.220446049250313e-16
    r = _run("check", out, "--max-imbalance", "0")
    assert r.exit_code == 0, r.output


def test_group_imbalance_ignores_rounding_only():
    from aspc.emit.metrics import IMBALANCE_ROUNDING, group_imbalance

    lb = 336120.4571829121
    assert group_imbalance(np.nextafter(lb, np.inf), lb, 1) == 0.0
    assert group_imbalance(np.nextafter(lb, np.inf), lb, 4) == 0.0  # balanced up to the sums' rounding
    assert group_imbalance(lb * (1 - 1e-15), lb, 4) == 0.0  # never negative
    assert group_imbalance(lb * 1.01, lb, 4) == pytest.approx(0.01)
    assert group_imbalance(lb * (1 + 10 * IMBALANCE_ROUNDING), lb, 4) > 0
    assert group_imbalance(5.0, 0.0, 4) == 0.0


# --- 4. non-finite metadata, strict --json


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [
        ("metrics", "init_imbalance", float("nan")),
        ("metrics", "order", float("nan")),
        ("metrics", "n_skipped", float("inf")),
        ("metrics", "anneal_iterations_run", float("nan")),
        ("config", "minibatch_overhead", float("nan")),
        ("config", "batch_size", float("nan")),
        ("config", "slack", float("-inf")),
    ],
)
def test_non_finite_metadata_is_one_line(tmp_path, plan, where, key, value):
    bad = _with(plan, tmp_path / "bad.parquet", **{where: {key: value}})
    for args in (["inspect", bad, "--json"], ["check", bad], ["export", bad, "--no-source", "-o", tmp_path / "o"]):
        msg = _one_line_error(_run(*args), 2)
        assert f"plan metadata aspc.{where} {key} must be" in msg, args
    assert not (tmp_path / "o").exists()


def test_emit_json_is_strict(capsys):
    from aspc.cli.common import emit_json

    emit_json({"a": float("nan"), "b": [np.float32("inf"), 1], "c": np.float64(1.5), "d": {"e": -np.inf},
               "f": np.array([1.0, np.nan]), "g": {2: "x"}})  # fmt: skip
    got = _strict(capsys.readouterr().out)
    assert got == {"a": None, "b": [None, 1], "c": 1.5, "d": {"e": None}, "f": [1.0, None], "g": {"2": "x"}}


# --- 5. lengths over compile's limit, quantiles out of order


def _rows_edited(plan_path: Path, out: Path, column: str, value: float) -> Path:
    """``plan_path`` with row 0's ``column`` set to ``value``, metrics recomputed: a plan check passed before."""
    from aspc.emit.metrics import plan_metrics

    p = read_plan(plan_path)
    col = p.column(column).astype(np.float64).copy()
    col[0] = value
    i = p.table.schema.get_field_index(column)
    t = p.table.set_column(i, p.table.schema.field(i), pa.array(col, pa.float64()))
    metrics = {**p.metrics, **plan_metrics(t, p.metrics["cost_model"], cap=p.metrics.get("response_cap"))}
    write_plan(dataclasses.replace(p, table=t, metrics=metrics, stored_rows_hash="", from_file=False), out)
    return out


@pytest.mark.parametrize(
    ("column", "value", "want"),
    [
        (S.PREDICTED_LEN, 2e9, "column predicted_len has lengths over 1e+09 tokens"),
        (S.PREDICTED_Q90, 3e9, "column predicted_q90 has lengths over 1e+09 tokens"),
        (S.PREDICTED_Q50, 5e8, "predicted_q50 exceeds predicted_q90 in some rows"),
    ],
)
def test_check_refuses_rows_compile_cannot_write(tmp_path, plan, column, value, want):
    bad = _rows_edited(plan, tmp_path / "bad.parquet", column, value)
    msg = _one_line_error(_run("check", bad), 2)
    assert want in msg and "recompile the plan" in msg


def test_validate_table_q10_above_q50():
    from aspc.emit.validate import validate_table

    n = 2
    t = pa.table(
        {
            S.PROMPT_ID: ["a", "b"], S.PROMPT: ["x", "y"], S.DISPATCH_RANK: np.arange(n), S.MINIBATCH: [0, 0],
            S.GROUP: [0, 0], S.N_SAMPLES: [1, 1], S.PROMPT_TOKENS: [1, 1], S.SOURCE_ROW: [0, 1],
            S.PREDICTED_LEN: [5.0, 5.0], S.PREDICTED_Q10: [4.0, 6.0], S.PREDICTED_Q50: [5.0, 5.0],
            S.PREDICTED_Q90: [6.0, 7.0],
        }
    )  # fmt: skip
    with pytest.raises(PlanError, match="predicted_q10 exceeds predicted_q50"):
        validate_table(t)


# --- 6. a source field of text in some rows and chats in others


def test_export_names_the_field_that_mixes_types(tmp_path):
    src = write_jsonl(tmp_path / "mixed.jsonl", [
        {"id": "a", "prompt": "hello", "lengths": [3]},
        {"id": "b", "prompt": [{"role": "user", "content": "hi"}], "lengths": [5]},
    ])  # fmt: skip
    plan = tmp_path / "p.parquet"
    assert _run("compile", src, "--length-field", "lengths", "-o", plan, "-q").exit_code == 0
    out = tmp_path / "o.parquet"
    msg = _one_line_error(_run("export", plan, "--format", "verl", "--source", src, "-o", out), 2)
    assert "mixed.jsonl: field 'prompt' mixes value types across rows" in msg
    assert not out.exists()
