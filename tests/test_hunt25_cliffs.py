"""Performance cliffs on modest inputs: legal option values whose cost is out of proportion.

Each case runs the CLI in a subprocess under a wall-clock bound; running past the bound is the
failure (the buggy behaviour), so every test here stays bounded while the bug is there and fast
(< 15 s) once it is fixed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "prompts.jsonl"


def _aspc(args: list[str], timeout: float, cwd: Path) -> subprocess.CompletedProcess[str] | None:
    """Run ``aspc ARGS``; None when it ran past ``timeout`` seconds (killed)."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "aspc.cli", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None


def _write_prompts(path: Path, n: int, field: str, lengths) -> None:
    """``n`` rows of id, a short prompt and ``field`` (a length or a list of them) as Parquet."""
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(n)], "prompt": [f"q{i}" for i in range(n)], field: lengths}),
                   path)  # fmt: skip


def _finished_in_time(args: list[str], timeout: float, cwd: Path) -> None:
    res = _aspc(args, timeout, cwd)
    assert res is not None, f"aspc {' '.join(args)} ran past {timeout} s"
    assert res.returncode == 0, res.stderr[-2000:]


# Was: `aspc simulate examples/prompts.jsonl ... --global-batch 1099511627776` (2**40, the guard's maximum) ran
# for hours: left_over_note scanned range(global_batch - 1, 0, -1) in Python for a divisor of the plans' sizes.
def test_simulate_huge_global_batch_left_over_note_is_fast(tmp_path: Path) -> None:
    _finished_in_time(
        ["simulate", str(EXAMPLE), "--length-field", "lengths", "--strategies", "random", "-q",
         "--global-batch", str(2**40)],
        timeout=20,
        cwd=tmp_path,
    )


# Was: `aspc report PLAN RUN -o rep` of a sim run with -w 65536 on 12,000 one-prompt minibatches took ~31 s (5 s at
# -w 8): fig_worker_timeline drew one broken_barh per worker, each re-autoscaling over all drawn so far.
@pytest.mark.skipif(__import__("importlib").util.find_spec("matplotlib") is None, reason="report needs matplotlib")
def test_report_worker_timeline_many_workers_is_fast(tmp_path: Path) -> None:
    n = 12_000
    _write_prompts(tmp_path / "in.parquet", n, "length", np.random.default_rng(0).lognormal(6, 1, n).astype(np.int64) + 1)
    _finished_in_time(
        ["compile", "in.parquet", "--length-field", "length", "-b", "1", "--slack", "0", "-o", "plan.parquet",
         "-q"],
        timeout=60,
        cwd=tmp_path,
    )
    _finished_in_time(["run", "plan.parquet", "-w", "65536", "--log", "RUN", "-q"], timeout=60, cwd=tmp_path)
    _finished_in_time(["report", "plan.parquet", "RUN", "-o", "rep", "-q"], timeout=20, cwd=tmp_path)


def test_rolling_scout_many_windows_is_fast(tmp_path: Path) -> None:
    # 1,000 one-prompt windows took 50-70 s: the run's plan held a chunk per window, so every
    # revision's slices and lookups cost in proportion to the windows (now ~8 s alone, 1.9 s at 8 windows).
    n, rng = 1000, np.random.default_rng(0)
    _write_prompts(tmp_path / "in.parquet", n, "lengths", [list(map(int, rng.lognormal(6, 1, 8).astype(np.int64) + 1))
                                                          for _ in range(n)])  # fmt: skip
    _finished_in_time(
        ["simulate", "in.parquet", "--length-field", "lengths", "-n", "4", "--max-new-tokens", "4096", "-q",
         "--strategies", "asp+scout+roll", "--scout-windows", "1000"],
        timeout=45,  # 8 s alone on 2 cores, 20 s beside two other busy processes; 50-70 s alone before
        cwd=tmp_path,
    )
