"""``aspc simulate`` through click's CliRunner: bad rows, caps, options that do not apply, output."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from aspc.cli import main
from tests.conftest import lognormal_records, write_jsonl

BASE = ["--length-field", "lengths", "--workers", "4", "--global-batch", "16"]


def _sim(path, *args):
    return CliRunner().invoke(main, ["simulate", str(path), *BASE, *[str(a) for a in args]])


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("bad", [[-5, 10], [], [float("nan")], None, [10**12]])
def test_skip_drops_a_row_with_a_bad_length_as_compile_does(tmp_path, bad):
    # The prompt read (no length field) kept the row and the lengths read dropped it: "1 of 119 plan
    # prompts have no length", exit 2, where compile --on-bad-line skip skipped the row.
    recs = lognormal_records(120)
    recs[3]["lengths"] = bad
    data = write_jsonl(tmp_path / "bad.jsonl", recs)
    r = _sim(data, "--strategies", "random,asp,oracle", "--on-bad-line", "skip", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)["strategies"]
    assert all(s["samples_planned"] == 119 for s in out.values()), {k: v["samples_planned"] for k, v in out.items()}
