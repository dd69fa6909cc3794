"""Hunt 27: ``aspc report`` and ``aspc calibrate`` as outputs users read and trust.

Each test is a finding of that hunt: it failed on the code before its fix.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, invoke_cli, write_jsonl

pytest.importorskip("matplotlib", reason="needs matplotlib: pip install 'aspc[report]'")

# Bidi embedding/override/isolate controls: an unisolated one reorders the text that follows it.
BIDI_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069]")


def _records(n: int, *, length=lambda i: [40 + (i * 37) % 300, 60 + (i * 53) % 250], prompt=None) -> list[dict]:
    return [
        {"id": f"p{i:04d}", "prompt": prompt or f"prompt {i} " + "word " * (1 + i % 23), "lengths": length(i)}
        for i in range(n)
    ]


def _plan_and_run(tmp: Path, records: list[dict], *run_args: object, run_name: str = "run") -> tuple[Path, Path]:
    data = write_jsonl(tmp / "in.jsonl", records)
    plan = tmp / "plan.parquet"
    r = invoke_cli("compile", data, "--length-field", "lengths", "-o", plan, "-q")
    assert r.exit_code == 0, r.output
    run = tmp / run_name
    r = invoke_cli("run", plan, "--actual-lengths", data, "--length-field", "lengths", "--log", run, "-q", *run_args)
    assert r.exit_code == 0, r.output
    return plan, run


@pytest.fixture
def texts_drawn(monkeypatch):
    """Every string the figures put on their axes (``Axes.text`` and ``Axes.annotate``)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.axes import Axes

    drawn: list[str] = []
    text, annotate = Axes.text, Axes.annotate

    def _text(self, x, y, s, *a, **k):
        drawn.append(str(s))
        return text(self, x, y, s, *a, **k)

    def _annotate(self, s, *a, **k):
        drawn.append(str(s))
        return annotate(self, s, *a, **k)

    monkeypatch.setattr(Axes, "text", _text)
    monkeypatch.setattr(Axes, "annotate", _annotate)
    return drawn


# ---- report -------------------------------------------------------------------------------------


def test_report_never_deletes_a_file_added_to_its_output_directory_while_it_drew(tmp_path):
    """README: "a directory output (... `report -o`) replaces only an earlier output of its kind, and
    only while it holds nothing else ...: any other non-empty directory is never deleted."

    The directory is checked once, before the figures are drawn (seconds), and replaced whole at the
    end without a second look: a file written there in between (notes, another command's output,
    a second ``aspc report`` into the same new directory finishing first) is silently deleted.
    """
    from aspc.report import write_report

    plan, run = _plan_and_run(tmp_path, _records(160))
    out = tmp_path / "rep"
    out.mkdir()  # empty: the report may write here

    class UserWritesMeanwhile:
        def stage(self, name, total=None):
            if name == "figures":  # the check has passed; the figures take seconds
                (out / "notes.txt").write_text("my notes\n", encoding="utf-8")

        def advance(self, n=1):
            pass

        def done(self):
            pass

    try:
        write_report(plan, [run], out, progress=UserWritesMeanwhile())
    except Exception as exc:  # refusing (one line naming the file) is fine too
        assert "notes.txt" in str(exc)
    assert (out / "notes.txt").read_text(encoding="utf-8") == "my notes\n"


def test_delivery_figure_states_the_plans_own_delivery_drift_when_every_length_is_zero(tmp_path, texts_drawn):
    """README: "`delivery_drift` = the largest gap between the cumulative fraction of work and of
    sequences dispatched"; the page shows the plan's stored metric in its table and the figure
    annotates "delivery_drift X".

    A plan of zero-length responses stores delivery_drift 0, and its figure (0/1e-300 fractions)
    annotates "delivery_drift 1.000", the worst drift there is, beside the table's 0.
    """
    from aspc.emit import read_plan
    from aspc.report import write_report

    plan, _ = _plan_and_run(tmp_path, _records(160, length=lambda i: [0, 0]))
    write_report(plan, [], tmp_path / "rep")
    stored = read_plan(plan).metrics["delivery_drift"]
    shown = [float(m.group(1)) for t in texts_drawn if (m := re.fullmatch(r"delivery_drift ([\d.]+)", t))]
    assert shown, texts_drawn
    assert shown == [pytest.approx(stored, abs=5e-4)], (shown, stored)


def test_predicted_vs_observed_does_not_say_no_lengths_were_observed_when_all_were_zero(tmp_path, texts_drawn):
    """``aspc report --help``: "With RUN directories ...: predicted vs observed lengths (Kendall tau,
    MAE)". A run whose every response was 0 tokens long observed 160 prompts (the page's own table:
    prompts_observed 160, length_mae 0), yet the figure says "no observed lengths in the run logs".
    """
    from aspc.report import write_report

    plan, run = _plan_and_run(tmp_path, _records(160, length=lambda i: [0, 0]))
    write_report(plan, [run], tmp_path / "rep")
    page = (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")
    assert re.search(r"<th>prompts_observed</th><td[^>]*>160</td>", page)
    assert not any("no observed" in t for t in texts_drawn), texts_drawn


def test_a_run_name_with_a_bidi_override_does_not_reorder_the_rest_of_the_subtitle(tmp_path):
    """``aspc report --help``: "Several runs are overlaid in the same figures, labelled by directory
    name." The page's subtitle joins the names ("runs: a, b") as plain text: a directory name
    holding U+202E (RIGHT-TO-LEFT OVERRIDE, legal in a Linux name) reverses everything after it
    in Chromium, so a second run named "random" reads "modnar". Each name must be isolated
    (``<bdi>``) or its controls made visible.
    """
    import shutil

    plan, run = _plan_and_run(tmp_path, _records(160))
    tricky = tmp_path / "asp\u202e"
    shutil.copytree(run, tricky)
    shutil.copytree(run, tmp_path / "random")
    r = invoke_cli("report", plan, tricky, tmp_path / "random", "-o", tmp_path / "rep", "-q")
    assert r.exit_code == 0, r.output
    page = (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")
    (sub,) = re.findall(r'<p class="sub">(.*?)</p>', page, flags=re.S)
    assert "random" in sub
    unisolated = re.sub(r"<bdi\b[^>]*>.*?</bdi>", "", sub, flags=re.S)
    assert not BIDI_CONTROLS.search(unisolated), ascii(sub)


def test_report_of_a_long_run_name_is_quiet_under_q(tmp_path):
    """``aspc report --help``: "-q, --quiet  No progress bars or diagnostics." and "labelled by
    directory name". A run directory named with 250 characters (Linux allows 255) makes the
    legends wider than the figures: matplotlib's "constrained_layout not applied because axes
    sizes collapsed to zero" warning is printed on stderr under -q, and the iteration-time and
    policy-lag plots are squeezed to a sliver at the right edge (legend labels need shortening).
    """
    import shutil

    plan, run = _plan_and_run(tmp_path, _records(160))
    long_name = tmp_path / ("r" * 250)
    shutil.move(run, long_name)
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    res = subprocess.run(
        [sys.executable, "-m", "aspc.cli", "report", str(plan), str(long_name), "-o", str(tmp_path / "rep"), "-q"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout == "" and res.stderr == "", res.stderr[-2000:]


# ---- calibrate ----------------------------------------------------------------------------------


def test_calibrate_does_not_silently_zero_decode_coefficients_it_never_measured(tmp_path):
    """``aspc.runtime.calibrate.Calibration.sim_cost_model``: "the fitted coefficients (defaults where a
    fit was impossible)"; the trainer's side says so ("trainer coefficients kept at their defaults").

    A run whose responses were all 0 tokens long has no decode step at all: every decode feature is
    0, so decode_base, decode_per_seq and decode_per_context_token cannot be fitted. calibrate writes
    them as 0 (no standard error, no note naming them), and ``--cost-model`` accepts the file: every
    later simulation then decodes for free. Expected: a one-line refusal, the defaults, or a note
    naming the decode coefficients as not measured.
    """
    from aspc.runtime.backends.sim_cost import SimCostModel
    from aspc.runtime.calibrate import calibrate

    _, run = _plan_and_run(tmp_path, _records(160, length=lambda i: [0, 0]))
    r = invoke_cli("calibrate", run, "-o", tmp_path / "cost.json", "-q")
    if r.exit_code != 0:  # refused: one line, nothing written
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: "), r.output
        assert not (tmp_path / "cost.json").exists()
        return
    cal = calibrate(run)
    decode = ("decode_base", "decode_per_seq", "decode_per_context_token")
    default = SimCostModel()
    kept = all(getattr(cal.sim_cost_model, k) == getattr(default, k) for k in decode)
    noted = any(all(k in n for k in decode) for n in cal.notes)
    assert kept or noted, (cal.sim_cost_model, cal.notes)


def test_calibrate_r2_of_steps_that_all_take_the_same_time_is_not_negative(tmp_path):
    """``Calibration.r2_trainer``: "R² of trainer-step durations; None if not fitted"; ``_r2`` returns
    None where the durations do not vary. Identical prompts with one response length make every
    trainer step take the same time, up to the last bits of the clock's subtraction; the fit
    reproduces them to 1e-16, yet R² is computed on that rounding noise and printed as 0 here
    ("explains nothing"; -3.7, "worse than a constant", on 600 such prompts), in the table and in --json.
    """
    _, run = _plan_and_run(
        tmp_path, _records(160, length=lambda i: [100, 100], prompt="the same prompt"), "--global-batch", "16"
    )
    r = invoke_cli("calibrate", run, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["n_steps"] >= 3
    assert out["r2_trainer"] is None or out["r2_trainer"] >= 0.99, out["r2_trainer"]


def test_cut_legend_labels_of_names_differing_in_the_middle_stay_apart():
    # Reviewer: cutting to the two ends made two long run names differing only in the middle one label.
    from aspc.report.canvas import LABEL_CHARS, short_label

    a = "qwen2.5-7b-instruct_grpo_lr1e-6_kl0.001_seed1_gb64_w8_asp"
    b = a.replace("lr1e-6", "lr3e-6")
    assert short_label(a) != short_label(b)
    assert max(len(short_label(a)), len(short_label("r" * 255))) <= LABEL_CHARS
    assert short_label("short name") == "short name"
