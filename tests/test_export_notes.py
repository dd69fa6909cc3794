"""``export --format jsonl`` (OpenRLHF, slime, AReaL): notes on keeping the order, and the groups' sizes."""

from __future__ import annotations

import json

from tests.conftest import EXAMPLE, invoke_cli


def _export(tmp_path, *compile_args):
    plan, out = tmp_path / "plan.parquet", tmp_path / "train.jsonl"
    assert invoke_cli("compile", EXAMPLE, *compile_args, "-o", plan, "-q").exit_code == 0
    r = invoke_cli("export", plan, "--format", "jsonl", "-o", out, "--source", EXAMPLE, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_unequal_groups_are_noted_for_any_trainer(tmp_path):
    d = _export(tmp_path)
    assert sum(d["group_prompts"]) == d["rows"] and len(set(d["group_prompts"])) > 1
    assert any("no fixed number of prompts per step" in w for w in d["warnings"]), d["warnings"]
    assert any("never shuffled" in w and "OpenRLHF" in w for w in d["warnings"]), d["warnings"]


def test_equal_groups_get_the_order_note_only(tmp_path):
    d = _export(tmp_path, "--for", "verl")
    assert len(set(d["group_prompts"])) == 1 and d["groups_equal"]
    assert len(d["warnings"]) == 1 and "never shuffled" in d["warnings"][0]


def test_the_notes_go_to_stderr(tmp_path):
    plan, out = tmp_path / "plan.parquet", tmp_path / "train.jsonl"
    assert invoke_cli("compile", EXAMPLE, "-o", plan, "-q").exit_code == 0
    r = invoke_cli("export", plan, "--format", "jsonl", "-o", out, "--source", EXAMPLE)
    assert r.exit_code == 0 and "never shuffled" not in r.stdout and "never shuffled" in " ".join(r.stderr.split())
