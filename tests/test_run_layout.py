"""A ``--log`` directory holds one kind of run: one run, epochs, or epochs after a scout (``aspc.run_layout``).

Before these checks, each kind's writer only looked for its own files:
``--epochs 2`` without ``--overwrite`` wrote its epochs beside a finished
single run, ``--resume --epochs`` started epochs inside one, ``--resume
--scout`` ran a whole scout before failing, and resuming epochs as a single
run said "not an aspc run log". Every refusal here is one line, exit 2, and
leaves every file of the directory as it was.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.run_layout import EPOCHS, SCOUT, SINGLE, log_layout
from tests.conftest import lognormal_records, write_jsonl

# The scout replays a recorded length the epoch does not: 5 lengths for 4 samples.
N = 4


def _run(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("layout")
    data = write_jsonl(tmp / "x.jsonl", lognormal_records(96, n_lengths=N + 1))
    plan = tmp / "p.parquet"
    assert _run("compile", data, "--length-field", "lengths", "-n", N, "-o", plan, "-q").exit_code == 0
    return tmp, data, plan


def _run_plan(setup, log: Path, *extra: str):
    tmp, data, plan = setup
    return _run("run", plan, "--actual-lengths", data, "--length-field", "lengths", "--global-batch", 32,
                "--log", log, "--json", "-q", *extra)  # fmt: skip


@pytest.fixture(scope="module")
def logs(setup):
    tmp = setup[0]
    made = {SINGLE: tmp / "single", EPOCHS: tmp / "epochs", SCOUT: tmp / "scout"}
    for kind, extra in ((SINGLE, ()), (EPOCHS, ("--epochs", "2")), (SCOUT, ("--scout",))):
        r = _run_plan(setup, made[kind], *extra)
        assert r.exit_code == 0, r.output
        assert log_layout(made[kind]) == kind
    return made


# (log kind, options of the second command, words of the refusal)
REFUSED = [
    (SINGLE, ("--epochs", "2"), "directory exists and is not empty"),
    (SINGLE, ("--scout",), "directory exists and is not empty"),
    (SINGLE, ("--epochs", "2", "--resume"), "holds a run started without --epochs or --scout"),
    (SINGLE, ("--scout", "--resume"), "holds a run started without --epochs or --scout"),
    (EPOCHS, ("--resume",), "holds a run of 2 epochs started with --epochs and without --scout: resume it with "
                            "--epochs 2 (or more epochs to go on)"),
    (EPOCHS, ("--epochs", "2", "--scout", "--resume"), "holds a run started with --epochs and without --scout"),
    (EPOCHS, (), "directory exists and is not empty"),
    (EPOCHS, ("--epochs", "3"), "already holds epoch plans; pass --resume to continue them"),
    (SCOUT, ("--resume",), "holds a run of 1 epoch started with --scout: resume it with --scout "),
    (SCOUT, ("--epochs", "2", "--resume"), "holds a run started with --scout"),
    (SCOUT, ("--epochs", "2"), "directory exists and is not empty"),
    (SCOUT, ("--scout", "--epochs", "2"), "already holds epoch plans; pass --resume to continue them"),
]


@pytest.mark.parametrize(("kind", "extra", "words"), REFUSED)
def test_another_kind_of_run_is_refused_before_anything_is_written(setup, logs, kind, extra, words):
    before = _snapshot(logs[kind])
    r = _run_plan(setup, logs[kind], *extra)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and words in lines[0], r.output
    assert _snapshot(logs[kind]) == before


def test_the_same_kind_resumes(setup, logs, tmp_path):
    import shutil

    for kind, extra in ((SINGLE, ()), (EPOCHS, ("--epochs", "2")), (SCOUT, ("--scout",))):
        copy = tmp_path / kind
        shutil.copytree(logs[kind], copy)
        r = _run_plan(setup, copy, *extra, "--resume")
        assert r.exit_code == 0, r.output
        assert log_layout(copy) == kind


@pytest.mark.parametrize(("kind", "extra", "after"), [
    (SINGLE, ("--epochs", "2"), EPOCHS),
    (SINGLE, ("--scout",), SCOUT),
    (EPOCHS, (), SINGLE),
    (SCOUT, ("--epochs", "2"), EPOCHS),
    (EPOCHS, ("--epochs", "1"), SINGLE),  # --epochs 1 is one run
])  # fmt: skip
def test_overwrite_replaces_a_run_of_another_kind_whole(setup, logs, tmp_path, kind, extra, after):
    import shutil

    copy = tmp_path / kind
    shutil.copytree(logs[kind], copy)
    r = _run_plan(setup, copy, *extra, "--overwrite")
    assert r.exit_code == 0, r.output
    assert log_layout(copy) == after
    names = {p.name for p in copy.iterdir()}
    if after == SINGLE:
        assert not any(n.startswith("epoch-") or n == "scout" for n in names), names
    else:
        assert "meta.json" not in names and (after == SCOUT) == ("scout" in names), names


def test_overwrite_with_fewer_epochs_leaves_no_stale_epoch(setup, tmp_path):
    log = tmp_path / "three"
    assert _run_plan(setup, log, "--epochs", "3").exit_code == 0
    r = _run_plan(setup, log, "--epochs", "2", "--overwrite")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in log.iterdir()) == ["epoch-1", "epoch-2", "plans"]
    assert sorted(p.name for p in (log / "plans").iterdir()) == ["epoch-1.parquet", "epoch-2.parquet"]


@pytest.mark.parametrize("extra", [("--epochs", "2"), ("--scout",), ()])
@pytest.mark.parametrize(("mode", "words"), [
    ("--overwrite", "not an aspc run log, refusing to overwrite it"),
    ("--resume", "not an aspc run log, nothing to resume"),
    (None, "directory exists and is not empty"),
])  # fmt: skip
def test_a_foreign_directory_is_never_written(setup, tmp_path, extra, mode, words):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a run\n")
    r = _run_plan(setup, foreign, *extra, *([mode] if mode else []))
    assert r.exit_code == 2, r.output
    assert words in r.output
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_an_epochs_run_stopped_before_its_first_plan_resumes(setup, tmp_path):
    # An epochs run makes RUN/plans/ first: a crash right after leaves only that, which is no foreign file.
    log = tmp_path / "early"
    (log / "plans").mkdir(parents=True)
    r = _run_plan(setup, log, "--epochs", "2", "--resume")
    assert r.exit_code == 0, r.output
    assert log_layout(log) == EPOCHS


def test_a_second_epochs_run_on_a_live_one_writes_nothing(setup, tmp_path):
    # Two --resume at once, or an --overwrite of a running one: the first holds RUN/.lock.
    from aspc.runtime.record.lock import RunLogLock

    log = tmp_path / "live"
    assert _run_plan(setup, log, "--epochs", "2").exit_code == 0
    before = _snapshot(log)
    with RunLogLock(log):
        for extra in (("--resume",), ("--overwrite",)):
            r = _run_plan(setup, log, "--epochs", "3", *extra)
            assert r.exit_code == 2 and "is locked by another aspc run" in r.output, r.output
            assert {k: v for k, v in _snapshot(log).items() if k != ".lock"} == before
    r = _run_plan(setup, log, "--epochs", "3", "--resume")
    assert r.exit_code == 0, r.output
    assert not (log / ".lock").exists()  # released at the end


@pytest.mark.parametrize("part", ["epoch-1", "epoch-3", "scout"])
@pytest.mark.parametrize("extra", [(), ("--overwrite",), ("--resume",)])
def test_a_part_of_an_epochs_or_scout_run_is_not_a_log_of_its_own(setup, tmp_path, part, extra):
    # `aspc run --log RUN/epoch-1 --overwrite` replaced a finished epoch of a live --epochs run (whose lock
    # is on RUN), `--log RUN/epoch-3` took the next epoch's name: the epochs run failed, and could not resume.
    from aspc.runtime.record.lock import RunLogLock

    log = tmp_path / "live"
    assert _run_plan(setup, log, "--epochs", "2", "--scout").exit_code == 0
    before = _snapshot(log)
    with RunLogLock(log):
        r = _run_plan(setup, log / part, *extra)
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
        assert f"is a part of the run in {log}, which another aspc run is writing" in r.output
    r = _run_plan(setup, log / part, *extra)  # no writer: still that run's own part
    assert r.exit_code == 2 and f"is a part of the --epochs/--scout run in {log}; continue" in r.output, r.output
    assert _snapshot(log) == before
    mine = tmp_path / "mine" / part  # a user's own folder of that name, with no epochs run around it
    assert _run_plan(setup, mine).exit_code == 0


@pytest.mark.parametrize("extra", [(), ("--epochs", "2"), ("--epochs", "2", "--resume")])
def test_a_log_being_written_is_named_as_such_not_as_a_directory_to_overwrite(setup, tmp_path, extra):
    # While a run writes RUN, a second `aspc run --log RUN` was told "directory exists and is not
    # empty; ... pass --overwrite" (or that RUN holds another kind of run): advice for a log in use.
    from aspc.runtime.record.lock import RunLogLock

    log = tmp_path / "live"
    assert _run_plan(setup, log).exit_code == 0
    before = _snapshot(log)
    with RunLogLock(log):
        r = _run_plan(setup, log, *extra)
        assert r.exit_code == 2 and "is locked by another aspc run" in r.output, r.output
        assert "not empty" not in r.output and "--overwrite" not in r.output
    assert _snapshot(log) == before
    r = _run_plan(setup, log)  # no writer: what it holds, as before
    assert r.exit_code == 2 and "not empty" in r.output, r.output


@pytest.mark.parametrize("extra", [("--scout-tokens", "200"), ("--max-new-tokens", "2000")])
def test_a_scout_resumed_with_another_cut_names_the_cut(setup, logs, extra):
    # The scout's log stores its cut as its --max-new-tokens; the message names the scout's options.
    before = _snapshot(logs[SCOUT])
    r = _run_plan(setup, logs[SCOUT], "--scout", "--resume", *extra)
    assert r.exit_code == 2, r.output
    assert "its length scout was cut at 1024 tokens" in r.output and "--scout-tokens" in r.output, r.output
    assert _snapshot(logs[SCOUT]) == before


def test_a_writer_meeting_another_commands_lock_probe_still_starts(tmp_path):
    # refuse_if_locked holds a shared lock for a moment: a writer starting in that instant was
    # refused as "locked by another aspc run", with no run writing the log.
    import fcntl
    import os
    import threading

    from aspc.runtime.record.lock import LOCK_FILE, RunLogLock

    log = tmp_path / "L"
    log.mkdir()
    fd = os.open(log / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_SH)  # the probe's moment
    threading.Timer(0.01, lambda: os.close(fd)).start()
    with RunLogLock(log) as lock:
        assert lock.held


def _skeleton(d: Path, *, plan_temp: bool = False) -> Path:
    """What a writer killed (or out of space) before its first meta.json leaves: lock, a temporary, empty parts."""
    from aspc.runtime.record.runlog import KINDS

    d.mkdir(parents=True, exist_ok=True)
    (d / ".lock").write_text("")
    (d / ".meta.json.999999999.k2x9.tmp").write_text("{")  # pid 999999999: a writer long gone
    for kind in KINDS:
        (d / kind).mkdir(exist_ok=True)
    if plan_temp:
        (d / "plans").mkdir(exist_ok=True)
        (d / "plans" / ".epoch-1.parquet.999999999.ab_c.tmp").write_bytes(b"PAR1")
    return d


@pytest.mark.parametrize("flag", [(), ("--resume",), ("--overwrite",)])
def test_a_log_killed_before_its_first_meta_json_starts_afresh(setup, tmp_path, flag):
    # A run killed (or out of disk space) while it created its log left the lock, a temporary and
    # empty part folders; a rerun, --resume and --overwrite all refused it, only rm -rf went on.
    log = _skeleton(tmp_path / "RUN")
    r = _run_plan(setup, log, *flag)
    assert r.exit_code == 0, r.output
    assert not list(log.glob(".*.tmp"))
    # A file of the user's beside the same leftovers is still refused, one named like a temporary too,
    # and so is a temporary whose writer is alive (this process).
    for name in ("notes.txt", ".notes.2024.draft.tmp", f".meta.json.{os.getpid()}.live.tmp"):
        other = _skeleton(tmp_path / f"MINE{len(name)}")
        (other / name).write_text("mine")
        before = _snapshot(other)
        r = _run_plan(setup, other, *flag)
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
        assert _snapshot(other) == before


def test_epochs_killed_while_an_epoch_log_or_plan_was_created_resume(setup, tmp_path):
    # Epoch 2's log killed at its creation: --resume refused it, and --overwrite threw epoch 1 away.
    log = tmp_path / "E"
    assert _run_plan(setup, log, "--epochs", "2").exit_code == 0
    first = _snapshot(log / "epoch-1")
    import shutil

    shutil.rmtree(log / "epoch-2")
    _skeleton(log / "epoch-2")
    r = _run_plan(setup, log, "--epochs", "2", "--resume")
    assert r.exit_code == 0, r.output
    assert _snapshot(log / "epoch-1") == first  # read back, not run again
    assert (log / "epoch-2" / "meta.json").is_file()
    # Killed while writing epoch 1's plan: the root holds the lock and the plan's temporary only.
    root = tmp_path / "P"
    root.mkdir()
    (root / ".lock").write_text("")
    (root / "plans").mkdir()
    (root / "plans" / ".epoch-1.parquet.999999999.ab_c.tmp").write_bytes(b"PAR1")
    for flag in ("--resume", "--overwrite"):
        r = _run_plan(setup, root, "--epochs", "2", flag)
        assert r.exit_code == 0, r.output
        shutil.rmtree(root)
        _skeleton(root, plan_temp=True)
