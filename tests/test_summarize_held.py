"""A rolling scout's log read back after it stopped early: held scout responses are not left over."""

from __future__ import annotations

import json

from tests.conftest import invoke_cli
from tests.test_hunt27_figures import _rolling_run


def test_a_stopped_rolling_scout_log_counts_its_held_responses_as_held(tmp_path):
    """``aspc report`` recomputes a failed or interrupted log's summary from its rows (``summarize_log``);
    it counted every cut scout response as a sample left over, two global batches here, where ``aspc run``
    leaves them out. The log of a complete run, marked as stopped, must read back with the run's figure."""
    e = _rolling_run(tmp_path, [], ["--scout-tokens", 100])
    assert e["samples_held"]["cut"] > 0
    from aspc.runtime.record.metrics import summarize_log
    from aspc.runtime.record.runlog import read_run_log

    log = next(p.parent for p in sorted((tmp_path / "run").rglob("meta.json")) if "held" in
               json.loads(p.read_text()).get("run", {}))  # fmt: skip
    meta = json.loads((log / "meta.json").read_text())
    meta["status"] = "failed"
    del meta["summary"]
    (log / "meta.json").write_text(json.dumps(meta))
    again = summarize_log(read_run_log(log, allow_incomplete=True))
    assert again.samples_left_over == e["samples_left_over"] < 8, (again.samples_left_over, e["samples_left_over"])
    assert again.samples_consumed == e["samples_consumed"]
    r = invoke_cli("report", log / "plan.parquet", log, "-o", tmp_path / "rep", "-q")
    assert r.exit_code == 0, r.output


def test_simulates_left_over_note_totals_samples_not_a_rolling_scouts_cut_responses(tmp_path):
    """The note said "8 of random's 200 samples" beside a rolling scout whose plan rows (260) count its
    cut scout responses: the two plans hold the same 200 samples."""
    from tests.test_hunt27_figures import _first_prompts

    inp = _first_prompts(tmp_path, 100)
    r = invoke_cli("simulate", inp, "--length-field", "lengths", "-n", 2, "-w", 2, "--global-batch", 24,
                   "--strategies", "random,asp+scout+roll", "--scout-tokens", 100)  # fmt: skip
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "8 of the plans' 200 samples are generated but no trainer step consumes them" in text, text
