"""No partial outputs: atomic writes, and SIGKILL during a real compile."""

from __future__ import annotations

import contextlib
import importlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from aspc.atomic import atomic_dir, atomic_path, atomic_write_bytes
from aspc.emit import check_plan, read_plan
from tests.conftest import lognormal_records, write_jsonl


def test_atomic_path_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"partial")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    atomic_write_bytes(target, b"whole")
    assert target.read_bytes() == b"whole"


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_a_directory_that_takes_no_new_file_names_the_output(tmp_path, monkeypatch, kind):
    # /proc answers ENOENT when asked to create a file in it: the message named aspc's temporary
    # ("file not found: /proc/.x.12393.wigjygi0.tmp"), a file the user never asked for.
    import errno
    import tempfile

    from aspc.errors import OutputError

    def refuse(*, prefix, suffix, dir):  # noqa: A002  (tempfile's own keyword)
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", os.path.join(dir, prefix + "abc" + suffix))

    monkeypatch.setattr(tempfile, "mkstemp" if kind == "file" else "mkdtemp", refuse)
    target = tmp_path / "out"
    with pytest.raises(OutputError, match=rf"^cannot write {target}: {tmp_path} takes no new files; choose a writable"):
        with (atomic_path if kind == "file" else atomic_dir)(target):
            pass
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_signal_right_after_the_temporary_is_created_removes_it(tmp_path, monkeypatch, kind):
    # SIGTERM delivered the instant mkstemp/mkdtemp has created the temporary, before the
    # writer's cleanup owns it: the window a real SIGTERM hit in a CI run (a stray .tmp).
    import tempfile

    from aspc.errors import Interrupted
    from aspc.interrupt import handlers

    name = "mkstemp" if kind == "file" else "mkdtemp"
    real = getattr(tempfile, name)

    def create_then_signal(*args, **kwargs):
        made = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return made

    monkeypatch.setattr(tempfile, name, create_then_signal)
    opener = atomic_path if kind == "file" else atomic_dir
    entered = False
    with handlers(), pytest.raises(Interrupted):
        with opener(tmp_path / "out"):
            entered = True
    assert not entered
    assert list(tmp_path.iterdir()) == []


def test_outputs_get_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "f", b"x")
        with atomic_dir(tmp_path / "d") as tmp:
            (tmp / "a").write_text("1")
            # What safetensors' save_file does (the transformer predictor's weights were 0600).
            os.close(os.open(tmp / "private", os.O_WRONLY | os.O_CREAT, 0o600))
            (tmp / "sub").mkdir(mode=0o700)
            os.close(os.open(tmp / "sub" / "w", os.O_WRONLY | os.O_CREAT, 0o600))
    finally:
        os.umask(old)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755
    for inner, mode in (("a", 0o644), ("private", 0o644), ("sub", 0o755), ("sub/w", 0o644)):
        assert (tmp_path / "d" / inner).stat().st_mode & 0o777 == mode, inner


def test_atomic_dir_replaces_whole(tmp_path):
    target = tmp_path / "d"
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "b").write_text("2")
            raise RuntimeError("boom")
    assert sorted(p.name for p in target.iterdir()) == ["a"]
    with atomic_dir(target) as tmp:
        (tmp / "c").write_text("3")
    assert sorted(p.name for p in target.iterdir()) == ["c"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def _kill_compile_at(src, out, delay):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "aspc.cli", "compile", str(src), "--length-field", "lengths", "-o", str(out), "-q"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize("delay", [0.3, 0.9, 1.5, 2.2])
def test_sigkill_during_compile_leaves_whole_plan_or_none(tmp_path, delay):
    src = write_jsonl(tmp_path / "in.jsonl", lognormal_records(20000, seed=1, n_lengths=2))
    out = tmp_path / "plan.parquet"
    _kill_compile_at(src, out, delay)
    if out.exists():
        assert check_plan(read_plan(out)).ok
    # Temporary siblings may remain after SIGKILL, but never under the target name.
    assert all(p.name.startswith(".") or p.name in ("in.jsonl", "plan.parquet") for p in tmp_path.iterdir())


def test_a_signal_inside_a_finalizer_is_delivered_after_it(monkeypatch):
    # Raised inside __del__, Python would print and drop it (and Numba's
    # disposal code cut in half can crash): the policy sends it again instead.
    from aspc import interrupt
    from aspc.errors import Interrupted

    seen = []

    class Finalized:
        def __del__(self):
            seen.append(interrupt._in_finalizer(sys._getframe()))
            interrupt._handler(signal.SIGTERM, sys._getframe())  # must not raise here

    with pytest.raises(Interrupted):
        with interrupt.handlers():
            obj = Finalized()
            del obj
            time.sleep(2)  # the re-sent signal lands here
    assert seen == [True]
    assert not interrupt._in_finalizer(sys._getframe())


@contextlib.contextmanager
def _kernel_wait():
    """A function that waits 20 s in the kernel (select on a pipe): only a real signal to this thread ends it early."""
    r, w = os.pipe()
    try:
        yield lambda: select.select([r], [], [], 20)
    finally:
        os.close(r)
        os.close(w)


def test_a_resent_signal_wakes_a_main_thread_blocked_in_a_c_call():
    # Re-sent with _thread.interrupt_main, the signal only set Python's flag: a main thread then
    # blocked in a C call (zmq's poll while vLLM's engine starts) slept through it, up to 10 minutes.
    from aspc import interrupt
    from aspc.errors import Interrupted

    class Finalized:
        def __del__(self):
            interrupt._handler(signal.SIGINT, sys._getframe())  # deferred: re-sent in a moment

    t0 = time.monotonic()
    with _kernel_wait() as wait, pytest.raises(Interrupted) as caught:
        with interrupt.handlers():
            obj = Finalized()
            del obj
            wait()
    assert caught.value.signum == signal.SIGINT
    assert time.monotonic() - t0 < 5


def test_a_signal_another_thread_took_reaches_a_main_thread_blocked_in_a_c_call():
    # The kernel hands a process signal to any thread; in a library's thread Python only sets a flag,
    # which a main thread waiting in a C call (zmq's poll while vLLM's engine starts) never looked at.
    from aspc import interrupt
    from aspc.errors import Interrupted

    t0 = time.monotonic()
    with _kernel_wait() as wait, pytest.raises(Interrupted) as caught:
        with interrupt.handlers():
            # The timer's own thread takes the signal, as zmq's or torch's threads do.
            threading.Timer(0.2, lambda: signal.pthread_kill(threading.get_ident(), signal.SIGTERM)).start()
            wait()
    assert caught.value.signum == signal.SIGTERM
    assert time.monotonic() - t0 < 5


def test_a_signal_the_main_thread_took_is_raised_once():
    # The watcher may read the byte after the main thread already ran the handler; its copy sent on
    # must not raise a second Interrupted in the cleanup the first one started.
    from aspc import interrupt
    from aspc.errors import Interrupted

    raised = []
    with interrupt.handlers():
        for _ in range(3):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
            except Interrupted as exc:
                raised.append(exc.signum)
            try:
                time.sleep(4 * interrupt._Wakeup.WAIT)  # the cleanup: the watcher has had its moment
            except Interrupted as exc:
                raised.append(("again", exc.signum))
    assert raised == [signal.SIGINT] * 3


def test_a_forked_childs_own_signal_does_not_reach_the_parent():
    # A fork-started worker inherits the wakeup fd: a signal to the child alone was read by the
    # parent's watcher and sent on to the parent, interrupting it.
    from aspc import interrupt

    with interrupt.handlers():
        pid = os.fork()
        if pid == 0:  # the child: its own SIGTERM ends it (Interrupted), the parent must not hear of it
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(2)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(4 * interrupt._Wakeup.WAIT)  # no Interrupted here


def test_a_signal_held_by_a_commit_is_raised_once_after_it():
    # Held by deferred(), it was raised at the block's end; the watcher's copy, sent on 0.2 s later,
    # raised a second Interrupted into the cleanup the first one started.
    from aspc import interrupt
    from aspc.errors import Interrupted

    raised = []
    with interrupt.handlers():
        try:
            with interrupt.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.02)  # the commit ends before the watcher's moment (0.2 s)
        except Interrupted as exc:
            raised.append(exc.signum)
        try:
            time.sleep(4 * interrupt._Wakeup.WAIT)
        except Interrupted as exc:
            raised.append(("again", exc.signum))
    assert raised == [signal.SIGTERM]


def test_a_swallowed_interrupt_then_another_error_leaves_as_the_interrupt():
    # vLLM swallows the KeyboardInterrupt, then fails with "Engine core initialization failed" once its
    # engine died of the same Ctrl-C: the run was reported failed (exit 2), not interrupted (130).
    from aspc import interrupt, interrupt_libraries
    from aspc.errors import Interrupted

    with pytest.raises(Interrupted) as caught:
        with interrupt.handlers(), interrupt_libraries.must_escape():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(2)
            except KeyboardInterrupt:
                pass
            raise RuntimeError("Engine core initialization failed")
    assert caught.value.signum == signal.SIGINT


@pytest.mark.parametrize("then", ["block", "return"])
def test_an_interrupt_a_library_swallows_still_leaves_a_must_escape_block(then):
    # vLLM's zmq_socket_ctx catches KeyboardInterrupt while its engine starts, then waits up to 10
    # minutes for the engine: a Ctrl-C hung `aspc run --backend vllm` and was lost.
    from aspc import interrupt, interrupt_libraries
    from aspc.errors import Interrupted

    def library(wait):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(2)
        except KeyboardInterrupt:
            pass  # swallowed, as the library does
        if then == "block":
            wait()  # and then waits in the kernel

    t0 = time.monotonic()
    with _kernel_wait() as wait, pytest.raises(Interrupted) as caught:
        with interrupt.handlers(), interrupt_libraries.must_escape():
            library(wait)
    assert caught.value.signum == signal.SIGINT
    assert time.monotonic() - t0 < 6


@pytest.mark.parametrize("where", ["<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>"])
def test_a_signal_is_not_raised_inside_the_import_system(where):
    # importlib's module-lock weakref callback printed the Interrupted ("Exception ignored in
    # _get_module_lock.<locals>.cb"), dropped it and left the lock held: `aspc run` on a large
    # plan then hung, its preload thread waiting on an import for ever.
    from aspc import interrupt

    ns: dict = {}
    exec(compile("import sys\nframe = sys._getframe()", where, "exec"), ns)
    assert interrupt._in_finalizer(ns["frame"])
    assert not interrupt._in_finalizer(sys._getframe())


@pytest.mark.parametrize("raising", [False, True])
def test_a_signal_is_raised_in_a_modules_own_code_only_where_imports_raise(tmp_path, monkeypatch, raising):
    # Raised there, it unwinds as any error at import does (the import system takes the module out
    # of sys.modules and releases its lock); held, a Ctrl-C waited out a slow --trainer import. Other
    # imports (a library's, whose code may swallow it) still hold it until they end.
    from aspc import interrupt

    (tmp_path / "probe_frame_mod.py").write_text(
        "import sys\n"
        "from aspc import interrupt\n"
        "frame = sys._getframe()\n"
        "CHAIN = []\n"
        "while frame is not None:\n"
        "    CHAIN.append(frame.f_code.co_filename)\n"
        "    frame = frame.f_back\n"
        "HELD = interrupt._in_finalizer(sys._getframe())\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "probe_frame_mod", raising=False)
    with interrupt.raising_in_imports() if raising else contextlib.nullcontext():
        mod = importlib.import_module("probe_frame_mod")
    assert "<frozen importlib._bootstrap>" in mod.CHAIN  # the import system is below the module's code
    assert mod.HELD is not raising


def test_an_interrupt_after_the_output_is_in_place_says_so(tmp_path):
    from aspc import interrupt

    with interrupt.handlers():
        assert interrupt.outcome() == "nothing was written"
        atomic_write_bytes(tmp_path / "out.bin", b"x")
        assert interrupt.outcome() == f"{tmp_path / 'out.bin'} had already been written in full"
    with interrupt.handlers():
        assert interrupt.outcome() == "nothing was written"  # per command
    with interrupt.handlers():
        # A run log compacts its parts: one written whole and since removed was still listed.
        atomic_write_bytes(tmp_path / "part-0", b"x")
        atomic_write_bytes(tmp_path / "part-1", b"x")
        (tmp_path / "part-0").unlink()
        assert interrupt.outcome() == f"{tmp_path / 'part-1'} had already been written in full"


def test_a_signal_during_teardown_keeps_the_commands_exit_code(tmp_path):
    # After the command: an atexit hook registered later than the CLI's waits
    # for a SIGTERM; the process must end with the command's code, not 143.
    code = (
        "import atexit, os, signal, sys, time\n"
        "from aspc.cli import main\n"
        "sys.argv = ['aspc', 'check', sys.argv[1]]\n"
        "def late():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.5)\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    atexit.register(late)\n"
    )
    plan = tmp_path / "p.parquet"
    src = write_jsonl(tmp_path / "x.jsonl", lognormal_records(60))
    from click.testing import CliRunner

    from aspc.cli import main as cli_main

    assert CliRunner().invoke(cli_main, ["compile", str(src), "--length-field", "lengths", "-o", str(plan), "-q"]).exit_code == 0
    r = subprocess.run([sys.executable, "-c", code, str(plan)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr


def _previous_dir(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out) as d:
        (d / "a.txt").write_text("earlier")
    return out


def test_a_signal_between_the_directory_swaps_keeps_an_output_in_place(tmp_path, monkeypatch):
    # SIGTERM after the earlier output was moved aside and before the new one took its place left
    # only '.out.old-PID': the user's report or predictor gone, and "nothing was written" said.
    from aspc.errors import Interrupted
    from aspc.interrupt import handlers

    out = _previous_dir(tmp_path)
    real = os.replace

    def aside_then_signal(src, dst):
        real(src, dst)
        if str(dst).endswith(f".out.old-{os.getpid()}"):
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(os, "replace", aside_then_signal)
    with handlers(), pytest.raises(Interrupted):
        with atomic_dir(out) as d:
            (d / "a.txt").write_text("new")
    assert (out / "a.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_directory_another_writer_put_in_place_meanwhile_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    # The second rename met the other writer's directory: ENOTEMPTY, a traceback and '.out.old-PID' left.
    from aspc.errors import OutputError

    out = _previous_dir(tmp_path)
    real = os.replace

    def other_writer_first(src, dst):
        if str(src).endswith(".tmp") and str(dst) == str(out):
            out.mkdir()
            (out / "a.txt").write_text("theirs")
        real(src, dst)

    monkeypatch.setattr(os, "replace", other_writer_first)
    with pytest.raises(OutputError, match="written by another process at the same time"):
        with atomic_dir(out) as d:
            (d / "a.txt").write_text("ours")
    assert (out / "a.txt").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_earlier_output_a_killed_writer_left_aside_is_swept(tmp_path):
    from aspc.atomic import remove_stale_temps

    out = _previous_dir(tmp_path)
    left = tmp_path / ".out.old-999999999"  # no such process
    left.mkdir()
    mine = tmp_path / f".out.old-{os.getpid()}"
    mine.mkdir()
    assert remove_stale_temps(out) == [left]
    assert mine.exists()


def test_sighup_is_an_interrupt_unless_nohup_ignores_it(tmp_path):
    # A closed terminal ended a command silently, its temporaries left and a run log still 'running'.
    from aspc import interrupt
    from aspc.errors import Interrupted

    # A terminal's default, whatever this test process inherited (under nohup it starts ignored).
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        with interrupt.handlers(), pytest.raises(Interrupted) as info:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(1)
        assert info.value.signum == signal.SIGHUP and info.value.exit_code == 129
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
        with interrupt.handlers():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # ignored: the command goes on
            time.sleep(0.1)
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_file_size_limit_is_not_called_a_full_disk(tmp_path):
    # ulimit -f gave "no space left on the device ...; free space", with gigabytes free.
    import resource

    src = write_jsonl(tmp_path / "x.jsonl", lognormal_records(2000))

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (20 * 1024, resource.RLIM_INFINITY))

    out = tmp_path / "p.parquet"
    # Without the JIT: on a clean clone Numba's first compile writes its cache under the same limit.
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    r = subprocess.run([sys.executable, "-m", "aspc.cli", "compile", str(src), "--length-field", "lengths", "-o",
                        str(out), "-q"], capture_output=True, text=True, preexec_fn=limit, timeout=300, env=env)  # fmt: skip
    assert r.returncode == 2 and "file-size limit (ulimit -f)" in r.stderr and "no space" not in r.stderr, r.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["x.jsonl"]


def test_a_numba_cache_under_a_file_size_limit_is_one_line(tmp_path):
    # Numba's first compile saves each kernel to its cache: under ulimit -f it raised
    # "OSError: [Errno 27] File too large" from numba's caching module, as a traceback.
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 * 1024, resource.RLIM_INFINITY))

    out, cache = tmp_path / "p.parquet", tmp_path / "cache"  # an empty cache: every kernel compiles and is saved
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "NUMBA_DISABLE_JIT": "0"}
    src = Path(__file__).resolve().parents[1] / "examples" / "prompts.jsonl"
    r = subprocess.run([sys.executable, "-m", "aspc.cli", "compile", str(src), "-o", str(out), "-q"],
                       capture_output=True, text=True, preexec_fn=limit, timeout=300, env=env)  # fmt: skip
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "Numba could not save a compiled kernel to its cache" in lines[0] and "ulimit -f" in lines[0], r.stderr
    assert not out.exists()


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_an_output_named_near_the_limit_is_written(tmp_path, kind):
    # The temporary added ~30 bytes to the name: "File name too long", naming aspc's temporary.
    from aspc.atomic import remove_stale_temps

    out = tmp_path / ("é" * 120 + "b" * 10)  # 250 bytes: a valid name
    if kind == "file":
        atomic_write_bytes(out, b"x")
    else:
        with atomic_dir(out) as d:
            (d / "a").write_text("x")
        with atomic_dir(out) as d:  # replaced: the earlier one moved aside under a short name too
            (d / "a").write_text("y")
    assert [p.name for p in tmp_path.iterdir()] == [out.name]
    from aspc.atomic import _stem

    left = tmp_path / f".{_stem(out)}.999999999.abc.tmp"  # a dead writer's temporary of this output
    left.write_text("")
    assert len(left.name.encode()) <= 255 and remove_stale_temps(out) == [left]
