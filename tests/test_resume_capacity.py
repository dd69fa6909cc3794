"""``--resume`` with ``--queue-capacity`` spelled otherwise than the log's: the same queue is the same run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import EXAMPLE, invoke_cli, one_line_error


def _logged_run(tmp_path: Path, *capacity: str) -> tuple[Path, Path, Path]:
    data = tmp_path / "in.jsonl"
    with open(EXAMPLE, encoding="utf-8") as fh:
        data.write_text("".join(fh.readline() for _ in range(40)), encoding="utf-8")
    plan, log = tmp_path / "plan.parquet", tmp_path / "RUN"
    assert invoke_cli("compile", data, "-o", plan, "-q").exit_code == 0
    r = invoke_cli("run", plan, "--actual-lengths", data, "--length-field", "lengths", "--log", log, "-q", *capacity)
    assert r.exit_code == 0, r.output
    return data, plan, log


def _resume(data: Path, plan: Path, log: Path, capacity: str):
    return invoke_cli("run", plan, "--actual-lengths", data, "--length-field", "lengths", "--log", log, "--resume",
                      "--queue-capacity", capacity, "-q")  # fmt: skip


def test_resume_takes_the_logged_capacity_in_another_spelling(tmp_path):
    data, plan, log = _logged_run(tmp_path)  # the default, "auto"
    samples = json.loads((log / "meta.json").read_text())["run"]["queue_capacity"]
    for same in ("AUTO", " auto"):
        r = _resume(data, plan, log, same)
        assert r.exit_code == 0, (same, r.output)
    # Not the samples "auto" came to: an --epochs run resolves "auto" again for each epoch's plan.
    for other in (str(samples), str(samples + 1)):
        assert "--queue-capacity ('auto' in the log" in one_line_error(_resume(data, plan, log, other))


def test_resume_takes_a_logged_count_as_the_same_count_or_batches(tmp_path):
    data, plan, log = _logged_run(tmp_path, "--queue-capacity", "64")  # global batch 64 (the default)
    for same in ("064", "1b", "1.0B"):
        r = _resume(data, plan, log, same)
        assert r.exit_code == 0, (same, r.output)
    for other in ("auto", "65", "2b"):
        assert "--queue-capacity ('64' in the log" in one_line_error(_resume(data, plan, log, other))


def test_resume_of_a_log_in_batches_compares_the_batches(tmp_path):
    data, plan, log = _logged_run(tmp_path, "--queue-capacity", "2b")
    assert _resume(data, plan, log, "2.0B").exit_code == 0
    assert "--queue-capacity" in one_line_error(_resume(data, plan, log, "3b"))


def test_scout_resume_compares_the_capacity_as_one_spelling(tmp_path):
    """A ``--scout`` run stopped before epoch 1's log: its options are compared from the scout's record."""
    from aspc.epoch_checks import check_scout_part_of
    from aspc.errors import ConfigError

    root = tmp_path / "ROOT"
    root.mkdir()
    data, plan, _ = _logged_run(tmp_path)
    r = invoke_cli("run", plan, "--actual-lengths", data, "--length-field", "lengths", "--log", root / "scout", "-q")
    assert r.exit_code == 0, r.output
    meta = json.loads((root / "scout" / "meta.json").read_text())
    meta["run"]["part_of"] = {"queue_capacity": "auto", "global_batch": 64}
    (root / "scout" / "meta.json").write_text(json.dumps(meta))
    check_scout_part_of(root, {"queue_capacity": "AUTO", "global_batch": 64})
    try:
        check_scout_part_of(root, {"queue_capacity": "64", "global_batch": 64})
    except ConfigError as e:
        assert "--queue-capacity ('auto' in the log, '64' now)" in str(e)
    else:
        raise AssertionError("another capacity was taken")
