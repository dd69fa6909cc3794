"""SIGKILL during each kind of write: the target is absent or whole and valid.

Plans (tests/test_atomic.py) and run logs (tests/test_runtime_resume.py) have
their own kill tests; these cover predictor directories and reports.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE

ROOT = Path(__file__).resolve().parents[1]


def _kill_after(args: list[str], delay: float) -> int | None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "aspc.cli", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return None


def _only_hidden_leftovers(parent: Path, keep: set[str]) -> None:
    for p in parent.iterdir():
        assert p.name in keep or p.name.startswith("."), f"partial output {p.name} left behind"


@pytest.mark.parametrize("delay", [1.0, 2.5, 4.0])
def test_sigkill_during_predictor_training(tmp_path, delay):
    from aspc.predict import load_predictor

    out = tmp_path / "pred"
    rc = _kill_after(["predict", "train", str(EXAMPLE), "--length-field", "lengths", "--kind", "lexical",
                      "-o", str(out), "-q"], delay)
    if out.exists():
        pred = load_predictor(out)
        assert pred.predict(["write a long essay about the sea"]).mean.shape == (1,)
    else:
        assert rc is None, "training finished but wrote no predictor"
    _only_hidden_leftovers(tmp_path, {"pred"})


@pytest.fixture(scope="module")
def plan_and_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("rep")
    plan, run = d / "plan.parquet", d / "RUN"
    base = [sys.executable, "-m", "aspc.cli"]
    subprocess.run([*base, "compile", str(EXAMPLE), "--length-field", "lengths", "-o", str(plan), "-q"], check=True)
    subprocess.run([*base, "run", str(plan), "--actual-lengths", str(EXAMPLE), "--length-field", "lengths",
                    "--log", str(run), "-q"], check=True, stdout=subprocess.DEVNULL)
    return plan, run


@pytest.mark.parametrize("delay", [1.5, 3.0, 5.0])
def test_sigkill_during_report(tmp_path, plan_and_run, delay):
    pytest.importorskip("matplotlib", reason="needs matplotlib: pip install 'aspc[report]'")
    plan, run = plan_and_run
    out = tmp_path / "report"
    rc = _kill_after(["report", str(plan), str(run), "-o", str(out), "-q"], delay)
    if out.exists():
        html = (out / "index.html").read_text()
        pngs = set(re.findall(r'src="([^"]+\.png)"', html))
        assert len(pngs) >= 4 and all((out / p).stat().st_size > 0 for p in pngs)
    else:
        assert rc is None, "report finished but wrote nothing"
    _only_hidden_leftovers(tmp_path, {"report"})
