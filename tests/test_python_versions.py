"""``requires-python = ">=3.10"`` holds for the code as written.

This machine and CI run one Python (3.11); nothing else would notice a
3.11-only name (``tomllib``, ``datetime.UTC``, ``typing.Self``, an
``except*``) until a user on 3.10 hits an ImportError or a SyntaxError.
vermin reads the source (no import) and knows which version each syntax
form and standard-library name needs.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("aspc", "tests", "benchmarks", "scripts", "examples")


def _vermin(*paths: str | Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("vermin", reason="vermin is a dev extra (make install)")
    # vermin has no __main__; its script sits beside this interpreter in the venv.
    cmd = [str(Path(sys.executable).with_name("vermin")), "--no-tips", "--violations", "--eval-annotations", "-t=3.10-"]
    return subprocess.run([*cmd, *map(str, paths)], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_requires_python_is_what_the_tests_check():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^requires-python = ">=3\.10"$', text, re.M), "update -t in _vermin and the Makefile's lint"


def test_the_source_runs_on_python_3_10():
    done = _vermin(*(ROOT / f for f in FOLDERS if (ROOT / f).is_dir()))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_check_sees_a_3_11_name(tmp_path):
    # The check must be able to fail: a module that needs 3.11.
    (tmp_path / "new.py").write_text("import tomllib\n")
    done = _vermin(tmp_path / "new.py")
    assert done.returncode != 0
    assert "tomllib" in done.stdout
