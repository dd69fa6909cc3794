"""The threaded paths of a large compile (kernels warmed beside the read, prompts gathered on
a thread, the prompt column encoded beside the others and the file stitched, rows hash beside
the write and patched into the footer) write the same bytes."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from aspc.emit import plan as plan_module
from aspc.emit import read_plan, rows_hash, stitch, write_plan
from aspc.emit import schema as S
from aspc.io import gather
from tests.test_compile import BYTE_IDENTITY_CASES, FIXTURES


def _stitched(parts):
    assert parts is not None  # the stitched write, not its fallback
    return parts


@pytest.fixture
def threaded(monkeypatch):
    """Every size threshold at 0: fixture-sized compiles take the paths of a million rows."""
    monkeypatch.setattr(plan_module, "HASH_BESIDE_WRITE_ROWS", 0)
    monkeypatch.setattr(plan_module, "SPLIT_WRITE_ROWS", 1)
    monkeypatch.setattr(gather, "THREAD_ROWS", 0)
    monkeypatch.setattr(gather, "_WARM_BYTES", 0)
    split = stitch.split_write
    monkeypatch.setattr(stitch, "split_write", lambda *a: _stitched(split(*a)))
    calls = []
    patch = plan_module._set_rows_hash
    monkeypatch.setattr(plan_module, "_set_rows_hash", lambda *a: calls.append(patch(*a)) or calls[-1])
    return calls


@pytest.mark.parametrize("name,args", BYTE_IDENTITY_CASES, ids=[c[0] for c in BYTE_IDENTITY_CASES])
def test_threaded_compile_writes_the_fixture_bytes(tmp_path, threaded, name, args):
    from click.testing import CliRunner

    from aspc.cli import main as cli

    out = tmp_path / "plan.parquet"
    argv = [str(FIXTURES / args[0]), *args[1:], "-o", str(out), "--quiet"]
    res = CliRunner().invoke(cli, ["compile", *argv])
    assert res.exit_code == 0, res.output
    assert threaded == [True]  # the footer was patched, not rewritten
    assert out.read_bytes() == (FIXTURES / f"{name}.plan.parquet").read_bytes()


def test_footer_patch_refuses_what_it_cannot_place(tmp_path):
    plan = read_plan(FIXTURES / "clean_jsonl.plan.parquet")
    out = tmp_path / "p.parquet"
    write_plan(plan, out)
    before = out.read_bytes()
    digest = rows_hash(plan.table).encode()
    assert pq.read_metadata(out).metadata[S.META_ROWS_HASH] == digest
    # A value that is not in the footer, or one of another length: file untouched.
    assert not plan_module._set_rows_hash(out, b"f" * 64, b"0" * 64)
    assert not plan_module._set_rows_hash(out, digest, b"0" * 63)
    assert out.read_bytes() == before
    # The real value is replaced in both copies, and reads back.
    assert plan_module._set_rows_hash(out, digest, b"0" * 64)
    assert pq.read_metadata(out).metadata[S.META_ROWS_HASH] == b"0" * 64
    assert pq.read_schema(out).metadata[S.META_ROWS_HASH] == b"0" * 64
    assert len(out.read_bytes()) == len(before)
