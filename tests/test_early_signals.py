"""A signal while the command line is still importing: one line and 128 + signal, never a traceback."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The console script's own two lines, with a signal sent to the process the moment the
# command line imports click: before aspc.cli's handlers exist.
_SCRIPT = """
import os, sys
class SendOnClick:
    def find_spec(self, name, path=None, target=None):
        if name == "click":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), {signum})
        return None
sys.meta_path.insert(0, SendOnClick())
sys.argv = ["aspc", "--version"]
from {module} import main
sys.exit(main())
"""


def _run(module: str, signum: int) -> subprocess.CompletedProcess:
    code = _SCRIPT.format(signum=int(signum), module=module)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          start_new_session=True)  # fmt: skip


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_the_command_line_imports_is_one_line(signum):
    r = _run("aspc.entry", signum)
    assert r.returncode == 128 + signum, r.stderr
    assert r.stderr == f"Error: interrupted by {signal.Signals(signum).name}; nothing was written\n"
    assert r.stdout == ""


def test_without_the_entry_module_the_same_signal_is_a_traceback():
    # What the console script did before: the test above can fail.
    r = _run("aspc.cli", signal.SIGINT)
    assert "KeyboardInterrupt" in r.stderr and "Traceback" in r.stderr


def test_the_console_script_is_the_entry_module():
    text = (ROOT / "pyproject.toml").read_text()
    scripts = text.split("[project.scripts]", 1)[1].split("[", 1)[0]
    assert re.search(r'^aspc = "aspc\.entry:main"$', scripts, re.M), scripts


def test_under_nohup_an_early_sighup_stays_ignored():
    code = _SCRIPT.format(signum=int(signal.SIGHUP), module="aspc.entry")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))  # fmt: skip
    assert r.returncode == 0 and "aspc" in r.stdout and r.stderr == "", r.stderr
