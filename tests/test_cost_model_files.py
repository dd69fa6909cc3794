"""Simulator cost-model files (``--cost-model``) and the commands that read them.

Each test once failed: a cost-model file read by `run`, `simulate` or `probe`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import invoke_cli, lognormal_records, write_jsonl

ASPC = [sys.executable, "-c", "from aspc.cli import main; main()"]


@pytest.fixture
def small_plan(tmp_path: Path) -> tuple[Path, Path]:
    data = write_jsonl(tmp_path / "d.jsonl", lognormal_records(60))
    plan = tmp_path / "p.parquet"
    r = invoke_cli("compile", data, "--length-field", "lengths", "-o", plan, "-q")
    assert r.exit_code == 0, r.output
    return data, plan


@pytest.mark.parametrize("value", [1000001, 1000000.5])
def test_a_coefficient_over_the_bound_is_named_by_a_value_over_the_bound(tmp_path, small_plan, value):
    _, plan = small_plan
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"decode_base": value}))
    r = invoke_cli("run", plan, "--cost-model", cost, "--json", "-q")
    assert r.exit_code == 2, r.output
    m = re.search(r"must be <= 1e\+06 seconds, got ([^;\s]+)", r.output)
    assert m, r.output
    # The value shown must be the one in the file (or at least visibly over the bound), not "1e+06".
    assert float(m.group(1)) > 1e6, r.output


def test_a_fifo_cost_model_is_refused_as_not_a_regular_file(tmp_path, small_plan):
    _, plan = small_plan
    fifo = tmp_path / "cost.json"
    os.mkfifo(fifo)
    done = threading.Event()

    def writer() -> None:  # feeds the FIFO if (and only if) aspc opens it for reading; never blocks
        deadline = time.monotonic() + 30
        while not done.is_set() and time.monotonic() < deadline:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader yet
                time.sleep(0.02)
                continue
            os.write(fd, b"{}")
            os.close(fd)
            return

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        r = invoke_cli("run", plan, "--cost-model", fifo, "--json", "-q")
    finally:
        done.set()
        t.join(5)
    # As `aspc simulate f.jsonl` says for a FIFO dataset: one line, exit 2, no run.
    assert r.exit_code == 2, r.output
    assert "not a regular file" in r.output, r.output


def test_probe_overwrite_keeps_a_cost_model_inside_the_log(tmp_path, small_plan):
    data, plan = small_plan
    big = write_jsonl(tmp_path / "d200.jsonl", lognormal_records(200))
    log = tmp_path / "LOG"
    r = invoke_cli("run", plan, "--log", log, "--json", "-q")  # an earlier run log, which --overwrite may replace
    assert r.exit_code == 0, r.output
    cost = log / "cost.json"
    cost.write_text(json.dumps({"decode_base": 0.02}) + "\n")
    digest = hashlib.sha256(cost.read_bytes()).hexdigest()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [*ASPC, "probe", str(big), "--backend", "sim", "--actual-lengths", str(big), "--length-field", "lengths",
         "--prompts", "50", "--kind", "static", "--init", "none", "--log", str(log), "-o", str(tmp_path / "pred"),
         "--cost-model", str(cost), "--overwrite", "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 40
        while proc.poll() is None and cost.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if proc.poll() is None:  # the input is already gone (or it hangs): the rest of the probe proves nothing
            proc.terminate()
        _, err = proc.communicate(timeout=30)
    # As `aspc run --log DIR --overwrite --cost-model DIR/cost.json`: refused, the input kept.
    assert cost.is_file() and hashlib.sha256(cost.read_bytes()).hexdigest() == digest, err
    assert proc.returncode == 2 and "cost.json" in err, err


def test_probe_reads_its_predictor_and_a_cost_model_beside_it(tmp_path):
    # The cost model joined the paths checked against -o and --log; the predictor was read as the last of them,
    # so `aspc probe --cost-model FILE` loaded FILE as the predictor: "cost.json: not a directory".
    big = write_jsonl(tmp_path / "d200.jsonl", lognormal_records(200))
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"decode_base": 0.02}) + "\n")
    r = invoke_cli("probe", big, "--backend", "sim", "--actual-lengths", big, "--length-field", "lengths",
                   "--prompts", "50", "--kind", "lexical", "--init", "none", "--log", tmp_path / "LOG",
                   "-o", tmp_path / "pred", "--cost-model", cost, "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "LOG" / "meta.json").read_text())["cost_model"]["decode_base"] == 0.02
