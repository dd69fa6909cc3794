"""Promises an adversarial user broke (issue 15): outputs over inputs, devices,
links, overflowing options, negative seeds, a full disk, unwritable caches,
plans without their hash, ignored options and four-line usage errors.

Every test here failed on the code before the fix.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.emit import schema as S
from tests.conftest import ROOT, lognormal_records, write_jsonl

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _run(*args: str) -> object:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _cli(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **kw.pop("env", {})}
    return subprocess.run(
        [sys.executable, "-m", "aspc.cli", *args], capture_output=True, text=True, timeout=timeout, env=env, **kw
    )


def _one_line_error(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    assert lines[0].startswith("Error: ")
    return lines[0]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# The fixtures small (120 prompts) and plan (compiled from it) are in conftest.


# --------------------------------------------------------------------------- output over input


@pytest.mark.parametrize("alias", ["same", "symlink", "hardlink", "dotted"])
def test_compile_refuses_to_write_over_its_input(tmp_path, small, alias):
    before = _digest(small)
    if alias == "same":
        out = small
    elif alias == "symlink":
        out = tmp_path / "link.jsonl"
        out.symlink_to(small)
    elif alias == "hardlink":
        out = tmp_path / "hard.jsonl"
        os.link(small, out)
    else:
        (tmp_path / "sub").mkdir()
        out = tmp_path / "sub" / ".." / small.name
    r = _run("compile", str(small), "--length-field", "lengths", "-o", str(out))
    assert r.exit_code == 2
    assert "is also an input" in _one_line_error(r.output)
    assert _digest(small) == before


def test_export_refuses_plan_and_source_as_output(tmp_path, small, plan):
    before = _digest(plan)
    r = _run("export", str(plan), "-o", str(plan))
    assert r.exit_code == 2 and "is also an input" in r.output
    assert _digest(plan) == before
    src_before = _digest(small)
    r = _run("export", str(plan), "--format", "jsonl", "--source", str(small), "-o", str(small))
    assert r.exit_code == 2 and "is also an input" in r.output
    assert _digest(small) == src_before


def test_report_dir_may_not_contain_its_plan(tmp_path, plan):
    r = _run("report", str(plan), "-o", str(tmp_path))
    assert r.exit_code == 2 and "contains the input" in r.output
    assert plan.exists()


def test_run_log_may_not_contain_the_plan(tmp_path, plan):
    r = _run("run", str(plan), "--log", str(tmp_path), "--overwrite")
    assert r.exit_code == 2 and "contains the input" in r.output
    assert plan.exists()


# --------------------------------------------------------------------------- devices, FIFOs, links


def test_fifo_output_refused(tmp_path, small):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    r = _run("compile", str(small), "--length-field", "lengths", "-o", str(fifo))
    assert r.exit_code == 2 and "FIFO" in r.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.skipif(not IS_ROOT, reason="mknod of a character device needs root")
def test_character_device_output_refused_and_kept(tmp_path, small):
    dev = tmp_path / "full"
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # a copy of /dev/full
    r = _run("compile", str(small), "--length-field", "lengths", "-o", str(dev))
    assert r.exit_code == 2 and "character device" in r.output
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
    # A symlink to the device is refused the same way.
    link = tmp_path / "devlink"
    link.symlink_to(dev)
    r = _run("compile", str(small), "--length-field", "lengths", "-o", str(link))
    assert r.exit_code == 2 and "character device" in r.output
    assert link.is_symlink()


def test_atomic_write_refuses_a_device_even_without_the_cli_guard(tmp_path):
    from aspc.atomic import atomic_write_bytes
    from aspc.errors import OutputError

    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(OutputError):
        atomic_write_bytes(fifo, b"x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_symlink_output_is_written_through(tmp_path, small):
    real = tmp_path / "plans" / "v1.parquet"
    real.parent.mkdir()
    real.write_bytes(b"old")
    link = tmp_path / "latest.parquet"
    link.symlink_to(real)
    r = _run("compile", str(small), "--length-field", "lengths", "-o", str(link), "-q")
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert pq.read_metadata(real).num_rows == 120


def test_dangling_symlink_output_refused(tmp_path, small):
    link = tmp_path / "dangling.parquet"
    link.symlink_to(tmp_path / "nowhere" / "p.parquet")
    r = _run("compile", str(small), "--length-field", "lengths", "-o", str(link))
    assert r.exit_code == 2 and "dangling symlink" in r.output
    assert not (tmp_path / "nowhere").exists()


def test_trailing_slash_means_a_directory(tmp_path, small):
    out = f"{tmp_path}/out/newd/"
    r = _run("compile", str(small), "--length-field", "lengths", "-o", out)
    assert r.exit_code == 2 and "names a directory" in _one_line_error(r.output)
    assert not (tmp_path / "out").exists()


def test_directory_output_for_a_file_refused(tmp_path, small):
    r = _run("compile", str(small), "--length-field", "lengths", "-o", str(tmp_path))
    assert r.exit_code == 2 and "is a directory" in r.output


# --------------------------------------------------------------------------- numeric ranges


@pytest.mark.parametrize("value", ["1e305", "inf", "nan", "-1", "1e7"])
def test_minibatch_overhead_range_compile(tmp_path, small, value):
    r = _cli("compile", str(small), "--length-field", "lengths", "--minibatch-overhead", value,
             "-o", str(tmp_path / "p.parquet"))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--minibatch-overhead" in _one_line_error(r.stderr)
    assert not (tmp_path / "p.parquet").exists()


def test_minibatch_overhead_range_simulate(small):
    r = _cli("simulate", str(small), "--length-field", "lengths", "--minibatch-overhead", "1e305")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--minibatch-overhead" in _one_line_error(r.stderr)


def test_largest_allowed_overhead_compiles(tmp_path, small):
    from aspc.guards import MINIBATCH_OVERHEAD_MAX

    r = _cli("compile", str(small), "--length-field", "lengths", "--minibatch-overhead", str(MINIBATCH_OVERHEAD_MAX),
             "-o", str(tmp_path / "p.parquet"), "-q")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "cmd",
    [
        ["compile", "{small}", "--length-field", "lengths", "--strategy", "random", "--seed", "-1", "-o", "{tmp}/p.parquet"],
        ["compile", "{small}", "--length-field", "lengths", "--seed", str(2**64), "-o", "{tmp}/p.parquet"],
        ["run", "{plan}", "--seed", "-3"],
        ["simulate", "{small}", "--length-field", "lengths", "--seed", "-1"],
    ],
)
def test_negative_or_huge_seed_is_one_line(tmp_path, small, plan, cmd):
    args = [a.format(small=small, plan=plan, tmp=tmp_path) for a in cmd]
    r = _run(*args)
    assert r.exit_code == 2, r.output
    assert "--seed must be an integer in [0, 2**63-1]" in _one_line_error(r.output)


def test_range_guard_is_the_library_guard():
    from aspc.compiler import CompileConfig, InputOptions, prepare
    from aspc.errors import ConfigError

    with pytest.raises(ConfigError, match="--slack"):
        prepare("does-not-matter.jsonl", InputOptions(), CompileConfig(slack=-1))


# --------------------------------------------------------------------------- full disk


@pytest.fixture
def tiny_fs(tmp_path: Path):
    """A 64 KiB tmpfs (root only); skipped where mounting is not allowed."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    rc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode
    if rc != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root); the injected-ENOSPC tests cover this")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_disk_full_compile_and_export_on_a_real_small_fs(tiny_fs, small, plan):
    # Fill the disk but for a few bytes, so every write of a plan fails midway.
    filler = tiny_fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 512)
    except OSError:
        pass
    finally:
        os.close(fd)
    r = _cli("compile", str(small), "--length-field", "lengths", "-o", str(tiny_fs / "p.parquet"))
    assert r.returncode == 2
    assert "no space left" in _one_line_error(r.stderr)
    r = _cli("export", str(plan), "-o", str(tiny_fs / "t.parquet"))
    assert r.returncode == 2
    assert "no space left" in _one_line_error(r.stderr)
    assert sorted(p.name for p in tiny_fs.iterdir()) == ["filler"]


def test_disk_full_injected_names_the_output_and_leaves_nothing(tmp_path, monkeypatch, small):
    import pyarrow.parquet as pq_mod

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq_mod, "write_table", full)
    out = tmp_path / "o" / "p.parquet"
    r = _run("compile", str(small), "--length-field", "lengths", "-o", str(out))
    assert r.exit_code == 2
    line = _one_line_error(r.output)
    assert "no space left" in line and str(out) in line and ".tmp" not in line
    assert not (tmp_path / "o").exists()  # the folder the failed write made is gone too


def test_arrow_style_disk_full_without_errno(tmp_path):
    from aspc.atomic import atomic_path
    from aspc.errors import OutputError

    with pytest.raises(OutputError, match="no space left"):
        with atomic_path(tmp_path / "x.parquet"):
            raise OSError("IOError: [Errno 28] No space left on device. Detail: [errno 28] No space left on device")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- permissions


def test_permission_error_names_the_output_not_the_temp(tmp_path, monkeypatch, small):
    import tempfile

    def denied(*_a, dir=None, prefix="", suffix="", **_k):  # noqa: A002 - mkstemp's name
        raise PermissionError(errno.EACCES, "Permission denied", os.path.join(dir, prefix + "abc" + suffix))

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    out = tmp_path / "p.parquet"
    r = _run("compile", str(small), "--length-field", "lengths", "-o", str(out))
    assert r.exit_code == 2
    line = _one_line_error(r.output)
    assert f"cannot write {out}" in line and ".tmp" not in line


def test_read_only_directory_names_the_output(tmp_path, small):
    ro = tmp_path / "ro"
    ro.mkdir()
    if IS_ROOT:
        rc = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=16k", "tmpfs", str(ro)], capture_output=True)
        if rc.returncode != 0:
            pytest.skip("cannot mount a read-only tmpfs")
    else:
        ro.chmod(0o555)
    try:
        out = ro / "p.parquet"
        r = _run("compile", str(small), "--length-field", "lengths", "-o", str(out))
        assert r.exit_code == 2
        line = _one_line_error(r.output)
        assert f"cannot write {out}" in line and ".tmp" not in line
    finally:
        if IS_ROOT:
            subprocess.run(["umount", str(ro)], check=False)
        else:
            ro.chmod(0o755)


# --------------------------------------------------------------------------- numba cache


def test_numba_cache_choice_falls_back(monkeypatch, tmp_path):
    from aspc import numba_config

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    writable = {str(tmp_path / f"aspc-numba-cache-{os.getuid()}")}
    monkeypatch.setattr(numba_config, "_writable_dir", lambda p: str(p) in writable)
    enabled, cache_dir, note = numba_config.choose_cache(tmp_path / "pkg")
    assert enabled and cache_dir in writable and "not writable" in note
    writable.clear()
    enabled, cache_dir, note = numba_config.choose_cache(tmp_path / "pkg")
    assert not enabled and cache_dir is None and "compile on every run" in note


def test_kernels_run_with_read_only_package_and_home(tmp_path):
    """A read-only install used by someone whose HOME is not writable (numba used to refuse to decorate)."""
    if not IS_ROOT:
        pytest.skip("needs root to mount a read-only copy of the package")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount tmpfs here")
    try:
        subprocess.run(
            f"tar --exclude=__pycache__ -C {ROOT} -cf - aspc | tar -xf - -C {mnt} && mkdir {mnt}/home",
            shell=True, check=True,
        )
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        tmp = tmp_path / "tmp"
        tmp.mkdir()
        env = {**os.environ, "PYTHONPATH": str(mnt), "HOME": str(mnt / "home"), "TMPDIR": str(tmp)}
        env.pop("NUMBA_CACHE_DIR", None)
        env.pop("XDG_CACHE_HOME", None)
        env.pop("NUMBA_DISABLE_JIT", None)
        code = (
            "import numpy as np; from aspc.partition import partition; "
            "print(partition(np.sort(np.random.default_rng(0).random(64)), 8, 2).tolist()[:3])"
        )
        # cwd outside the repo: "-c" puts the cwd first on sys.path.
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=tmp
        )
        assert r.returncode == 0, r.stderr
        assert "no locator" not in r.stderr
        assert (tmp / f"aspc-numba-cache-{os.getuid()}").is_dir()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


# --------------------------------------------------------------------------- check trusts no missing hash


def _rewrite(plan: Path, out: Path, *, drop=(), blank=(), edit=None) -> Path:
    table = pq.read_table(plan)
    meta = dict(table.schema.metadata)
    for k in drop:
        meta.pop(k, None)
    for k in blank:
        meta[k] = b""
    if edit is not None:
        table = edit(table)
    pq.write_table(table.replace_schema_metadata(meta), out)
    return out


def _set(col: str, value):
    import pyarrow as pa

    def edit(t):
        vals = t.column(col).to_pylist()
        vals[3] = value
        i = t.schema.get_field_index(col)
        return t.set_column(i, t.schema.field(col), pa.array(vals, t.schema.field(col).type))

    return edit


@pytest.mark.parametrize(
    "change",
    [
        {"drop": [S.META_ROWS_HASH], "edit": _set(S.PREDICTED_LEN, 5000.0)},
        {"blank": [S.META_ROWS_HASH], "edit": _set(S.N_SAMPLES, 1000)},
        {"drop": [S.META_ROWS_HASH, S.META_METRICS], "edit": _set(S.PREDICTED_LEN, 5000.0)},
        {"drop": [S.META_ROWS_HASH], "edit": _set(S.PROMPT_TOKENS, -5)},
        {"drop": [S.META_ROWS_HASH], "edit": _set(S.PROMPT_ID, "")},
        {"drop": [S.META_METRICS]},
        {"drop": [S.META_ROWS_HASH]},
    ],
)
def test_check_fails_a_plan_without_its_hash_or_metrics(tmp_path, plan, change):
    bad = _rewrite(plan, tmp_path / "bad.parquet", **change)
    r = _run("check", str(bad))
    assert r.exit_code == 2, r.output
    assert "OK" not in r.output


def test_invalid_rows_fail_even_with_a_recomputed_hash(tmp_path, plan):
    from aspc.emit import rows_hash

    for edit, word in ((_set(S.PROMPT_TOKENS, -5), "prompt_tokens"), (_set(S.PROMPT_ID, ""), "prompt_id")):
        table = edit(pq.read_table(plan))
        meta = dict(table.schema.metadata)
        meta[S.META_ROWS_HASH] = rows_hash(table.cast(S.PLAN_SCHEMA)).encode()
        pq.write_table(table.replace_schema_metadata(meta), tmp_path / "bad.parquet")
        r = _run("check", str(tmp_path / "bad.parquet"))
        assert r.exit_code == 2 and word in r.output, r.output


@pytest.mark.parametrize("flag", ["--max-padding", "--max-imbalance", "--max-drift"])
@pytest.mark.parametrize("value", ["nan", "-0.1", "inf"])
def test_check_rejects_nan_and_negative_bounds(plan, flag, value):
    r = _run("check", str(plan), flag, value)
    assert r.exit_code == 2, r.output
    assert flag in _one_line_error(r.output)


def test_check_still_passes_a_good_plan(plan):
    r = _run("check", str(plan), "--max-padding", "10")
    assert r.exit_code == 0, r.output


# --------------------------------------------------------------------------- CLI surface


def test_simulate_strategy_is_not_silently_ignored(small):
    r = _run("simulate", str(small), "--length-field", "lengths", "--strategy", "sorted")
    assert r.exit_code == 2
    assert "--strategies" in _one_line_error(r.output)


@pytest.mark.parametrize(
    "args",
    [
        ["compile", "x.jsonl", "--bogus"],
        ["compile"],
        ["check", "p.parquet", "--max-padding", "abc"],
        ["nosuchcommand"],
        ["predict", "train"],
        ["run", "p.parquet", "--workers", "many"],
    ],
)
def test_usage_errors_are_one_line(args):
    r = _cli(*args, timeout=60)
    assert r.returncode == 2
    line = _one_line_error(r.stderr)
    assert "--help" in line


def test_help_and_bare_group_still_print_help():
    r = _cli(timeout=60)
    assert "Commands:" in r.stdout + r.stderr
    r = _cli("compile", "--help", timeout=60)
    assert r.returncode == 0 and "Usage: aspc compile" in r.stdout


# --------------------------------------------------------------------------- temporaries after signals


def test_stale_temporary_of_a_killed_writer_is_removed(tmp_path, small):
    out = tmp_path / "plan.parquet"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".plan.parquet.{int(dead.stdout)}.ab12cd_9.tmp"
    stale.write_bytes(b"half a plan")
    live = tmp_path / f".plan.parquet.{os.getpid()}.zz99yy_1.tmp"
    live.write_bytes(b"someone else's write in progress")
    r = _run("compile", str(small), "--length-field", "lengths", "-o", str(out), "-q")
    assert r.exit_code == 0
    assert not stale.exists() and live.exists()


def test_sigterm_during_compile_removes_its_temporary(tmp_path):
    import signal
    import time

    src = write_jsonl(tmp_path / "in.jsonl", lognormal_records(200_000, seed=3, n_lengths=2))
    out = tmp_path / "plan.parquet"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "aspc.cli", "compile", str(src), "--length-field", "lengths", "-o", str(out), "-q"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    # Wait for the temporary to appear (the write stage), then terminate.
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if any(p.name.endswith(".tmp") for p in tmp_path.iterdir()):
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("compile finished before the signal arrived")
    assert proc.returncode == 128 + signal.SIGTERM
    assert "interrupted by SIGTERM" in _one_line_error(err)
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    assert not out.exists()


def test_interrupt_is_deferred_inside_a_commit():
    import signal

    from aspc import interrupt
    from aspc.errors import Interrupted

    done = []
    with pytest.raises(Interrupted) as info:
        with interrupt.handlers():
            with interrupt.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                done.append("commit finished")
    assert done == ["commit finished"] and info.value.signum == signal.SIGTERM


def test_output_guard_messages_are_one_line():
    from aspc.errors import OutputError
    from aspc.guards import check_output

    with pytest.raises(OutputError) as info:
        check_output("", inputs=())
    assert "\n" not in str(info.value)
    assert json.dumps(str(info.value))


def test_dev_stdout_as_output_is_refused_when_it_is_a_pipe(small):
    # /dev/stdout -> /proc/self/fd/1, a "magic" link to the pipe: realpath names no real file.
    r = _cli("compile", str(small), "--length-field", "lengths", "-o", "/dev/stdout")
    assert r.returncode == 2
    assert "FIFO" in _one_line_error(r.stderr) and ".tmp" not in r.stderr


def test_export_refuses_the_source_it_found_by_hash(tmp_path, small, plan):
    # No --source: export finds x.jsonl next to the plan by its sha256; it is still an input.
    before = _digest(small)
    r = _run("export", str(plan), "--format", "jsonl", "-o", str(small))
    assert r.exit_code == 2 and "is also an input" in r.output, r.output
    assert _digest(small) == before


@pytest.mark.parametrize("damage", ["head", "tail", "empty", "footer"])
def test_damaged_plan_is_one_line_that_says_how_to_fix_it(tmp_path, plan, damage):
    data = plan.read_bytes()
    bad = tmp_path / "bad.parquet"
    bad.write_bytes({"head": data[:4000], "tail": data[:-10], "empty": b"", "footer": data[:-8] + b"\0" * 8}[damage])
    for cmd in (["check"], ["inspect"], ["run", "--quiet"]):
        r = _cli(*cmd, str(bad))
        assert r.returncode == 2, (cmd, r.stderr)
        line = _one_line_error(r.stderr)
        assert "compile it again" in line and "Either the file" not in line and "input source" not in line, line


def test_random_byte_damage_never_reads_as_another_plan(tmp_path, plan):
    # Whatever bytes are hit, reading fails with an aspc error or yields the very same rows
    # (bytes no reader looks at); never a different plan and never another exception.
    import random

    from aspc.emit.check import verify_integrity
    from aspc.emit.plan import read_plan
    from aspc.errors import AspcError

    data = plan.read_bytes()
    ref = read_plan(plan).table
    rng = random.Random(0)
    bad = tmp_path / "bad.parquet"
    failed = 0
    for _ in range(60):
        b = bytearray(data)
        at = rng.randrange(len(b))
        for j in range(at, min(len(b), at + rng.choice([1, 4, 64]))):
            b[j] = rng.randrange(256)
        bad.write_bytes(bytes(b))
        try:
            got = read_plan(bad)
            verify_integrity(got)
        except AspcError:
            failed += 1
            continue
        assert got.table.equals(ref), at
    assert failed > 30  # the damage is real: most of it must be caught


# --------------------------------------------------------------------------- outputs inside input directories


def test_predictor_output_never_deletes_a_foreign_directory(tmp_path, small):
    mine = tmp_path / "mydir"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    r = _cli("predict", "train", str(small), "--length-field", "lengths", "-o", str(mine), "-q")
    assert r.returncode == 2 and "not an aspc predictor" in _one_line_error(r.stderr)
    assert (mine / "notes.txt").read_text() == "precious"
    # An earlier predictor there is replaced, as before.
    pred = tmp_path / "pred"
    for _ in range(2):
        r = _cli("predict", "train", str(small), "--length-field", "lengths", "-o", str(pred), "-q")
        assert r.returncode == 0, r.stderr
    # Nor a directory holding the predictor it starts from.
    r = _cli("predict", "train", str(small), "--length-field", "lengths", "--init", str(pred), "-o", str(tmp_path), "-q")
    assert r.returncode == 2 and "contains the input" in _one_line_error(r.stderr)
    assert (pred / "metadata.json").is_file()


def test_a_file_output_inside_an_input_directory_is_refused(tmp_path, small, plan):
    pred = tmp_path / "pred"
    assert _cli("predict", "train", str(small), "--length-field", "lengths", "-o", str(pred), "-q").returncode == 0
    meta = _digest(pred / "metadata.json")
    run = tmp_path / "RUN"
    r = _cli("run", str(plan), "--actual-lengths", str(small), "--length-field", "lengths", "--log", str(run), "-q")
    assert r.returncode == 0, r.stderr
    run_meta = _digest(run / "meta.json")
    for args in (
        ["compile", str(small), "--predictor", str(pred), "-o", str(pred / "metadata.json"), "-q"],
        ["predict", str(pred), str(small), "-o", str(pred / "weights.npz"), "-q"],
        ["calibrate", str(run), "-o", str(run / "meta.json"), "-q"],
        ["compile", str(small), "--history", str(run), "-o", str(run / "plan.parquet"), "-q"],
    ):
        r = _cli(*args)
        assert r.returncode == 2 and "inside the input directory" in _one_line_error(r.stderr), args
    assert _digest(pred / "metadata.json") == meta and _digest(run / "meta.json") == run_meta


def test_run_overwrite_keeps_a_cost_model_inside_the_log(tmp_path, small, plan):
    run = tmp_path / "RUN"
    assert _cli("run", str(plan), "--actual-lengths", str(small), "--length-field", "lengths", "--log", str(run),
                "-q").returncode == 0
    cost = run / "cost.json"
    assert _cli("calibrate", str(run), "-o", str(tmp_path / "cost.json"), "-q").returncode == 0
    cost.write_bytes((tmp_path / "cost.json").read_bytes())
    r = _cli("run", str(plan), "--actual-lengths", str(small), "--length-field", "lengths", "--cost-model", str(cost),
             "--log", str(run), "--overwrite", "-q")
    assert r.returncode == 2 and "contains the input cost.json" in _one_line_error(r.stderr)
    assert cost.is_file()


# --------------------------------------------------------------------------- values and paths the OS or a kernel refuses


def test_path_names_too_long_are_one_line(tmp_path, small):
    long = "x" * 300
    for args in (
        ["compile", str(small), "--length-field", "lengths", "-o", str(tmp_path / f"{long}.parquet"), "-q"],
        ["compile", str(tmp_path / f"{long}.jsonl"), "-o", str(tmp_path / "p.parquet"), "-q"],
        ["predict", "train", str(small), "--length-field", "lengths", "-o", str(tmp_path / long), "-q"],
    ):
        r = _cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "too long" in _one_line_error(r.stderr)
    assert not any(tmp_path.glob("*.parquet"))


@pytest.mark.parametrize("typ", ["int64", "uint64", "list"])
def test_parquet_integer_lengths_past_float_precision_are_one_line(tmp_path, typ):
    import pyarrow as pa

    big = 2**64 - 1 if typ == "uint64" else 2**53 + 1
    values = [[big]] + [[1]] * 49 if typ == "list" else [big] + [1] * 49
    arrow_type = pa.list_(pa.int64()) if typ == "list" else getattr(pa, typ)()
    src = tmp_path / "big.parquet"
    pq.write_table(pa.table({"id": [str(i) for i in range(50)], "prompt": [f"p {i}" for i in range(50)],
                             "length": pa.array(values, arrow_type)}), src)
    for cmd in (["compile", str(src), "--length-field", "length", "-o", str(tmp_path / "p.parquet"), "-q"],
                ["simulate", str(src), "--length-field", "length", "--strategies", "asp", "-q"]):
        r = _cli(*cmd)
        assert r.returncode == 2, r.stderr
        assert "above 10,000,000 tokens" in _one_line_error(r.stderr)
    assert not (tmp_path / "p.parquet").exists()


def test_run_options_past_what_the_kernels_hold_are_one_line(tmp_path, small, plan):
    base = ["run", str(plan), "--actual-lengths", str(small), "--length-field", "lengths", "-q"]
    for extra, words in (
        (["--queue-capacity", "99999999999999999999"], "give a smaller count"),
        (["--epochs", "2", "--length-drift", "1e7", "--log", str(tmp_path / "LD")], "use a smaller drift"),
        # (1 + F) ** (N - 1) past a float: Python's ** raised OverflowError, a traceback.
        (["--epochs", "3", "--length-drift", "1e200", "--log", str(tmp_path / "LD")], "use a smaller drift"),
    ):
        r = _cli(*base, *extra)
        assert r.returncode == 2 and words in _one_line_error(r.stderr), r.stderr
    assert not (tmp_path / "LD").exists()
    r = _cli("simulate", str(small), "--length-field", "lengths", "--repeats", "100000", "-q")
    assert r.returncode == 2 and "1..1000" in _one_line_error(r.stderr)


def test_history_without_its_length_field_names_the_history_option(tmp_path, small):
    r = _cli("compile", str(small), "--history", str(small), "-o", str(tmp_path / "p.parquet"), "-q")
    assert r.returncode == 2 and "pass --history-length-field NAME" in _one_line_error(r.stderr)


@pytest.mark.parametrize("option, value", [("--top-p", "2"), ("--temperature", "-3"), ("--top-k", "-5")])
def test_sim_rehearsal_checks_sampling_options_as_a_real_run_would(tmp_path, small, plan, option, value):
    r = _cli("run", str(plan), option, value, "-q")
    assert r.returncode == 2 and option in _one_line_error(r.stderr)
    r = _cli("probe", str(small), "--backend", "sim", "--actual-lengths", str(small), "--length-field", "lengths",
             "--prompts", "60", "--log", str(tmp_path / "L"), "-o", str(tmp_path / "P"), option, value, "-q")
    assert r.returncode == 2 and option in _one_line_error(r.stderr)
    assert not (tmp_path / "L").exists() and not (tmp_path / "P").exists()


def test_epoch_and_replan_option_errors_are_usage_errors(tmp_path, small, plan):
    base = ["run", str(plan), "--actual-lengths", str(small), "--length-field", "lengths", "-q"]
    for extra, words in (
        (["--epochs", "2"], "pass --log RUN"),
        (["--replan", "--replan-every", "0"], "--replan-every must be >= 1"),
        (["--length-drift", "0.1", "--log", str(tmp_path / "LD")], "pass --epochs N with N >= 2"),
    ):
        r = _cli(*base, *extra)
        assert r.returncode == 2 and words in _one_line_error(r.stderr), (extra, r.returncode, r.stderr)
    assert not (tmp_path / "LD").exists()


# --------------------------------------------------------------------------- stdout that cannot take the result


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize(
    "args",
    [("inspect", "{plan}", "--json"), ("inspect", "{plan}"), ("check", "{plan}", "--json"),
     # click's own output: a traceback from click.echo
     ("--help",), ("--version",), ("compile", "--help"), ("predict", "train", "--help")],
)
def test_a_full_stdout_is_one_line(plan, args):
    # A result printed to a full disk (or a closed stdout) was an OSError traceback from the print.
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "aspc.cli", *(a.format(plan=plan) for a in args)], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert r.returncode == 2
    what = "the result" if args[-1] not in ("--help", "--version") else "the help or version text"
    assert f"cannot write {what} to stdout: No space left on device" in _one_line_error(r.stderr)


def test_a_closed_stdout_is_one_line(plan):
    r = subprocess.run([sys.executable, "-m", "aspc.cli", "inspect", str(plan), "--json"], stderr=subprocess.PIPE,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       preexec_fn=lambda: os.close(1))  # fmt: skip
    assert r.returncode == 2 and "stdout is closed" in _one_line_error(r.stderr)


def test_a_reader_that_stops_ends_the_command_quietly(plan):
    # `aspc inspect PLAN | head -1`: the rest of the table meets a closed pipe. Like cat or grep,
    # the command ends as SIGPIPE would end it (128 + 13), without a traceback or an error line.
    p = subprocess.Popen([sys.executable, "-m", "aspc.cli", "inspect", str(plan)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    p.stdout.close()  # before the command prints anything
    err = p.stderr.read()
    assert p.wait(timeout=300) == 141 and err == "", err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize("cmd", ["compile", "export"])
def test_a_full_stdout_after_the_output_says_the_output_was_written(plan, small, tmp_path, cmd):
    # Exit 2 with the output in place read as a failed command: the line now says the output is whole.
    out = tmp_path / "o.parquet"
    args = (["compile", str(small), "--length-field", "lengths", "-o", str(out)] if cmd == "compile" else
            ["export", str(plan), "-o", str(out), "--json"])  # fmt: skip
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "aspc.cli", *args], stdout=full, stderr=subprocess.PIPE, text=True,
                           timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    line = _one_line_error(r.stderr)
    assert r.returncode == 2 and "cannot write the result to stdout: No space left on device" in line, line
    assert line.endswith(f"({out} had already been written in full)") and pq.read_metadata(out).num_rows > 0


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_a_full_stdout_after_a_run_names_a_few_of_its_files(plan, tmp_path):
    # A run log's parts are many: the one line named every one of them.
    log = tmp_path / "L"
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "aspc.cli", "run", str(plan), "--log", str(log)], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    line = r.stderr.strip().splitlines()[-1]  # after the run's own notes (lengths drawn, log written)
    assert r.returncode == 2 and line.startswith("Error: cannot write the result to stdout"), r.stderr
    assert line.endswith(" more had already been written in full)") and line.count(str(log)) == 3, line
