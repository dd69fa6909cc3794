"""Hunt 28: run logs, plans and predictor directories moved or copied between the write and the read
(a run started on one node, its log copied to shared storage, resumed or read from there on another).

Each test is one confirmed defect: it failed on the code it was written against (as a strict xfail) and
passes with the fix.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE, invoke_cli, one_line_error


def _prompts(tmp_path: Path, n: int = 60) -> Path:
    """The first ``n`` prompts of the example file (each with a ``lengths`` list)."""
    data = tmp_path / "in.jsonl"
    with open(EXAMPLE, encoding="utf-8") as fh:
        data.write_text("".join(fh.readline() for _ in range(n)), encoding="utf-8")
    return data


def _plan(tmp_path: Path, data: Path) -> Path:
    plan = tmp_path / "plan.parquet"
    r = invoke_cli("compile", data, "-n", "4", "-b", "8", "-o", plan, "-q")
    assert r.exit_code == 0, r.output
    return plan


def _run_args(plan: Path, data: Path, log: Path, *extra: object) -> list[object]:
    return ["run", plan, "--backend", "sim", "--actual-lengths", data, "--length-field", "lengths",
            "--workers", "4", "--global-batch", "32", "--log", log, "-q", *extra]  # fmt: skip


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_overwrite_interrupted_before_it_began_on_a_copied_log_names_the_earlier_run(tmp_path, monkeypatch):
    """README, Reliability (Signals): "`aspc run --log RUN` marks the log `interrupted` and prints the exact
    `aspc run ... --resume` command that continues it"; the interrupt message of a complete log says "before
    the run began; run log RUN still holds the earlier, complete run: rerun with --overwrite to replace it".
    Standard: a relocated log with the same bytes is treated as in place; no decision rests on an mtime
    (copies, ``cp -a``/``tar`` from another node, a network file system stamp mtimes with another clock).

    A complete ``aspc run ... --log RUN`` whose ``meta.json`` carries an mtime one hour ahead of this host's
    clock (written on a node whose clock runs ahead, then copied with ``cp -a``/``tar``/``rsync -a``), then
    ``aspc run ... --log RUN --overwrite`` stopped by SIGTERM before the new run began (while it read its
    ``--actual-lengths``): the line reads "interrupted by SIGTERM after the run completed; run log RUN is
    complete" (exit 143), so the user takes the earlier run's log for the new one. With the mtime in the past
    the same moment reads "before the run began; ... still holds the earlier, complete run: rerun with
    --overwrite". (The other way round, a file server whose clock is behind makes a run that did complete,
    cut short in its close-down, read as "the earlier run": rerun with --overwrite.)
    """
    data = _prompts(tmp_path)
    plan = _plan(tmp_path, data)
    log = tmp_path / "RUN"
    r = invoke_cli(*_run_args(plan, data, log))
    assert r.exit_code == 0, r.output
    ahead = time.time() + 3600  # copied, mtimes kept, from a node whose clock is an hour ahead
    os.utime(log / "meta.json", (ahead, ahead))
    before = _snapshot(log)

    import aspc.io.history as history
    from aspc.errors import Interrupted

    def stopped(*args, **kwargs):  # SIGTERM while the --actual-lengths file is read: the run has not begun
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(history, "read_history", stopped)
    msg = one_line_error(invoke_cli(*_run_args(plan, data, log, "--overwrite")), 128 + signal.SIGTERM)
    assert _snapshot(log) == before  # the earlier run's log, untouched
    assert "before the run began" in msg and "earlier" in msg, msg


def test_epochs_resume_from_the_plan_copy_the_copied_log_keeps(tmp_path):
    """README, Run logs: `--epochs N` makes N passes (`RUN/plans/epoch-K.parquet`, logs `RUN/epoch-K/`), and
    `--epochs N --resume` continues it; README, Reliability: "**Resume** refuses another plan" (the same plan
    is accepted). Standard: a relocated artifact with the same bytes works as in place; what aspc cannot honour
    is one line saying what is wrong and how to fix it.

    Only the log ``EP`` of ``aspc run plan.parquet --epochs 2 --log EP`` was copied to another node, so the
    plan is taken from the log: ``aspc run EP/epoch-1/plan.parquet --epochs 2 --resume --log EP`` works (exit
    0), but the very same bytes as ``EP/plans/epoch-1.parquet`` are refused: "--log EP contains the input
    epoch-1.parquet; replacing the directory would delete it: choose another output directory". A resume
    replaces no directory, and another output directory would start the run over.
    """
    data = _prompts(tmp_path)
    plan = _plan(tmp_path, data)
    first = tmp_path / "node1" / "EP"
    r = invoke_cli(*_run_args(plan, data, first, "--epochs", "2"))
    assert r.exit_code == 0, r.output
    log = tmp_path / "node2" / "EP"
    shutil.copytree(first, log)  # the log alone reaches the other node
    copy = log / "plans" / "epoch-1.parquet"
    assert copy.read_bytes() == plan.read_bytes() == (log / "epoch-1" / "plan.parquet").read_bytes()
    given = copy.stat()
    r = invoke_cli(*_run_args(log / "epoch-1" / "plan.parquet", data, log, "--epochs", "2", "--resume"))
    assert r.exit_code == 0, r.output  # the same bytes under the epoch's log are taken
    r = invoke_cli(*_run_args(copy, data, log, "--epochs", "2", "--resume"))
    if r.exit_code != 0:  # a refusal must say something true, with a fix that keeps the run
        msg = one_line_error(r)
        assert "replacing the directory" not in msg and "another output directory" not in msg, msg
    assert (copy.stat().st_ino, copy.stat().st_mtime_ns) == (given.st_ino, given.st_mtime_ns)  # the input, as it was


def test_a_hard_linked_snapshot_of_a_log_says_its_lock_is_shared_and_how_to_unshare_it(tmp_path):
    """README, Reliability: "**One writer per run log**: `aspc run --log RUN` holds an exclusive `flock` on
    `RUN/.lock` ... A second writer exits 2 with one line naming the holder's pid and how to proceed".
    Standard: a copy of a log is another log; a copy with the same bytes works as the original in place.

    While a writer holds ``RUN``'s lock, ``cp -al RUN SNAP`` (a hard-link snapshot, as ``rsync --link-dest``
    backups make) links ``SNAP/.lock`` to the same inode. ``aspc run ... --log SNAP --resume``, which no
    process writes, is refused: "--log SNAP is locked by another aspc run (pid N, lock file SNAP/.lock); wait
    for it to finish, or stop it (kill -TERM N) and rerun with --resume" (exit 2), N being RUN's writer.
    Fixed: the line says the lock file is a hard link to another log's and to remove the link, which works.
    (Replacing the shared file automatically was tried and dropped at review: a check-then-rename cannot be
    made atomic against a second writer of the copy, on NFS not even under a directory lock.)
    """
    import subprocess
    import sys

    data = _prompts(tmp_path)
    plan = _plan(tmp_path, data)
    log = tmp_path / "RUN"
    r = invoke_cli(*_run_args(plan, data, log))
    assert r.exit_code == 0, r.output
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from aspc.runtime.record.lock import RunLogLock; "
         "RunLogLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)", str(log)],
        cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"  # RUN's writer, still running
        held = (log / ".lock").read_bytes()
        snap = tmp_path / "SNAP"
        subprocess.run(["cp", "-al", str(log), str(snap)], check=True)
        # Refused, but saying what is shared and how to give the copy a lock of its own (not: stop RUN's writer).
        msg = one_line_error(invoke_cli(*_run_args(plan, data, snap, "--resume")), 2)
        assert "hard link to another run log's" in msg and f"rm {snap / '.lock'}" in msg, msg
        assert (log / ".lock").read_bytes() == held  # the original's lock file, as its writer left it
        (snap / ".lock").unlink()  # the advice
        r = invoke_cli(*_run_args(plan, data, snap, "--resume"))
        assert r.exit_code == 0, r.output
        # ... and the original is still locked by its writer, named as such.
        msg = one_line_error(invoke_cli(*_run_args(plan, data, log, "--resume")), 2)
        assert f"pid {holder.pid}" in msg and "hard link" not in msg, msg
    finally:
        holder.kill()
        holder.wait()


def test_a_live_writers_lock_naming_another_inode_is_never_replaced(tmp_path):
    """Reviewer: a file system that shows another client another inode number for the same directory (CIFS
    noserverino, FUSE) made a live writer's lock file read as a copy's (replaced under it, in a version that
    swapped it: two writers). Only a file with other links (a hard-linked copy) is a copy's."""
    import subprocess
    import sys

    from aspc.errors import LockError
    from aspc.runtime.record.lock import RunLogLock

    log = tmp_path / "RUN"
    log.mkdir()
    hold = ("import sys, time; from aspc.runtime.record.lock import RunLogLock; RunLogLock(sys.argv[1]).acquire(); "
            "print('held', flush=True); time.sleep(60)")  # fmt: skip
    p = subprocess.Popen([sys.executable, "-c", hold, str(log)], cwd=Path(__file__).resolve().parents[1],
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert p.stdout.readline().strip() == "held"
        lock_file = log / ".lock"
        pid = lock_file.read_text().split()[0]
        with open(lock_file, "r+") as fh:  # the same file, as another client would read its directory's inode
            fh.write(f"{pid}\nino:1\n")
        with pytest.raises(LockError, match="locked by another aspc run"):  # not taken for a copy's
            RunLogLock(log).acquire()
    finally:
        p.kill()
        p.wait()
