"""Commands that read a plan never import pandas.

pyarrow imports pandas (0.3-0.5 s, holding the GIL) on pyarrow.dataset, to_numpy, pa.array,
pa.scalar, a Python value handed to a compute kernel, Table.join and group_by. check, inspect,
run, --resume and export --format jsonl read plans and run logs without any of them (report
groups samples with group_by: it draws with matplotlib, and may).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "prompts.jsonl"

# Runs the CLI, then says on stderr whether pandas was imported (atexit: click's main exits).
_PROBE = """
import atexit, sys
atexit.register(lambda: print("PANDAS_IMPORTED" if "pandas" in sys.modules else "NO_PANDAS", file=sys.stderr))
sys.argv = ["aspc", *sys.argv[1:]]
from aspc.cli import main
main()
"""


def _imports_pandas(args: list[str], cwd: Path) -> bool:
    p = subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "NO_PANDAS" in p.stderr or "PANDAS_IMPORTED" in p.stderr, p.stderr[-2000:]
    return "PANDAS_IMPORTED" in p.stderr


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("nopandas")
    shutil.copy(EXAMPLE, d / "prompts.jsonl")
    r = subprocess.run([sys.executable, "-m", "aspc.cli", "compile", "prompts.jsonl", "-n", "4", "-o", "plan.parquet",
                        "-q"], cwd=d, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return d


LENGTHS = ["--actual-lengths", "prompts.jsonl", "--length-field", "lengths", "-q"]


@pytest.mark.parametrize(
    "args",
    [
        ["check", "plan.parquet"],
        ["check", "plan.parquet", "--json"],
        ["inspect", "plan.parquet"],
        ["inspect", "plan.parquet", "--json"],
        ["run", "plan.parquet", *LENGTHS, "--log", "RUN"],
        ["run", "plan.parquet", *LENGTHS, "--log", "REPLAN", "--replan"],
        ["run", "plan.parquet", *LENGTHS, "--log", "EPOCHS", "--epochs", "2"],
        ["export", "plan.parquet", "--format", "jsonl", "-o", "train.jsonl", "--source", "prompts.jsonl"],
    ],
    ids=lambda a: "-".join(x for x in a if x.isalnum() and x not in ("plan", "q"))[:40],
)
def test_plan_command_does_not_import_pandas(work, args):
    assert not _imports_pandas(args, work), f"aspc {' '.join(args)} imported pandas"


def test_report_and_resume_read_run_logs_without_pandas(work):
    # A run log of several parts (flushed often) with consumed rows: what report and --resume read.
    run = ["run", "plan.parquet", *LENGTHS, "--workers", "3", "--global-batch", "12", "--log-flush-seconds", "0"]
    assert not _imports_pandas([*run, "--log", "PARTS"], work)
    if importlib.util.find_spec("matplotlib") is not None:  # report needs it (pip install 'aspc[report]')
        _imports_pandas(["report", "plan.parquet", "PARTS", "-o", "report", "-q"], work)  # it reads the parts too
        assert (work / "report" / "index.html").is_file()
    assert not _imports_pandas([*run, "--log", "PARTS", "--resume"], work)


def test_run_log_reads_join_consumed_rows_without_pandas(work):
    # A log whose run did not finish keeps consumed parts live; reading it joins them to the samples.
    code = """
import sys
from aspc.runtime.record import runlog as R
import numpy as np
n = 4
cols = {"prompt_id": np.array(list("abcd"), dtype=object), "sample_index": np.zeros(n, int),
        "response_len": np.arange(n), "prompt_tokens": np.ones(n, int), "minibatch": np.zeros(n, int),
        "worker": np.zeros(n, int), "weights_version": np.zeros(n, int), "finish_time": np.zeros(n),
        "decode_time": np.full(n, np.nan), "consumed_step": np.full(n, -1), "policy_lag": np.full(n, -1)}
s = R.to_table(R.SAMPLES, cols)
c = R.to_table(R.CONSUMED, {"prompt_id": np.array(["b"], dtype=object), "sample_index": np.zeros(1, int),
                            "consumed_step": np.array([2])})
out = R.to_columns(R.join_consumed(s, c))
assert out["consumed_step"].tolist() == [-1, 2, -1, -1] and out["policy_lag"].tolist() == [-1, 2, -1, -1]
print("pandas" in sys.modules)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


def test_parquet_parts_read_as_the_dataset_reads_them(tmp_path):
    # Same table, same chunks (a compacted log written back keeps its bytes), same schema and metadata.
    import contextlib

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from aspc.arrow_files import _read_dataset, arrow_file, read_parquet_parts

    def part(name: str, n: int, **kw) -> Path:
        t = pa.table({"a": np.arange(n, dtype=np.int32), "s": [str(i % 7) for i in range(n)]})
        pq.write_table(t, tmp_path / name, **kw)
        return tmp_path / name

    files = [part("big.parquet", 140_000), part("rg.parquet", 2500, row_group_size=1000), part("none.parquet", 0)]
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"a": np.arange(3, dtype=np.int64)}), other)
    schema = pa.schema([pa.field("a", pa.int32()), pa.field("s", pa.string())])
    for fs, columns, sch in [(files, None, None), (files, ["s"], None), (files[::-1], ["s", "a"], schema),
                             ([files[1], other], None, None)]:  # fmt: skip
        got = read_parquet_parts(fs, columns, sch)
        with contextlib.ExitStack() as stack:
            want = _read_dataset([stack.enter_context(arrow_file(f)) for f in fs], columns, sch)
        assert got.equals(want) and got.schema.equals(want.schema, check_metadata=True)
        assert [[len(c) for c in col.chunks] for col in got.columns] == [[len(c) for c in col.chunks] for col in want.columns]
