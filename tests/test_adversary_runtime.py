"""Run-log promises under an adversary (issue 15): one writer, signals,
resume with other lengths, a full disk, history from uncommitted parts.

Every test here failed on the code before the fix.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aspc import interrupt
from aspc.cli import main
from aspc.errors import ConfigError, Interrupted, LockError, RunError
from aspc.runtime import RunConfig, run
from aspc.runtime.record.lock import LOCK_FILE, RunLogLock
from aspc.testing.plans import synthetic_plan
from tests.conftest import ROOT, lognormal_records, write_jsonl

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _meta(run_dir: Path) -> dict:
    return json.loads((run_dir / "meta.json").read_text())


def _exactly_once(run_dir: Path, planned: int) -> None:
    t = ds.dataset(str(run_dir / "samples")).to_table(columns=["prompt_id", "sample_index"])
    keys = set(zip(t.column("prompt_id").to_pylist(), t.column("sample_index").to_pylist(), strict=True))
    assert t.num_rows == len(keys) == planned, (t.num_rows, len(keys), planned)


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


class _SignalAt:
    """A progress sink that sends this process ``sig`` after ``after`` minibatches (a signal mid-run)."""

    def __init__(self, sig: int, after: int):
        self.sig, self.after, self.seen = sig, after, 0

    def stage(self, name, total=None):
        pass

    def advance(self, n=1):
        self.seen += n
        if self.seen >= self.after and self.sig:
            sig, self.sig = self.sig, 0
            os.kill(os.getpid(), sig)

    def done(self):
        pass


CFG = RunConfig(workers=4, global_batch=32, log_flush_seconds=0.0)


@pytest.fixture
def table():
    return synthetic_plan(800, 16, n_samples=2, seed=7)


def _interrupted_log(table, run_dir: Path, sig=signal.SIGINT, after=12, **kw) -> None:
    with pytest.raises(Interrupted) as info:
        with interrupt.handlers():
            run(table, config=CFG, log_dir=run_dir, progress=_SignalAt(sig, after), **kw)
    assert info.value.signum == sig


# --------------------------------------------------------------------------- (1) one writer


def test_second_writer_is_refused_naming_the_holder(tmp_path, table):
    run_dir = tmp_path / "R"
    with RunLogLock(run_dir):
        with pytest.raises(LockError) as info:
            run(table, config=CFG, log_dir=run_dir, resume=True)
        msg = str(info.value)
        assert f"pid {os.getpid()}" in msg and LOCK_FILE in msg and "--resume" in msg and "\n" not in msg
        assert not (run_dir / "meta.json").exists()
    # Released: the run goes ahead, and leaves no lock file behind.
    run(table, config=CFG, log_dir=run_dir)
    assert not (run_dir / LOCK_FILE).exists()
    assert _meta(run_dir)["status"] == "complete"


def test_lock_is_released_and_nothing_left_when_the_run_is_refused(tmp_path, table):
    run_dir = tmp_path / "R"
    run(table, config=CFG, log_dir=run_dir)
    with pytest.raises(ConfigError):
        run(table, config=RunConfig(workers=3, global_batch=32), log_dir=run_dir, resume=True)
    assert not (run_dir / LOCK_FILE).exists()
    fresh = tmp_path / "new"
    with pytest.raises(ConfigError):  # refused after the lock made the directory
        run(table, config=CFG, log_dir=fresh, resume=True, overwrite=True)
    assert not fresh.exists()


def test_overwrite_keeps_the_held_lock_file(tmp_path, table):
    run_dir = tmp_path / "R"
    run(table, config=CFG, log_dir=run_dir)
    run(table, config=CFG, log_dir=run_dir, overwrite=True)
    assert _meta(run_dir)["status"] == "complete"
    _exactly_once(run_dir, 1600)


# --------------------------------------------------------------------------- (9) signals


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_run_marks_interrupted_then_resume_completes(tmp_path, table, sig):
    run_dir = tmp_path / "R"
    _interrupted_log(table, run_dir, sig=sig)
    meta = _meta(run_dir)
    assert meta["status"] == "interrupted"
    assert signal.Signals(sig).name in meta["error"]
    assert not list(run_dir.rglob("*.tmp")) and not (run_dir / LOCK_FILE).exists()
    res = run(table, config=CFG, log_dir=run_dir, resume=True)
    assert any("resumed" in n for n in res.notes)
    assert _meta(run_dir)["status"] == "complete"
    _exactly_once(run_dir, 1600)


def test_a_signal_inside_a_commit_waits_for_it(tmp_path, table, monkeypatch):
    """The signal lands while a part is being written: that commit still completes."""
    from aspc.runtime.record import runlog_writer as W

    real = W.RunLogWriter.write_part
    calls = {"n": 0}

    def write_part(self, kind, columns):
        calls["n"] += 1
        if calls["n"] == 9:
            os.kill(os.getpid(), signal.SIGTERM)  # deferred: this flush goes on
        return real(self, kind, columns)

    monkeypatch.setattr(W.RunLogWriter, "write_part", write_part)
    run_dir = tmp_path / "R"
    with pytest.raises(Interrupted):
        with interrupt.handlers():
            run(table, config=CFG, log_dir=run_dir)
    meta = _meta(run_dir)
    assert meta["status"] == "interrupted"
    parts = meta["parts"]
    for kind in ("samples", "minibatches"):
        first, end = parts[kind]
        assert end - first >= 1
        assert all((run_dir / kind / f"part-{n:06d}.parquet").is_file() for n in range(first, end))
    monkeypatch.setattr(W.RunLogWriter, "write_part", real)
    run(table, config=CFG, log_dir=run_dir, resume=True)
    _exactly_once(run_dir, 1600)


# --------------------------------------------------------------------------- the contract, as processes


N_SLOW = 3000


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    """A plan whose run with --log-flush-seconds 0 lasts several seconds, and its lengths.

    Long enough that a second aspc process, started on a loaded 2-core machine, still finds
    the first one running (3,000 prompts x 4 samples).
    """
    d = tmp_path_factory.mktemp("contract")
    src = write_jsonl(d / "in.jsonl", lognormal_records(N_SLOW, seed=2, n_lengths=4))
    r = CliRunner().invoke(
        main, ["compile", str(src), "--length-field", "lengths", "-n", "4", "-o", str(d / "plan.parquet"), "-q"]
    )
    assert r.exit_code == 0, r.output
    return d, src, d / "plan.parquet"


def _aspc(*args, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "aspc.cli", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, **kw,
    )


def _wait_for(path: Path, proc, timeout=240.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_contract_second_writer_then_sigterm_then_resume(slow_run):
    d, src, plan = slow_run
    run_dir = d / "R"
    args = ["run", str(plan), "--actual-lengths", str(src), "--length-field", "lengths", "--log", str(run_dir)]
    first = _aspc(*args, "--log-flush-seconds", "0", "-q")
    _wait_for(run_dir / "meta.json", first)
    second = subprocess.run(
        [sys.executable, "-m", "aspc.cli", *args, "--resume"], capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert first.poll() is None, "the first run ended before the second started; lengthen it"
    assert second.returncode == 2
    line = _one_line(second.stderr)
    assert "locked" in line and LOCK_FILE in line and f"pid {first.pid}" in line
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=240)
    assert first.returncode == 128 + signal.SIGTERM
    line = _one_line(err)
    assert "--resume" in line and "interrupted" in line
    assert _meta(run_dir)["status"] == "interrupted"
    # The command the message prints continues the run.
    cmd = line.split("continue it with --resume: ", 1)[1]
    assert cmd.startswith("aspc run ") and cmd.endswith("--resume")
    done = subprocess.run(
        [sys.executable, "-m", "aspc.cli", *args, "--resume", "-q"], capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert _meta(run_dir)["status"] == "complete"
    _exactly_once(run_dir, 4 * N_SLOW)


# --------------------------------------------------------------------------- (8) resume with other lengths


def _lengths_file(path: Path, table, scale: int = 1, field: str = "lengths") -> Path:
    ids = table.column("prompt_id").to_pylist()
    rng = np.random.default_rng(1)
    recs = [{"id": pid, field: [int(x) * scale for x in rng.integers(5, 400, size=2)]} for pid in ids]
    return write_jsonl(path, recs)


def _run_cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_resume_refuses_same_named_lengths_with_other_contents(tmp_path, table):
    lengths = _lengths_file(tmp_path / "len.jsonl", table)
    from aspc.io.history import read_history, source_hash

    def go(field="lengths", **kw):
        return run(
            table, config=CFG, log_dir=tmp_path / "R", actual_lengths=read_history(lengths, length_field=field),
            lengths_name=lengths.name,
            lengths_source={"sha256": source_hash(lengths), "length_field": field, "id_field": "id"}, **kw,
        )

    with pytest.raises(Interrupted):
        with interrupt.handlers():
            go(progress=_SignalAt(signal.SIGTERM, 10))
    original = lengths.read_bytes()
    _lengths_file(lengths, table, scale=3)  # same name, other contents
    with pytest.raises(ConfigError, match="contents of --actual-lengths len.jsonl"):
        go(resume=True)
    # Another length field of the same (restored) file.
    recs = [dict(json.loads(ln), other=[7, 8]) for ln in original.decode().splitlines()]
    write_jsonl(lengths, recs)
    with pytest.raises(ConfigError, match="--length-field"):
        go(field="other", resume=True)
    lengths.write_bytes(original)
    go(resume=True)
    _exactly_once(tmp_path / "R", 1600)


def test_resume_refuses_other_length_values_without_a_file_hash(tmp_path, table):
    ids = table.column("prompt_id").to_pylist()
    a = {pid: np.array([10.0, 20.0]) for pid in ids}
    b = {pid: np.array([10.0, 21.0]) for pid in ids}
    with pytest.raises(Interrupted):
        with interrupt.handlers():
            run(table, config=CFG, log_dir=tmp_path / "R", actual_lengths=a, lengths_name="x",
                progress=_SignalAt(signal.SIGINT, 10))
    with pytest.raises(ConfigError, match="actual lengths' values"):
        run(table, config=CFG, log_dir=tmp_path / "R", actual_lengths=b, lengths_name="x", resume=True)


def test_cli_resume_with_changed_lengths_file_is_one_line(slow_run, tmp_path):
    d, src, plan = slow_run
    lengths = tmp_path / "in.jsonl"
    lengths.write_bytes(src.read_bytes())
    run_dir = tmp_path / "R"
    args = ["run", str(plan), "--actual-lengths", str(lengths), "--length-field", "lengths", "--log", str(run_dir)]
    assert _run_cli(*args, "-q").exit_code == 0
    text = lengths.read_text().replace('"lengths": [', '"lengths": [1', 5)
    lengths.write_text(text)
    r = subprocess.run([sys.executable, "-m", "aspc.cli", *args, "--resume"], capture_output=True, text=True,
                       timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2
    assert "sha256" in _one_line(r.stderr)


# --------------------------------------------------------------------------- disk full


def test_disk_full_during_a_run_leaves_a_resumable_failed_log(tmp_path, table, monkeypatch):
    from aspc.runtime.record import runlog_writer as W

    real = W.pq.write_table
    calls = {"n": 0}

    def write_table(*a, **k):
        calls["n"] += 1
        if calls["n"] > 14:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(W.pq, "write_table", write_table)
    run_dir = tmp_path / "R"
    with pytest.raises(RunError) as info:
        run(table, config=CFG, log_dir=run_dir)
    msg = str(info.value)
    assert "no space left" in msg and "--resume" in msg and "\n" not in msg
    meta = _meta(run_dir)
    assert meta["status"] == "failed"
    monkeypatch.setattr(W.pq, "write_table", real)
    run(table, config=CFG, log_dir=run_dir, resume=True)
    assert _meta(run_dir)["status"] == "complete"
    _exactly_once(run_dir, 1600)


def test_disk_full_run_on_a_real_small_fs(tmp_path, slow_run):
    if not IS_ROOT:
        pytest.skip("mounting a small tmpfs needs root; the injected test covers the logic")
    d, src, plan = slow_run
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount tmpfs here")
    try:
        run_dir = mnt / "R"
        args = ["run", str(plan), "--actual-lengths", str(src), "--length-field", "lengths", "--log", str(run_dir)]
        r = subprocess.run([sys.executable, "-m", "aspc.cli", *args, "--log-flush-seconds", "0", "-q"],
                           capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 2
        line = _one_line(r.stderr)
        assert "no space left" in line and "--resume" in line
        assert _meta(run_dir)["status"] == "failed"
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        r = subprocess.run([sys.executable, "-m", "aspc.cli", *args, "--resume", "-q"],
                           capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 0, r.stderr
        _exactly_once(run_dir, 4 * N_SLOW)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


# --------------------------------------------------------------------------- (10) committed parts only


def _history(run_dir: Path) -> dict:
    from aspc.io.history import read_history

    return read_history(run_dir)


def test_history_ignores_parts_no_commit_covers(tmp_path, table):
    run_dir = tmp_path / "R"
    run(table, config=CFG, log_dir=run_dir)
    before = _history(run_dir)
    from aspc.io.history import source_hash

    h_before = source_hash(run_dir)
    meta = _meta(run_dir)
    first, end = meta["parts"]["samples"]
    live = pq.read_table(run_dir / "samples" / f"part-{first:06d}.parquet")
    rogue = live.set_column(
        live.schema.get_field_index("response_len"), "response_len",
        pa.array(np.full(live.num_rows, 99999, dtype=np.int64)),
    )
    pq.write_table(rogue, run_dir / "samples" / f"part-{end:06d}.parquet")  # never committed
    after = _history(run_dir)
    assert after.keys() == before.keys()
    assert all(np.array_equal(after[k], before[k]) for k in before)
    assert source_hash(run_dir) == h_before


def test_history_of_a_run_killed_before_its_first_commit_is_empty(tmp_path, table):
    run_dir = tmp_path / "R"
    run(table, config=CFG, log_dir=run_dir)
    meta = _meta(run_dir)
    meta["parts"] = {k: [0, 0] for k in meta["parts"]}
    meta["status"] = "running"
    (run_dir / "meta.json").write_text(json.dumps(meta))
    assert _history(run_dir) == {}
