"""A ``kill -9`` of an ``aspc run --engine ray`` that started Ray itself leaves no process of its cluster behind.

Ray's fate-sharing kills the driver's children (GCS server, raylet, ...) with
it, but the raylet's DashboardAgent and RuntimeEnvAgent outlived it by a
minute, re-parented to init, waiting on a report to the dead GCS
(aspc/runtime/engines/ray_reaper.py says why). The run is a process of its
own that starts its own Ray, as an operator's would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import write_jsonl
from tests.realmodel import tiny_model

pytest.importorskip("ray", reason="needs ray: pip install 'aspc[ray]'")
pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[hf]'")
psutil = pytest.importorskip("psutil")

# Well under the minute the agents waited: the cluster's processes end within seconds of the driver.
GONE_WITHIN_S = 20.0


def _tree(pid: int) -> dict[int, tuple[float, str]]:
    """pid -> (create time, command line) of every descendant of ``pid`` now."""
    out = {}
    for p in psutil.Process(pid).children(recursive=True):
        try:
            out[p.pid] = (p.create_time(), " ".join(p.cmdline()))
        except psutil.Error:  # ended meanwhile
            continue
    return out


def _alive(pid: int, created: float) -> bool:
    """Whether the process seen as ``pid`` (created at ``created``) still runs (a zombie has ended)."""
    try:
        p = psutil.Process(pid)
        return p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Ray fate-shares its processes on Linux only")
def test_kill_9_of_the_driver_leaves_no_process_of_its_ray_cluster(tmp_path):
    rng = np.random.default_rng(3)
    data = write_jsonl(tmp_path / "in.jsonl", [
        {"id": f"q{i:02d}", "prompt": f"question {i}: " + "x" * int(rng.integers(1, 12)),
         "lengths": [int(x) for x in rng.integers(0, 90, size=6)]} for i in range(48)
    ])  # fmt: skip
    model = tiny_model(tmp_path)
    aspc = [sys.executable, "-m", "aspc.cli"]
    plan = tmp_path / "plan.parquet"
    subprocess.run([*aspc, "compile", str(data), "--length-field", "lengths", "--samples-per-prompt", "6",
                    "--batch-size", "4", "-o", str(plan), "-q"], check=True)  # fmt: skip
    log = tmp_path / "RUN"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)  # aspc starts Ray itself
    p = subprocess.Popen(
        [*aspc, "run", str(plan), "--backend", "hf", "--engine", "ray", "--model", str(model), "--max-new-tokens",
         "256", "--workers", "2", "--global-batch", "8", "--log", str(log), "-q"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    seen: dict[int, tuple[float, str]] = {}
    try:
        deadline = time.monotonic() + 240
        while p.poll() is None and time.monotonic() < deadline and not (log / "meta.json").exists():
            time.sleep(0.1)
        time.sleep(2)  # the actors generate: every process of the cluster is up
        assert p.poll() is None, "the run ended before the kill: " + p.stderr.read()[-2000:]
        seen = _tree(p.pid)
        names = " ".join(cmd for _, cmd in seen.values())
        assert "raylet" in names and "ray::DashboardAgent" in names and "ray::RuntimeEnvAgent" in names, names
        p.kill()
        p.wait()
        deadline = time.monotonic() + GONE_WITHIN_S
        while (left := {pid: cmd for pid, (t, cmd) in seen.items() if _alive(pid, t)}) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == {}, f"alive {GONE_WITHIN_S:g} s after the driver's kill -9: {left}"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for pid, (t, _) in seen.items():  # a failed test leaves nothing it started running
            if _alive(pid, t):
                os.kill(pid, signal.SIGKILL)
