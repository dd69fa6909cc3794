"""export: a JSONL export's schedule is aspc's own in a verl export; edited plan inputs; plan names not UTF-8."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aspc.emit import read_plan
from aspc.emit import schema as S
from aspc.errors import InputError
from aspc.export import export_plan
from tests.conftest import invoke_cli, lognormal_records, one_line_error, write_jsonl

COMPILE = ["--length-field", "lengths", "--batch-size", "8", "--slack", "2", "--group-size", "4"]


@pytest.fixture
def compiled(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", lognormal_records(40, seed=7))
    r = invoke_cli("compile", src, *COMPILE, "-o", tmp_path / "plan.parquet", "-q")
    assert r.exit_code == 0, r.output
    return tmp_path / "plan.parquet"


def test_a_jsonl_exports_schedule_is_replaced_in_a_verl_export(compiled, tmp_path):
    # Before: the JSONL round trip the docs describe failed at the verl export ("rename that key"): Arrow reads the
    # schedule's int32 fields from JSON as int64, and only the exact type counted as aspc's own.
    first = tmp_path / "epoch1.jsonl"
    assert invoke_cli("export", compiled, "--format", "jsonl", "-o", first, "-q").exit_code == 0
    r = invoke_cli("compile", first, *COMPILE, "--strategy", "random", "-o", tmp_path / "p2.parquet", "-q")
    assert r.exit_code == 0, r.output
    out = tmp_path / "train2.parquet"
    r = invoke_cli("export", tmp_path / "p2.parquet", "-o", out, "-q")
    assert r.exit_code == 0, r.output
    rows = pq.read_table(out).column("extra_info").to_pylist()
    ids = read_plan(tmp_path / "p2.parquet").column(S.PROMPT_ID).tolist()
    assert [row["aspc"]["prompt_id"] for row in rows] == ids
    assert [row["aspc"]["dispatch_rank"] for row in rows] == list(range(40))


@pytest.mark.parametrize("aspc", [
    {"prompt_id": 1, "minibatch": 0, "group": 0, "dispatch_rank": 0, "n_samples": 1, "predicted_len": 2.0},
    {"prompt_id": "a", "minibatch": 0, "group": 0, "dispatch_rank": 0, "n_samples": 1, "predicted_len": 2.0, "x": 1},
    {"prompt_id": "a", "minibatch": "0", "group": 0, "dispatch_rank": 0, "n_samples": 1, "predicted_len": 2.0},
])  # fmt: skip
def test_a_foreign_aspc_key_is_still_refused(tmp_path, aspc):
    recs = lognormal_records(24, seed=8)
    for rec in recs:
        rec["extra_info"] = {"aspc": aspc}
    src = write_jsonl(tmp_path / "clash.jsonl", recs)
    assert invoke_cli("compile", src, *COMPILE, "-o", tmp_path / "plan.parquet", "-q").exit_code == 0
    with pytest.raises(InputError, match="not an aspc export's schedule"):
        export_plan(tmp_path / "plan.parquet", tmp_path / "t.parquet")
    assert not (tmp_path / "t.parquet").exists()


def _edit_inputs(plan_path, out, **changes):
    t = pq.read_table(plan_path)
    meta = dict(t.schema.metadata)
    config = json.loads(meta[S.META_CONFIG])
    config["inputs"].update(changes)
    meta[S.META_CONFIG] = json.dumps(config).encode()
    pq.write_table(t.replace_schema_metadata(meta), out)
    return out


@pytest.mark.parametrize("key, value, says", [
    ("prompt_field", None, "inputs prompt_field must be a string"),
    ("id_field", None, "inputs id_field must be a string"),
    ("on_bad_line", "bogus", "inputs on_bad_line must be 'error' or 'skip'"),
    ("on_bad_line", None, "inputs on_bad_line must be 'error' or 'skip'"),
])  # fmt: skip
@pytest.mark.parametrize("extra", [[], ["--no-source"], ["--format", "jsonl"]])
def test_edited_plan_inputs_are_refused(compiled, tmp_path, key, value, says, extra):
    # Before: a null field name was a traceback (pa.field(None)) and on_bad_line 'bogus' was blamed on an
    # --on-bad-line option export does not have.
    edited = _edit_inputs(compiled, tmp_path / "edited.parquet", **{key: value})
    out = tmp_path / ("x.jsonl" if "jsonl" in extra else "x.parquet")
    line = one_line_error(invoke_cli("export", edited, *extra, "-o", out), 2)
    assert f"edited.parquet: plan metadata aspc.config {says} (edited by hand?); recompile the plan" in line, line
    assert "--on-bad-line" not in line
    assert not out.exists()


@pytest.mark.parametrize("fmt", ["verl", "jsonl"])
def test_a_plan_whose_prompt_field_was_edited_is_not_exported(tmp_path, fmt):
    # Before: rc 0, and every row's prompt was the 'dataset' column: the training prompts silently replaced.
    recs = lognormal_records(30, seed=9)
    for rec in recs:
        rec["dataset"] = "Alpaca"
    src = write_jsonl(tmp_path / "in.jsonl", recs)
    assert invoke_cli("compile", src, *COMPILE, "-o", tmp_path / "plan.parquet", "-q").exit_code == 0
    edited = _edit_inputs(tmp_path / "plan.parquet", tmp_path / "edited.parquet", prompt_field="dataset")
    plan = read_plan(edited)
    first_id, first_row = plan.column(S.PROMPT_ID)[0], int(plan.column(S.SOURCE_ROW)[0])
    out = tmp_path / ("x.parquet" if fmt == "verl" else "x.jsonl")
    line = one_line_error(invoke_cli("export", edited, "--format", fmt, "-o", out), 2)
    assert f"row {first_row + 1} holds another prompt than plan prompt {first_id!r}" in line, line
    assert "not the dataset the plan was compiled from, or the plan's metadata" in line
    assert not out.exists()
    # The unedited plan exports as before.
    assert invoke_cli("export", tmp_path / "plan.parquet", "--format", fmt, "-o", out, "-q").exit_code == 0


@pytest.mark.skipif(sys.platform != "linux", reason="a file name that is not UTF-8 needs a byte-named filesystem")
def test_a_plan_file_named_in_bytes_that_are_not_utf8_is_read(compiled, tmp_path):
    # Before: "not a readable Parquet file ('utf-8' codec can't encode ...)": pyarrow encodes a str path strictly.
    odd = os.fsdecode(os.fsencode(str(tmp_path)) + b"/in\xff.parquet")
    with open(compiled, "rb") as a, open(odd, "wb") as b:
        b.write(a.read())
    plan = read_plan(odd)
    assert plan.column(S.PROMPT_ID).tolist() == read_plan(compiled).column(S.PROMPT_ID).tolist()
    for args in (["inspect", odd], ["check", odd]):
        r = subprocess.run([sys.executable, "-m", "aspc.cli", *args], capture_output=True)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/t\xff.parquet")
    assert invoke_cli("export", odd, "-o", out, "-q").exit_code == 0
    assert pa.types.is_struct(pq.read_table(pa.OSFile(os.fsencode(out))).schema.field("extra_info").type)
