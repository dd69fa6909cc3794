"""Hostile environments: an address-space limit too small to load the libraries, out of memory, compressed inputs.

Out of memory is not a bad file: a plan, a dataset or a run log's payloads
that could not be read for want of memory must not be called truncated (the
advice was to compile the plan again, or to delete the payloads).
"""

from __future__ import annotations

import bz2
import gzip
import os
import resource
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aspc import address_space
from aspc.cli import main as cli
from aspc.errors import InputError

ASPC = str(Path(sys.executable).with_name("aspc"))
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "prompts.jsonl"


def _limited(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def test_an_address_space_too_small_is_refused_in_one_line_before_anything_hangs(tmp_path):
    # At 1 GiB the libraries' loading hung (OpenBLAS, SIGTERM ignored) or aborted (LLVM) with no aspc message.
    out = tmp_path / "plan.parquet"
    got = subprocess.run([ASPC, "compile", str(EXAMPLE), "--length-field", "lengths", "-o", str(out)],
                         preexec_fn=_limited(1 << 30), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert got.returncode == 2, got.stderr
    assert got.stderr.count("\n") == 1 and "Traceback" not in got.stderr
    assert got.stderr.startswith("Error: the address-space limit (ulimit -v) is 1,024 MiB; aspc needs at least 1,536")
    assert "ulimit -v unlimited" in got.stderr and not out.exists()
    # Help loads no numerical library: it still answers.
    helped = subprocess.run([ASPC, "compile", "--help"], preexec_fn=_limited(1 << 30), capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert helped.returncode == 0 and "Usage: aspc compile" in helped.stdout
    # `python -m aspc.cli` (the examples' and tests' launch) refuses the same way; the override lets a command try.
    module = subprocess.run([sys.executable, "-m", "aspc.cli", "compile", str(EXAMPLE), "-o", str(out)],
                            preexec_fn=_limited(1 << 30), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert module.returncode == 2 and module.stderr.startswith("Error: the address-space limit") and not out.exists()
    assert "ASPC_ADDRESS_SPACE_CHECK=0 to try anyway" in module.stderr
    tried = subprocess.run([ASPC, "compile", "--bogus"], preexec_fn=_limited(1 << 30), capture_output=True, text=True,
                           timeout=60, env={**os.environ, "ASPC_ADDRESS_SPACE_CHECK": "0"})  # fmt: skip
    assert tried.returncode == 2 and "No such option '--bogus'" in tried.stderr


def test_out_of_memory_names_the_address_space_limit_where_one_is_set(monkeypatch):
    monkeypatch.setattr(address_space, "address_space_limit", lambda: None)
    assert address_space.out_of_memory() == "out of memory; try a smaller input or batch"
    assert address_space.too_small() is None
    monkeypatch.setattr(address_space, "address_space_limit", lambda: 3 << 30)
    assert address_space.out_of_memory().startswith("out of memory under an address-space limit of 3,072 MiB")
    assert address_space.too_small() is None


class _NoMemory:
    """Stands in for pq.ParquetFile / pq.read_table: the read runs out of memory as pyarrow says it."""

    def __init__(self, *args, **kwargs):
        raise pa.ArrowMemoryError("malloc of size 359488 failed")


def test_a_plan_read_out_of_memory_is_not_called_truncated(tmp_path, monkeypatch):
    plan = tmp_path / "plan.parquet"
    assert CliRunner().invoke(cli, ["compile", str(EXAMPLE), "--length-field", "lengths", "-o", str(plan)]).exit_code == 0
    monkeypatch.setattr(pq, "ParquetFile", _NoMemory)
    monkeypatch.setattr(address_space, "address_space_limit", lambda: None)
    res = CliRunner().invoke(cli, ["check", str(plan)])
    assert res.exit_code == 2
    assert res.output.strip() == "Error: out of memory; try a smaller input or batch"


def test_a_dataset_read_out_of_memory_is_not_called_unreadable(tmp_path, monkeypatch):
    from aspc.io.bulk import read_parquet_bulk
    from aspc.io.readers import read_parquet_table

    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a"], "prompt": ["x"]}), src)
    monkeypatch.setattr(pq, "read_table", _NoMemory)
    with pytest.raises(MemoryError):
        read_parquet_table(src)
    # Nor does the bulk reader hand it to the row reader, which needs more memory, not less.
    monkeypatch.setattr(pq, "ParquetFile", _NoMemory)
    with pytest.raises(MemoryError):
        read_parquet_bulk(src, prompt_field="prompt", id_field="id", length_field=None)


def test_payloads_read_out_of_memory_are_not_offered_for_deletion(tmp_path, monkeypatch):
    from aspc.runtime.record import payloads

    class Work:
        prompt_ids = np.array(["a"])
        sample_row = np.array([0, 0])
        sample_index = np.array([0, 1])

    held = payloads.PendingPayloads()
    held.add(np.arange(2), [{"t": [0]}, {"t": [1]}])
    held.write(tmp_path, np.ones(2, dtype=bool), Work())
    assert payloads.read_payloads(tmp_path) == {("a", 0): {"t": [0]}, ("a", 1): {"t": [1]}}
    monkeypatch.setattr(pq, "read_table", _NoMemory)
    with pytest.raises(MemoryError):
        payloads.read_payloads(tmp_path)


@pytest.mark.parametrize(
    ("name", "compress", "said"),
    [
        ("in.jsonl", gzip.compress, "in.jsonl: a gzip-compressed file, not text; decompress it first"),
        ("in.csv", gzip.compress, "in.csv: a gzip-compressed file, not text; decompress it first"),
        ("in.json", lambda b: b"\x28\xb5\x2f\xfd" + b"\xff" * 8, "in.json: a zstd-compressed file, not text; decompress"),
        ("in.csv", bz2.compress, "in.csv: a bzip2-compressed file, not text; decompress it first"),
        ("in.csv", lambda b: _zipped(b), "in.csv: a zip-compressed file, not text; decompress it first (an Excel"),
        ("in.jsonl.gz", gzip.compress, "in.jsonl.gz: a gzip-compressed file; decompress it first and pass the .jsonl"),
    ],
)
def test_a_compressed_dataset_is_named_compressed(tmp_path, name, compress, said):
    src = tmp_path / name
    src.write_bytes(compress(EXAMPLE.read_bytes()))
    before = src.read_bytes()
    res = CliRunner().invoke(cli, ["compile", str(src), "-o", str(tmp_path / "plan.parquet")])
    assert res.exit_code == 2 and res.output.startswith(f"Error: {said}"), res.output
    assert res.output.count("\n") == 1 and not (tmp_path / "plan.parquet").exists() and src.read_bytes() == before


def test_text_that_begins_like_a_compressed_file_is_still_text(tmp_path):
    # "BZh" opens bzip2 files, and may open a CSV's header too: only bytes that are not text are called compressed.
    src = tmp_path / "in.csv"
    src.write_text("BZh,prompt\n1,hello\n2,world\n")
    res = CliRunner().invoke(cli, ["compile", str(src), "--id-field", "BZh", "-o", str(tmp_path / "plan.parquet")])
    assert res.exit_code == 0, res.output
    with pytest.raises(InputError, match="line 2: not valid UTF-8"):
        from aspc.io.readers import _decode

        _decode(b"BZh\n\xff", src)


def _zipped(data: bytes) -> bytes:
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("in.csv", data)
    return buf.getvalue()


def test_taking_distinct_rows_does_not_hash_the_ids_again(monkeypatch):
    """A compile's row selection (--for verl, --max-prompt-length) and the rolling scout's windows take distinct rows
    of a checked table: checked on the row numbers, not by hashing 1M ids again (~0.1 s each)."""
    from aspc.io import table as T
    from aspc.io.prompts import PromptTable
    from aspc.profiles import take_rows

    ids = [f"p{i}" for i in range(6)]
    t = PromptTable(ids, ids, ids, np.arange(6), np.full(6, 3), None, "0" * 64)

    def no_hashing(*args, **kwargs):
        raise AssertionError("the ids were hashed again")

    monkeypatch.setattr(T.pc, "unique", no_hashing)
    assert t.take(np.array([5, 0, 3])).ids == ["p5", "p0", "p3"]
    assert take_rows(t, np.array([1, 2, 4])).ids == ["p1", "p2", "p4"]
