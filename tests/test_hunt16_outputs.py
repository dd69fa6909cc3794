"""A hunt of signals, streams and names around outputs: each case failed before its fix."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import weakref

import pytest

from aspc import interrupt
from aspc.errors import Interrupted
from tests.conftest import EXAMPLE, ROOT, invoke_cli, one_line_error

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib (the 'report' extra) is not installed"
)
BAD = "\udcfe"  # the byte 0xfe in a file name, as Python spells it (surrogateescape)


def test_a_signal_right_after_the_rename_names_the_replaced_output(tmp_path, monkeypatch):
    # It said "nothing was written" of a file it had just replaced (the record came after the rename).
    from aspc import atomic

    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    real = os.replace

    def replace_then_signal(src, dst):
        real(src, dst)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(atomic.os, "replace", replace_then_signal)
    with interrupt.handlers(), pytest.raises(Interrupted):
        atomic.atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert str(target) in interrupt.outcome() and "nothing was written" not in interrupt.outcome()


def test_a_signal_in_a_weakref_callback_is_sent_again_not_dropped():
    # Raised in WeakKeyDictionary's remove callback, Python printed "Exception ignored" and the command exited 0.
    assert interrupt._in_finalizer(_weakref_frame())
    assert not interrupt._in_finalizer(sys._getframe())


def _weakref_frame():
    class Key:
        pass

    k = Key()
    d = weakref.WeakKeyDictionary({k: 1})
    items = d.items()
    next(items)  # suspended inside weakref.py, as a callback's frame runs its code
    return items.gi_frame


def test_the_error_line_holds_a_second_signal_and_is_written_whole(capsys):
    # A second Ctrl-C while the first one's line was written cut it: the run ended with no message at all.
    class Stream:
        def __init__(self):
            self.text = ""

        def write(self, s):
            os.kill(os.getpid(), signal.SIGINT)  # lands while the line is written
            self.text += s

        def flush(self):
            pass

    from aspc.cli.error_line import error_line

    stream = Stream()
    with interrupt.handlers():
        sys_stderr, sys.stderr = sys.stderr, stream
        try:
            error_line("Error: interrupted by SIGINT; nothing was written")
        finally:
            sys.stderr = sys_stderr
    assert stream.text == "Error: interrupted by SIGINT; nothing was written\n"


def test_a_closed_stderr_keeps_the_error_off_stdout_and_a_full_one_keeps_the_exit_code(tmp_path):
    # With 2>&- the line went to stdout (breaking --json); with 2>/dev/full the exit code became 1,
    # which `aspc check` gives a violated bound.
    missing = str(tmp_path / "nope.parquet")
    closed = subprocess.run([sys.executable, "-m", "aspc.cli", "check", missing, "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120,
                            pass_fds=(), close_fds=True, preexec_fn=lambda: os.close(2))  # fmt: skip
    assert closed.returncode == 2 and closed.stdout == b""
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, "-m", "aspc.cli", "check", missing], stdout=subprocess.PIPE,
                                  stderr=full, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)  # fmt: skip
        assert done.returncode == 2


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["predict", "default", str(EXAMPLE), "-o", "{tmp}/x.jsonl"],
         "the predictions table is Parquet, not .jsonl data; name it .parquet, e.g. -o {tmp}/x.parquet"),
        (["calibrate", "{run}", "-o", "{tmp}/y.parquet"],
         "a cost model is JSON, not .parquet data; name it .json, e.g. -o {tmp}/y.json"),
    ],
)
def test_an_output_named_as_another_format_is_refused(tmp_path, args, words):
    # predict wrote Parquet bytes into x.jsonl; calibrate wrote JSON into y.parquet.
    run = tmp_path / "RUN"
    if "{run}" in args:
        plan = tmp_path / "p.parquet"
        assert invoke_cli("compile", EXAMPLE, "--length-field", "lengths", "-o", plan, "-q").exit_code == 0
        assert invoke_cli("run", plan, "--log", run, "-q").exit_code == 0
    args = [a.format(tmp=tmp_path, run=run) for a in args]
    r = invoke_cli(*args)
    assert one_line_error(r, 2) == "Error: -o " + args[-1] + ": " + words.format(tmp=tmp_path)
    assert not os.path.exists(args[-1])


@needs_matplotlib
def test_a_report_of_a_plan_or_run_named_with_bytes_that_are_not_utf8(tmp_path):
    # The names went into the UTF-8 page and matplotlib's labels: a traceback (surrogates not allowed).
    import shutil

    plan = tmp_path / f"p{BAD}.parquet"
    assert invoke_cli("compile", EXAMPLE, "--length-field", "lengths", "-o", plan, "-q").exit_code == 0
    run = tmp_path / f"R{BAD}"
    assert invoke_cli("run", plan, "--log", run, "-q").exit_code == 0
    shutil.copytree(run, tmp_path / "R2")
    r = invoke_cli("report", plan, run, "-o", tmp_path / "rep", "-q")
    assert r.exit_code == 0, r.output
    page = (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")
    assert "p\ufffd.parquet" in page and "R\ufffd" in page


def test_a_signal_while_the_main_thread_holds_the_policy_lock_does_not_deadlock():
    # The handler takes the lock deferred() holds; run between two bytecodes inside it, a plain Lock hung for ever.
    code = (
        "import os, signal\n"
        "from aspc import interrupt\n"
        "from aspc.errors import Interrupted\n"
        "with interrupt.handlers():\n"
        "    try:\n"
        "        with interrupt._lock:\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n"
        "            for _ in range(100000):\n"
        "                pass\n"
        "    except Interrupted:\n"
        "        print('interrupted')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the signal handler deadlocked on the policy lock")
    assert done.stdout.strip() == "interrupted", done.stderr[-2000:]
