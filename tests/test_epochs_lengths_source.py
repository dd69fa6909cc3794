"""Multi-pass runs (``--epochs``, ``--length-drift``, ``--scout``) keep the identity of ``--actual-lengths``.

A single ``aspc run`` records the lengths file's sha256, ``--length-field`` and
``--id-field``, so its ``--resume`` says what changed and takes a copy of the
same file under another name. The epochs and the scout did not: their resume
said only "the actual lengths' values", refused a copy by its name, and took a
log whose epochs replayed another ``--length-drift`` (its later epochs ran
with the new one). Each case here failed on the code before the fix.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import invoke_cli as _run
from tests.conftest import lognormal_records, one_line_error, write_jsonl

N = 4  # samples per prompt


def _error(result) -> str:
    return one_line_error(result, code=2)


def _snapshot(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def data(tmp_path):
    """48 prompts with two length fields (``other`` = ``lengths`` + 7), enough lengths for a scout and 2 epochs."""
    records = lognormal_records(48, n_lengths=2 * N + 1)
    for r in records:
        r["other"] = [x + 7 for x in r["lengths"]]
    return write_jsonl(tmp_path / "x.jsonl", records)


@pytest.fixture
def plan(tmp_path, data):
    out = tmp_path / "p.parquet"
    r = _run("compile", data, "--length-field", "lengths", "-n", N, "-o", out, "-q")
    assert r.exit_code == 0, r.output
    return out


def _args(plan, lengths, log, *extra, field="lengths"):
    return ("run", plan, "--actual-lengths", lengths, "--length-field", field, "--global-batch", 16,
            "--log", log, "-q", *extra)  # fmt: skip


@pytest.mark.parametrize("kind", [("--epochs", "2"), ("--epochs", "2", "--length-drift", "0.1"), ("--scout",)])
def test_resume_names_another_length_field(tmp_path, data, plan, kind):
    # Before: "the actual lengths' values" (the field's name nowhere).
    log = tmp_path / "R"
    assert _run(*_args(plan, data, log, *kind)).exit_code == 0
    first = "scout" if "--scout" in kind else "epoch-1"
    before = _snapshot(log)
    msg = _error(_run(*_args(plan, data, log, *kind, "--resume", field="other")))
    assert f"--resume {log / first}: this run differs from the logged one in --length-field ('lengths' in the log, " \
           "'other' now)" in msg  # fmt: skip
    assert _snapshot(log) == before
    assert json.loads((log / first / "meta.json").read_text())["run"]["lengths_file"]["length_field"] == "lengths"


@pytest.mark.parametrize("kind", [("--epochs", "2"), ("--scout",)])
def test_resume_names_other_contents_and_takes_a_copy(tmp_path, data, plan, kind):
    log = tmp_path / "R"
    assert _run(*_args(plan, data, log, *kind)).exit_code == 0
    # A copy of the same file under another name is the same input. Before: refused by its name.
    copy = shutil.copy(data, tmp_path / "copy.jsonl")
    r = _run(*_args(plan, copy, log, *kind, "--resume"))
    assert r.exit_code == 0, r.output
    # The same name, other lengths. Before: "the actual lengths' values".
    records = [json.loads(line) for line in data.read_text().splitlines()]
    records[0]["lengths"] = [v + 1 for v in records[0]["lengths"]]
    write_jsonl(data, records)
    msg = _error(_run(*_args(plan, data, log, *kind, "--resume")))
    assert "this run differs from the logged one in the contents of --actual-lengths x.jsonl (sha256 " in msg
    assert "actual lengths' values" not in msg


def test_resume_with_another_length_drift_is_refused_by_name(tmp_path, data, plan):
    log = tmp_path / "R"
    assert _run(*_args(plan, data, log, "--epochs", "2", "--length-drift", "0.1")).exit_code == 0
    want = (f"Error: --resume {log}: its epochs replay lengths with --length-drift 0.1, this run with 0.25; "
            "resume with --length-drift 0.1, or start a new run with --overwrite")  # fmt: skip
    before = _snapshot(log)
    # Both epochs complete. Before: "the actual lengths' values" (epoch 2's).
    assert _error(_run(*_args(plan, data, log, "--epochs", "2", "--length-drift", "0.25", "--resume"))) == want
    assert _snapshot(log) == before
    assert json.loads((log / "epoch-2" / "meta.json").read_text())["run"]["lengths_file"]["length_drift"] == 0.1
    # Only epoch 1 there (stopped before epoch 2 began), whose lengths no drift scales. Before: resumed,
    # and epoch 2 replayed the new drift.
    shutil.rmtree(log / "epoch-2")
    (log / "plans" / "epoch-2.parquet").unlink()
    before = _snapshot(log)
    assert _error(_run(*_args(plan, data, log, "--epochs", "2", "--length-drift", "0.25", "--resume"))) == want
    assert _error(_run(*_args(plan, data, log, "--epochs", "2", "--resume"))) == want.replace("0.25", "0.0")
    assert _snapshot(log) == before
    # A log from before the record (no length_drift in it) is not compared.
    meta_path = log / "epoch-1" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["run"]["lengths_file"]["length_drift"]
    meta_path.write_text(json.dumps(meta))
    r = _run(*_args(plan, data, log, "--epochs", "2", "--length-drift", "0.25", "--resume"))
    assert r.exit_code == 0, r.output
    # The same drift resumes.
    assert _run(*_args(plan, data, log, "--epochs", "2", "--length-drift", "0.25", "--resume")).exit_code == 0


def test_resume_with_another_plan_names_it(tmp_path, data, plan):
    # Before: "not the plan epoch 1 compiles from the run logs before it" (epoch 1 runs PLAN; none named).
    log = tmp_path / "R"
    assert _run(*_args(plan, data, log, "--epochs", "2")).exit_code == 0
    other = tmp_path / "q.parquet"
    assert _run("compile", data, "--length-field", "lengths", "-n", N, "--seed", 9, "-o", other, "-q").exit_code == 0
    msg = _error(_run(*_args(other, data, log, "--epochs", "2", "--resume")))
    assert msg == (f"Error: {log / 'plans' / 'epoch-1.parquet'}: epoch 1 ran another plan than PLAN {other} (or "
                   "epoch-1.parquet was edited); resume with the PLAN and options the run started with, or pass "
                   "--overwrite to start the epochs again")  # fmt: skip
    # A plan the run compiled (epoch 2's, here replaced) names PLAN too.
    shutil.copy(other, log / "plans" / "epoch-2.parquet")
    msg = _error(_run(*_args(plan, data, log, "--epochs", "2", "--resume")))
    assert f"epoch-2.parquet: not the plan epoch 2 compiles from PLAN {plan} and the run logs before it" in msg


def test_resume_names_an_epoch_log_without_meta(tmp_path, data, plan):
    # Before: "--log R/epoch-2: not an aspc run log, nothing to resume; pick the run's directory" (R was given).
    log = tmp_path / "R"
    assert _run(*_args(plan, data, log, "--epochs", "2")).exit_code == 0
    (log / "epoch-2" / "meta.json").unlink()
    before = _snapshot(log)
    msg = _error(_run(*_args(plan, data, log, "--epochs", "2", "--resume")))
    assert msg == (f"Error: --log {log}: {log / 'epoch-2'} holds files but no meta.json, so its log cannot be "
                   f"resumed; delete {log / 'epoch-2'} to run epoch 2 again, or pass --overwrite to start the "
                   "epochs again")  # fmt: skip
    assert _snapshot(log) == before
    shutil.rmtree(log / "epoch-2")  # as the message says
    assert _run(*_args(plan, data, log, "--epochs", "2", "--resume")).exit_code == 0


def test_resume_of_epochs_an_older_aspc_compiled_for_one_sample_says_so(tmp_path, data, plan):
    # Before: "not the plan epoch 2 compiles from PLAN ... (edited, or another PLAN or other options)", with the
    # same PLAN and options: aspc before 2026-12-06 compiled epochs 2.. for one sample per prompt.
    from aspc.emit.plan import read_plan, write_plan

    log = tmp_path / "R"
    assert _run(*_args(plan, data, log, "--epochs", "2")).exit_code == 0
    stored = read_plan(log / "plans" / "epoch-2.parquet")
    stored.config["samples_per_prompt"] = 1
    write_plan(stored, log / "plans" / "epoch-2.parquet")
    msg = _error(_run(*_args(plan, data, log, "--epochs", "2", "--resume")))
    assert msg == (f"Error: {log / 'plans' / 'epoch-2.parquet'}: compiled for 1 sample per prompt, as aspc did for "
                   f"epochs after the first before 2026-12-06 (this one compiles them for the run's {N}); finish the "
                   "run with the aspc that started it, or pass --overwrite to start the epochs again")  # fmt: skip
