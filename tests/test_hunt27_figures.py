"""Hunt 27: the figures aspc reports, against an independent recomputation from the run log and the plan."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import EXAMPLE, invoke_cli


def _first_prompts(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "in.jsonl"
    with open(EXAMPLE, encoding="utf-8") as src:
        lines = [next(src) for _ in range(n)]
    path.write_text("".join(lines), encoding="utf-8")
    return path


def _rolling_run(tmp_path: Path, compile_extra: list, run_extra: list) -> dict:
    """``aspc run --scout --scout-roll`` of 64 prompts x 2 samples, global batch 8: its ``--json`` (epoch 1)."""
    inp = _first_prompts(tmp_path, 64)
    plan = tmp_path / "plan.parquet"
    r = invoke_cli("compile", inp, "-n", 2, "-b", 4, *compile_extra, "-o", plan, "-q")
    assert r.exit_code == 0, r.output
    r = invoke_cli("run", plan, "--actual-lengths", inp, "--length-field", "lengths", "-w", 2, "--global-batch", 8,
                   "--scout", "--scout-roll", "--scout-windows", 2, *run_extra,
                   "--log", tmp_path / "run", "--json", "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    return out["epochs"][0] if "epochs" in out else out


def test_rolling_scout_cut_responses_are_not_counted_as_left_over_samples(tmp_path):
    """README, "The rolling scout": "a cut scout response is never a sample"; RunSummary documents
    ``samples_left_over`` as "generated, never consumed (< one global batch)" and ``samples_consumed`` as
    "== n_trainer_steps × global batch".

    ``aspc run PLAN --scout --scout-roll --scout-tokens 100`` on 64 prompts × 2 samples, global batch 8:
    the trainer consumes all 128 samples in 16 steps, yet the summary reports samples_generated 144 and
    samples_left_over 16 (two whole global batches): the 16 cut scout responses, which are no samples,
    counted as samples that were generated and never trained on.
    """
    e = _rolling_run(tmp_path, [], ["--scout-tokens", 100])
    assert e["samples_held"]["cut"] > 0  # the case at hand: some scout responses were cut
    assert e["samples_consumed"] == e["n_trainer_steps"] * 8 == 128
    assert e["samples_left_over"] < 8, e
    # Generated = planned (the scout rows are plan rows); the held responses are the difference, counted apart.
    held = e["samples_held"]
    assert e["samples_generated"] == e["samples_consumed"] + e["samples_left_over"] + held["cut"]


def test_under_a_staleness_bound_the_rolling_scouts_responses_are_not_left_over_samples(tmp_path):
    """The same under ``--max-staleness``, where no scout response is kept ("the scouts only inform each
    window's plan (held, never consumed)"): samples_left_over was 32 against a global batch of 8."""
    e = _rolling_run(tmp_path, ["--order", "ascending"], ["--max-staleness", 3])
    held = e["samples_held"]
    assert held["kept"] == 0 and held["not_kept"] > 0, held
    assert e["samples_left_over"] < 8, e
    assert e["samples_generated"] == e["samples_consumed"] + e["samples_left_over"] + held["not_kept"]
