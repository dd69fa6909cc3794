"""Damaged run logs: the commands other than ``calibrate`` that read one refuse a damaged value in one line.

Covers ``aspc run --resume`` (restored minibatch ids, times, weights versions, consumed steps, a part missing
a required column, meta.json sections that are not objects, worker ids of a complete log), run logs read as
lengths (``aspc run --actual-lengths RUN``, ``aspc compile --history RUN``: lengths out of range), and
``aspc report`` of a complete log (non-finite times, policy lags that do not fit the log's steps).

Each test damages a copy of a real run log the way a crashed job, a hand edit or another aspc
version could (one value in one committed Parquet part) and runs the command on it as a process,
under an address-space limit so a value that sizes an array shows up as "out of memory" instead of
taking the machine. The project standard: one ``Error:`` line saying what is wrong, a non-zero exit,
no traceback, no partial output, the input never changed, memory and time in proportion to the data.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import EXAMPLE, ROOT, invoke_cli

BIG = 2**31 - 1  # the largest int32: an id or step the schema admits
AS_LIMIT = 4 << 30  # 4 GiB: room for aspc, not for the 16 GiB arrays a BIG id sizes


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, Path]:
    """A 64-prompt plan and its complete run log (sim backend, 4 trainer steps)."""
    d = tmp_path_factory.mktemp("runlog_hunt")
    data = d / "p64.jsonl"
    data.write_text("".join(EXAMPLE.read_text(encoding="utf-8").splitlines(keepends=True)[:64]), encoding="utf-8")
    plan = d / "plan.parquet"
    r = invoke_cli("compile", data, "--length-field", "lengths", "-o", plan, "--quiet")
    assert r.exit_code == 0, r.output
    run = d / "RUN"
    r = invoke_cli("run", plan, "--log", run, "--global-batch", "16", "--quiet")
    assert r.exit_code == 0, r.output
    return {"data": data, "plan": plan, "run": run}


def _copy(logs: dict[str, Path], tmp_path: Path, *, interrupted: bool = False) -> Path:
    """A copy of the complete log; ``interrupted``: its meta.json says the run was stopped by a signal
    (every part as a SIGTERM after the last commit leaves them), so ``--resume`` restores its rows."""
    log = tmp_path / "LOG"
    shutil.copytree(logs["run"], log)
    if interrupted:
        meta = json.loads((log / "meta.json").read_text())
        meta["status"] = "interrupted"
        (log / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return log


def _set(log: Path, kind: str, column: str, value: object) -> None:
    """Set ``column`` of the first row of ``kind``'s first committed part to ``value`` (same schema)."""
    meta = json.loads((log / "meta.json").read_text())
    first, _end = meta["parts"][kind]
    path = log / kind / f"part-{first:06d}.parquet"
    t = pq.read_table(path)
    i = t.schema.get_field_index(column)
    values = t.column(column).to_pylist()
    values[0] = value
    t = t.set_column(i, t.schema.field(i), pa.array(values, type=t.schema.field(i).type))
    pq.write_table(t, path)


def _digest(d: Path) -> str:
    """Every file's bytes, meta.json by its contents (a refused resume may write it back reformatted)."""
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "meta.json":
                data = json.dumps(json.loads(data), sort_keys=True).encode()
            h.update(str(p.relative_to(d)).encode() + b"\0" + data)
    return h.hexdigest()


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def _aspc(*args: object, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "aspc.cli", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=_limit)  # fmt: skip


def _in_process(*args: object) -> subprocess.CompletedProcess:
    """``aspc ARGS`` in this process (no interpreter start: most of these checks need no memory limit),
    as a CompletedProcess whose stderr holds the output, and the traceback of an exception that escaped."""
    import traceback

    from click.testing import CliRunner

    from aspc.cli import main

    r = CliRunner().invoke(main, [str(a) for a in args])
    out, code = r.output, r.exit_code
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        out += "".join(traceback.format_exception(r.exception))
        code = 1
    return subprocess.CompletedProcess(args, code, "", out)


def _resume(logs: dict[str, Path], log: Path, tmp_path: Path, *, limited: bool = False) -> subprocess.CompletedProcess:
    args = ("run", logs["plan"], "--log", log, "--global-batch", "16", "--resume", "--quiet")
    return _aspc(*args, cwd=tmp_path) if limited else _in_process(*args)


def _assert_refused(p: subprocess.CompletedProcess) -> str:
    """One ``Error:`` line (not an out-of-memory one), a non-zero exit, no traceback."""
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode not in (0, 1), (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("Error: "), p.stderr[-2000:]
    assert "out of memory" not in lines[0], lines[0]
    return lines[0]


# ---- aspc run PLAN --log RUN --resume ------------------------------------------------------------------


# Was: an IndexError traceback, and the refused resume marked the log failed.
def test_resume_refuses_a_minibatch_id_beyond_the_plan(logs, tmp_path):
    log = _copy(logs, tmp_path, interrupted=True)
    _set(log, "minibatches", "minibatch", BIG)
    before = _digest(log)
    p = _resume(logs, log, tmp_path)
    _assert_refused(p)
    assert _digest(log) == before


# Was: np.bincount sized by the consumed_step: out of memory, the log marked failed.
def test_resume_refuses_a_consumed_step_beyond_the_steps_without_sizing_by_it(logs, tmp_path):
    log = _copy(logs, tmp_path, interrupted=True)
    _set(log, "samples", "consumed_step", BIG)
    before = _digest(log)
    p = _resume(logs, log, tmp_path, limited=True)
    _assert_refused(p)
    assert _digest(log) == before


# Was: inf started the resumed clock at inf; NaN silently dropped the minibatch from the summary.
@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_resume_refuses_a_non_finite_minibatch_time(logs, tmp_path, value):
    log = _copy(logs, tmp_path, interrupted=True)
    _set(log, "minibatches", "end", value)
    before = _digest(log)
    p = _resume(logs, log, tmp_path)
    _assert_refused(p)
    assert _digest(log) == before


# Was: restored unchecked: exit 0 and a 'complete' log with policy_lag_mean about -1e8.
def test_resume_refuses_a_weights_version_no_step_published(logs, tmp_path):
    log = _copy(logs, tmp_path, interrupted=True)
    _set(log, "minibatches", "weights_version", BIG)
    before = _digest(log)
    p = _resume(logs, log, tmp_path)
    _assert_refused(p)
    assert _digest(log) == before


# Was: summarize_log's np.bincount by worker id: ValueError traceback, or out of memory.
@pytest.mark.parametrize("worker", [-1, BIG], ids=["negative", "int32-max"])
def test_resume_of_a_complete_log_refuses_a_worker_id_out_of_range(logs, tmp_path, worker):
    log = _copy(logs, tmp_path)
    _set(log, "minibatches", "worker", worker)
    p = _resume(logs, log, tmp_path, limited=worker == BIG)
    _assert_refused(p)


# Was: the missing column read as nulls, cast to -9.2e18; ArrowInvalid traceback, the log marked failed.
def test_resume_refuses_a_samples_part_missing_a_column(logs, tmp_path):
    log = _copy(logs, tmp_path, interrupted=True)
    meta = json.loads((log / "meta.json").read_text())
    path = log / "samples" / f"part-{meta['parts']['samples'][0]:06d}.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["response_len"]), path)
    before = _digest(log)
    p = _resume(logs, log, tmp_path)
    _assert_refused(p)
    assert _digest(log) == before


# Was: check_resumable's .get on a list: AttributeError traceback.
@pytest.mark.parametrize("section", ["run", "config"])
def test_resume_refuses_a_meta_section_that_is_not_an_object(logs, tmp_path, section):
    log = _copy(logs, tmp_path, interrupted=True)
    meta = json.loads((log / "meta.json").read_text())
    meta[section] = [1]
    (log / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    before = _digest(log)
    p = _resume(logs, log, tmp_path)
    _assert_refused(p)
    assert _digest(log) == before


# ---- run logs as lengths: --actual-lengths RUN, compile --history RUN -----------------------------------


# Was: exit 0, the sim replayed a 2**62-token response.
def test_actual_lengths_from_a_run_log_refuse_a_length_above_the_cap(logs, tmp_path):
    log = _copy(logs, tmp_path)
    _set(log, "samples", "response_len", 2**62)
    before = _digest(log)
    p = _in_process("run", logs["plan"], "--actual-lengths", log, "--global-batch", "16", "--quiet")
    assert _digest(log) == before
    _assert_refused(p)


# Was: exit 0, the negative length blended into the plan.
def test_history_from_a_run_log_refuses_a_negative_length(logs, tmp_path):
    log = _copy(logs, tmp_path)
    _set(log, "samples", "response_len", -5)
    out = tmp_path / "h.parquet"
    p = _in_process("compile", logs["data"], "--history", log, "-o", out, "--quiet")
    assert not out.exists()
    _assert_refused(p)


# ---- aspc report PLAN RUN -o DIR --------------------------------------------------------------------------


# Was: fig_policy_lag sized its bins by the lag: out of memory.
def test_report_refuses_a_policy_lag_beyond_the_steps_without_sizing_by_it(logs, tmp_path):
    log = _copy(logs, tmp_path)
    _set(log, "samples", "policy_lag", BIG)
    out = tmp_path / "rep"
    p = _aspc("report", logs["plan"], log, "-o", out, "--quiet", cwd=tmp_path)
    assert not out.exists()
    _assert_refused(p)


# Was: exit 0, a report drawn from an inf step end.
def test_report_refuses_a_complete_log_with_a_non_finite_time(logs, tmp_path):
    log = _copy(logs, tmp_path)
    _set(log, "steps", "end", float("inf"))
    out = tmp_path / "rep"
    p = _aspc("report", logs["plan"], log, "-o", out, "--quiet", cwd=tmp_path)
    assert not out.exists()
    _assert_refused(p)
