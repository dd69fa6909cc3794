"""Run logs, lengths files and inputs under names that are not UTF-8 (legal on Linux) are read and written.

pyarrow encodes a str path as strict UTF-8, so each of these was handed a path it refused; they go
through :func:`aspc.arrow_files.arrow_file` now, as plans and exports did.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import invoke_cli, lognormal_records, write_jsonl

BAD = "\udcff"  # the byte 0xff in a file name, as Python spells it (surrogateescape)


def _bad(parent: Path, name: str) -> Path:
    """``parent / name`` (``name`` not UTF-8), or a skip where the file system refuses such names."""
    p = parent / name
    try:
        os.mkdir(p)
        os.rmdir(p)
    except (OSError, UnicodeEncodeError) as exc:
        pytest.skip(f"this file system refuses names that are not UTF-8 ({exc})")
    return p


def _write(table: pa.Table, path: Path) -> None:
    with pa.OSFile(os.fsencode(path), "wb") as fh:
        pq.write_table(table, fh)


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(prompts, their plan, a complete run log of it), under UTF-8 names: each test copies what it needs."""
    d = tmp_path_factory.mktemp("logged")
    small = write_jsonl(d / "x.jsonl", lognormal_records(60))
    plan = d / "p.parquet"
    assert invoke_cli("compile", small, "--length-field", "lengths", "-o", plan, "-q").exit_code == 0
    log = d / "log"
    r = invoke_cli("run", plan, "--log", log, "-q")
    assert r.exit_code == 0, r.output
    return small, plan, log


def _copied_log(logged, tmp_path: Path) -> Path:
    log = _bad(tmp_path, f"d{BAD}") / "log"
    shutil.copytree(logged[2], log)
    return log


def test_a_run_log_in_a_folder_not_utf8_is_read_as_history(logged, tmp_path):
    # aspc/io/lengths.py handed pyarrow.dataset the str paths: a UnicodeEncodeError traceback.
    from aspc.io.lengths import read_lengths

    small, _, src = logged
    log = _copied_log(logged, tmp_path)
    got, want = read_lengths(log), read_lengths(src)
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    out = tmp_path / "p2.parquet"
    r = invoke_cli("compile", small, "--history", log, "-o", out, "-q")
    assert r.exit_code == 0, r.output
    assert out.is_file()


def test_a_plan_named_not_utf8_is_refused_as_lengths(logged, tmp_path):
    # _refuse_plan could not read the plan's schema and let it through: "missing id field", not "an aspc plan".
    from aspc.errors import InputError
    from aspc.io.lengths import read_lengths

    plan = _bad(tmp_path, f"p{BAD}.parquet")
    shutil.copyfile(logged[1], plan)
    with pytest.raises(InputError, match="an aspc plan, which holds predicted lengths"):
        read_lengths(plan)


def test_the_steps_of_a_run_log_in_a_folder_not_utf8_are_counted(tmp_path):
    # aspc run's interrupted-run message counts the logged steps: None (unknown) under such a folder.
    from aspc.cli.run import _logged_steps

    log = _bad(tmp_path, f"d{BAD}")
    (log / "steps").mkdir(parents=True)
    (log / "meta.json").write_text(json.dumps({"parts": {"steps": [1, 3]}}), encoding="utf-8")
    for part, rows in ((0, 9), (1, 2), (2, 3)):  # part 0 is not committed: not counted
        _write(pa.table({"step": list(range(rows))}), log / "steps" / f"part-{part:06d}.parquet")
    assert _logged_steps(log / "meta.json") == 5


def test_a_rolled_scout_log_in_a_folder_not_utf8_is_told_apart(tmp_path):
    # _rolled could not read epoch 1's plan: a --scout --scout-roll log was taken for a plain --epochs one.
    from aspc.run_layout import EPOCHS, ROLL, log_layout

    for root, config, want in ((_bad(tmp_path, f"r{BAD}"), {"scout_roll": 2}, ROLL),
                               (_bad(tmp_path, f"e{BAD}"), {}, EPOCHS)):  # fmt: skip
        (root / "plans").mkdir(parents=True)
        table = pa.table({"a": [1]}).replace_schema_metadata({b"aspc.config": json.dumps(config).encode()})
        _write(table, root / "plans" / "epoch-1.parquet")
        assert log_layout(root) == want


def test_a_parquet_input_named_not_utf8_is_read_in_bulk(tmp_path):
    # read_parquet_bulk gave up (None) on such a name: the slower row reader read the file instead.
    from aspc.io.bulk import read_parquet_bulk

    src = _bad(tmp_path, f"in{BAD}.parquet")
    _write(pa.table({"id": [f"p{i}" for i in range(40)], "prompt": [f"prompt {i}" for i in range(40)],
                     "lengths": [[i + 1, i + 2] for i in range(40)]}), src)  # fmt: skip
    got = read_parquet_bulk(src, prompt_field="prompt", id_field="id", length_field="lengths")
    assert got is not None
    assert got.ids == [f"p{i}" for i in range(40)]


class _Work:
    prompt_ids = np.array(["a", "b"])
    sample_row = np.array([0, 0, 1, 1])
    sample_index = np.array([0, 1, 0, 1])


def test_payloads_in_a_folder_not_utf8_are_read(tmp_path):
    # read_payload_parts: "cannot read the waiting samples' payloads" for every such log.
    from aspc.runtime.record.payloads import PendingPayloads, read_payloads

    src, run_dir = tmp_path / "run", _bad(tmp_path, f"run{BAD}")
    src.mkdir()
    held = PendingPayloads()
    held.add(np.arange(4), [{"t": [i]} for i in range(4)])
    held.write(src, np.ones(4, dtype=bool), _Work())
    shutil.copytree(src, run_dir)
    assert read_payloads(run_dir) == {("a", 0): {"t": [0]}, ("a", 1): {"t": [1]}, ("b", 0): {"t": [2]},
                                      ("b", 1): {"t": [3]}}  # fmt: skip


def test_payloads_are_written_where_atomic_path_hands_a_temporary_not_utf8(tmp_path, monkeypatch):
    # Without /proc, atomic_path yields the temporary's own path, inside the folder not UTF-8.
    import aspc.atomic
    from aspc.runtime.record.payloads import PendingPayloads, read_payloads

    run_dir = _bad(tmp_path, f"run{BAD}")
    run_dir.mkdir()
    monkeypatch.setattr(aspc.atomic, "_usable", lambda tmp: (tmp, None))
    held = PendingPayloads()
    held.add(np.arange(4), [{"t": [i]} for i in range(4)])
    held.write(run_dir, np.array([True, True, False, False]), _Work())
    assert read_payloads(run_dir) == {("a", 0): {"t": [0]}, ("a", 1): {"t": [1]}}


def test_a_run_logged_in_a_folder_not_utf8_resumes(logged, tmp_path):
    _, plan, _ = logged
    log = _bad(tmp_path, f"d{BAD}") / "log"
    r = invoke_cli("run", plan, "--log", log, "-q")
    assert r.exit_code == 0, r.output
    r = invoke_cli("run", plan, "--log", log, "--resume", "-q")
    assert r.exit_code == 0, r.output


def test_a_run_log_in_a_folder_not_utf8_gives_training_pairs(logged, tmp_path):
    from aspc.predict.pairs import _committed_samples

    log = _copied_log(logged, tmp_path)
    table = _committed_samples(log)
    assert table.num_rows == _committed_samples(logged[2]).num_rows > 0
