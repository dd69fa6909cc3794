"""Hunt 27: ``aspc run --resume`` after a SIGKILL at chosen moments, in the run modes (sim backend).

Each test kills a real ``aspc run`` process at a reproducible point (polling the log directory) and
checks what the README promises of the ``--resume`` that follows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aspc.runtime.engines.virtual import TEST_DELAY_ENV

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "prompts.jsonl"


def _inputs(tmp_path: Path, n: int = 60, samples: int = 4, batch: int = 8) -> tuple[Path, Path]:
    """The first ``n`` prompts of the example file, and a plan of them."""
    data = tmp_path / "in.jsonl"
    with open(EXAMPLE, encoding="utf-8") as fh:
        data.write_text("".join(fh.readline() for _ in range(n)), encoding="utf-8")
    plan = tmp_path / "plan.parquet"
    r = subprocess.run([sys.executable, "-m", "aspc.cli", "compile", str(data), "-n", str(samples), "-b", str(batch),
                        "-o", str(plan), "-q"], cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return data, plan


def _args(plan: Path, data: Path, log: Path, *extra: str) -> list[str]:
    return ["run", str(plan), "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "4",
            "--global-batch", "32", "--log", str(log), "--log-flush-seconds", "0.02", "--quiet", *extra]  # fmt: skip


def _spawn(args: list[str], delay: float | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    if delay:
        env[TEST_DELAY_ENV] = str(delay)
    return subprocess.Popen([sys.executable, "-m", "aspc.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aspc.cli", *args], cwd=ROOT, capture_output=True, text=True)


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 60.0) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` holds (it must not have finished first)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if ready():
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before the kill point: the test would prove nothing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _status(meta: Path) -> str | None:
    try:
        return json.loads(meta.read_text()).get("status")
    except (OSError, ValueError):
        return None


# ---- a kill during the length scout: the resume takes other options -------------------------------------


@pytest.mark.parametrize("change", ["drop-keep", "global-batch"])
def test_resume_during_the_scout_refuses_other_options(tmp_path, change):
    """README, Reliability: "**Resume** refuses another plan or configuration"; README, Strategies
    (--scout-keep): "`--resume` (also after SIGKILL) ages out again exactly what the log shows and refuses
    another keep setting".

    ``aspc run PLAN --scout --scout-keep --log RUN`` SIGKILLed while its scout runs (``RUN/scout/meta.json``
    says running, no ``RUN/epoch-1/`` yet), then ``--resume`` without ``--scout-keep`` (or with another
    ``--global-batch``): the resume is accepted (exit 0) and runs epoch 1 under the new options, since the
    scout's log records neither (its global batch is the scout's own, larger than the scout).
    """
    data, plan = _inputs(tmp_path)
    log = tmp_path / "RUN"
    args = _args(plan, data, log, "--scout", "--scout-keep")
    p = _spawn(args, delay=0.3)  # the scout's few minibatches take seconds: killed inside it
    _kill_when(p, lambda: _status(log / "scout" / "meta.json") == "running")
    assert not (log / "epoch-1").exists()
    if change == "drop-keep":
        other = [a for a in args if a != "--scout-keep"]
    else:
        other = list(args)
        other[other.index("--global-batch") + 1] = "16"
    r = _run([*other, "--resume"])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("Error: "), (r.returncode, r.stderr)


def test_resume_of_a_complete_log_tidies_what_a_kill_before_its_clean_up_left(tmp_path):
    # The hunt's minor finding: killed between the final commit and its clean-up, a complete log kept an
    # empty consumed/ folder, and --resume of it (which tidies a complete log) did not remove it.
    data, plan = _inputs(tmp_path)
    log = tmp_path / "RUN"
    assert _run(_args(plan, data, log)).returncode == 0
    (log / "consumed").mkdir()  # what the kill left
    r = _run([*_args(plan, data, log), "--resume"])
    assert r.returncode == 0, r.stderr
    assert not (log / "consumed").exists()
