"""``aspc report``: statistics, figures, the HTML page and the command."""

from __future__ import annotations

import base64
import importlib.util
import itertools
import json
import math
import re
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.cli import main
from aspc.errors import AspcError
from aspc.report.stats import count_inversions, kendall_tau, mean_absolute_error
from tests.conftest import lognormal_records, write_jsonl

needs_mpl = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib (the 'report' extra) is not installed"
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLAN_PNGS = {"lengths.png", "minibatches.png", "group_loads.png", "delivery.png"}
RUN_PNGS = {
    "predicted_vs_observed.png",
    "queue_depth.png",
    "iteration_time.png",
    "worker_timeline.png",
    "policy_lag.png",
}
COMPILE = ["--length-field", "lengths", "--batch-size", "12", "--slack", "3", "--group-size", "4", "-n", "2"]


def _cli(args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


# ---- inputs: a real plan and real run logs, made once per module ---------------------


def make_inputs(root: Path, strategies: tuple[str, ...] = ("asp", "random")) -> dict[str, Path]:
    """Compile a 240-prompt dataset with each strategy and simulate each plan with a run log."""
    from aspc.emit import read_plan
    from aspc.io import read_lengths
    from aspc.runtime import RunConfig, run

    data = write_jsonl(root / "in.jsonl", lognormal_records(240, seed=3))
    out = {"data": data}
    lengths = read_lengths(data, length_field="lengths")
    for strategy in strategies:
        plan = root / f"plan_{strategy}.parquet"
        r = _cli(["compile", data, *COMPILE, "--strategy", strategy, "-o", plan, "-q"])
        assert r.exit_code == 0, r.output
        log = root / "runs" / strategy
        run(read_plan(plan), config=RunConfig(workers=3, global_batch=48), actual_lengths=lengths, log_dir=log)
        out[f"plan_{strategy}"], out[f"run_{strategy}"] = plan, log
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    return make_inputs(tmp_path_factory.mktemp("report_inputs"))


@pytest.fixture(scope="module")
def full_report(inputs, tmp_path_factory):
    """One report of the asp plan with both run logs overlaid, through the CLI with --json."""
    out = tmp_path_factory.mktemp("full") / "report"
    r = _cli(["report", inputs["plan_asp"], inputs["run_asp"], inputs["run_random"], "-o", out, "--json"])
    assert r.exit_code == 0, r.output
    return out, r


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def image_sources(html: str) -> list[str]:
    return re.findall(r'<img[^>]*\ssrc="([^"]+)"', html)


def check_report_dir(out: Path, expected: set[str]) -> str:
    """The contract: index.html with no http(s) URL, linking PNGs that exist and are real images."""
    html = (out / "index.html").read_text(encoding="utf-8")
    assert not re.search(r"https?://", html, re.IGNORECASE)
    pngs = {p.name for p in out.glob("*.png")}
    assert pngs == expected
    srcs = image_sources(html)
    assert len(srcs) == len(expected) >= 4
    for src in srcs:
        if src.startswith("data:"):
            continue
        assert "/" not in src and (out / src).is_file()
    assert {s for s in srcs if not s.startswith("data:")} in (expected, set())
    for name in pngs:
        w, h = png_size(out / name)
        assert w >= 600 and h >= 300, (name, w, h)
        assert (out / name).stat().st_size > 15_000, f"{name} is suspiciously small"
    return html


# ---- statistics --------------------------------------------------------------------------


def _tau_brute(x, y):
    n = len(x)
    s = n1 = n2 = 0
    for i, j in itertools.combinations(range(n), 2):
        dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
        s += dx * dy
        n1 += dx == 0
        n2 += dy == 0
    n0 = n * (n - 1) / 2
    d = math.sqrt((n0 - n1) * (n0 - n2))
    return math.nan if d == 0 else s / d


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=0, max_size=40))
def test_kendall_tau_matches_brute_force(pairs):
    x = np.array([p[0] for p in pairs], dtype=float)
    y = np.array([p[1] for p in pairs], dtype=float)
    got, want = kendall_tau(x, y), _tau_brute(x, y) if len(pairs) >= 2 else math.nan
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-12)


@given(st.lists(st.integers(0, 20), max_size=60))
def test_count_inversions_brute_force(values):
    v = np.array(values, dtype=np.int64)
    want = sum(1 for i, j in itertools.combinations(range(len(v)), 2) if v[i] > v[j])
    assert count_inversions(v) == want


def test_kendall_tau_against_scipy_large():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    x = rng.lognormal(5, 1, 5_000).round()
    y = x * rng.lognormal(0, 0.5, x.size)
    assert kendall_tau(x, y) == pytest.approx(scipy_stats.kendalltau(x, y).statistic, abs=1e-10)


def test_kendall_tau_edges():
    assert kendall_tau([1, 2, 3], [1, 2, 3]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(kendall_tau([1, 1, 1], [1, 2, 3]))  # constant sample: undefined
    assert math.isnan(kendall_tau([1.0], [2.0]))
    assert kendall_tau([1, 2, np.nan, 4], [1, 2, 9, 4]) == pytest.approx(1.0)  # NaN pairs dropped
    with pytest.raises(ValueError):
        kendall_tau([1, 2], [1, 2, 3])
    assert mean_absolute_error([1, 2, 3], [2, 2, 5]) == pytest.approx(1.0)
    assert math.isnan(mean_absolute_error([], []))


# ---- the command -------------------------------------------------------------------------


@needs_mpl
def test_report_with_runs_contract(inputs, full_report):
    out, r = full_report
    got = json.loads(r.stdout)  # stdout carries the JSON object and nothing else
    files = [Path(f) for f in got["files"]]
    assert files[0] == out / "index.html" and all(f.is_file() for f in files)
    assert {f.name for f in files[1:]} == PLAN_PNGS | RUN_PNGS
    html = check_report_dir(out, PLAN_PNGS | RUN_PNGS)
    # Both runs are overlaid, labelled by their directory names; metric tables are on the page.
    for name in ("asp", "random"):
        assert f"<th>{name}</th>" in html
    for metric in (
        "kendall_tau",
        "length_mae",
        "padding_ratio",
        "group_imbalance",
        "delivery_drift",
        "mean_iteration_time",
        "policy_lag_mean",
    ):
        assert f"<th>{metric}</th>" in html
    assert 'name="generator" content="aspc report' in html


@needs_mpl
def test_report_plan_only_embed_and_replace(inputs, tmp_path):
    out = tmp_path / "rep"
    r = _cli(["report", inputs["plan_asp"], "-o", out, "--quiet"])
    assert r.exit_code == 0, r.output
    assert r.stdout == ""
    check_report_dir(out, PLAN_PNGS)
    # An earlier aspc report is replaced whole; --embed inlines the very same PNG bytes.
    r = _cli(["report", inputs["plan_asp"], "-o", out, "--embed", "--json"])
    assert r.exit_code == 0, r.output
    html = check_report_dir(out, PLAN_PNGS)
    srcs = image_sources(html)
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    files = re.findall(r'data-file="([^"]+)"', html)
    for src, name in zip(srcs, files, strict=True):
        assert base64.b64decode(src.split(",", 1)[1]) == (out / name).read_bytes()


@needs_mpl
def test_report_refuses_foreign_directory(inputs, tmp_path):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = _cli(["report", inputs["plan_asp"], "-o", out])
    assert r.exit_code == 2 and "not an aspc report" in r.output
    assert (out / "keep.txt").read_text() == "mine"
    assert not (out / "index.html").exists()


@needs_mpl
def test_report_bad_inputs_fail_cleanly(inputs, tmp_path):
    r = _cli(["report", tmp_path / "missing.parquet", "-o", tmp_path / "a"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    notarun = tmp_path / "notarun"
    notarun.mkdir()
    (notarun / "x.txt").write_text("x")
    r = _cli(["report", inputs["plan_asp"], notarun, "-o", tmp_path / "b"])  # not a run log
    assert r.exit_code == 2 and "run log" in r.output
    assert not (tmp_path / "b").exists()
    # A run log of another plan (no shared prompt id) is refused.
    recs = lognormal_records(60, seed=5)
    for rec in recs:
        rec["id"] = "other-" + rec["id"]
    other = write_jsonl(tmp_path / "other.jsonl", recs)
    plan = tmp_path / "other.parquet"
    assert _cli(["compile", other, "--length-field", "lengths", "-o", plan, "-q"]).exit_code == 0
    r = _cli(["report", plan, inputs["run_asp"], "-o", tmp_path / "c"])
    assert r.exit_code == 2 and "no prompt of this run log" in r.output
    assert not (tmp_path / "c").exists()


def test_incomplete_run_is_read_with_status_and_recomputed_summary(inputs, tmp_path):
    import shutil

    from aspc.emit import read_plan
    from aspc.report.data import plan_view, run_view
    from aspc.runtime.record.runlog import read_run_log

    log = tmp_path / "partial"
    shutil.copytree(inputs["run_asp"], log)
    meta = json.loads((log / "meta.json").read_text())
    meta["status"] = "failed"
    meta["error"] = "worker 1 died"
    stored = meta.pop("summary")
    (log / "meta.json").write_text(json.dumps(meta))
    pv = plan_view(read_plan(inputs["plan_asp"]), "plan")
    view = run_view(pv, read_run_log(log, allow_incomplete=True), "partial")
    assert view.extra["status"] == "failed"
    # The summary is recomputed from the parts: the same numbers the finished run stored.
    assert view.extra["mean_iteration_time"] == pytest.approx(stored["mean_iteration_time"])
    assert view.extra["policy_lag_mean"] == pytest.approx(stored["policy_lag_mean"])
    assert -1.0 <= view.extra["kendall_tau"] <= 1.0 and view.extra["prompts_observed"] == 240


def test_missing_matplotlib_says_how_to_install(inputs, tmp_path, monkeypatch):
    from aspc.report import write_report

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes "import matplotlib" fail
    with pytest.raises(AspcError, match=r"pip install 'aspc\[report\]'"):
        write_report(inputs["plan_asp"], [], tmp_path / "r")
    assert not (tmp_path / "r").exists()


# ---- figures on degenerate data ------------------------------------------------------------


@needs_mpl
def test_run_figures_survive_empty_runs(tmp_path):
    from aspc.report import figures as F
    from aspc.report.data import RunView

    e, ei = np.empty(0), np.empty(0, dtype=np.int64)
    empty = RunView(
        name="empty",
        status="failed",
        meta={},
        predicted=e,
        observed=e,
        policy_lag=ei,
        step_start=e,
        step_end=e,
        step_wait=e,
        queue_time=e,
        queue_depth=ei,
        mb_worker=ei,
        mb_group=ei,
        mb_dispatch=e,
        mb_start=e,
        mb_end=e,
        mb_reload=np.empty(0, dtype=bool),
    )
    for spec in F.RUN_FIGURES:
        spec.draw(None, [empty], tmp_path / spec.file)
        assert png_size(tmp_path / spec.file)[0] > 0


def test_run_labels_are_unique():
    from aspc.report.data import run_labels

    assert run_labels([Path("a/asp"), Path("b/random")]) == ["asp", "random"]
    assert run_labels([Path("x/a/run"), Path("x/b/run")]) == ["a/run", "b/run"]
    assert run_labels([Path("/a"), Path("/b/a")]) == ["/a", "b/a"]  # the root part was joined as "//a"


@needs_mpl
def test_report_draws_run_names_as_written(inputs, tmp_path):
    # A '$...$' pair in a run directory's name was parsed as mathtext: an unmatched one raised a
    # traceback from matplotlib, a matched one was drawn as math.
    import shutil

    for i, name in enumerate(["cost_$1_vs_$2", r"lr$\frac$"]):
        log = tmp_path / name
        shutil.copytree(inputs["run_asp"], log)
        r = _cli(["report", inputs["plan_asp"], log, "-o", tmp_path / f"out{i}", "-q"])
        assert r.exit_code == 0, r.output


@needs_mpl  # without matplotlib, report refuses with the install hint before it reads its arguments
def test_the_same_run_twice_is_refused(inputs, tmp_path):
    r = _cli(["report", inputs["plan_asp"], inputs["run_asp"], inputs["run_asp"], "-o", tmp_path / "out"])
    assert r.exit_code == 2 and "given twice; name each run once" in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_the_group_loads_figure_uses_the_lower_bound_inspect_reports(tmp_path):
    # One huge prompt under --group-size 4: the cardinality term raises the bound; the figure's
    # title said 0.81% imbalance beside a metrics table of 0.
    from aspc.emit import read_plan
    from aspc.report.data import plan_view
    from tests.conftest import invoke_cli, lognormal_records, write_jsonl

    recs = lognormal_records(200)
    recs[0]["lengths"] = [60000] * len(recs[0]["lengths"])
    data = write_jsonl(tmp_path / "skew.jsonl", recs)
    out = tmp_path / "skew.parquet"
    assert invoke_cli("compile", data, "--length-field", "lengths", "--group-size", "4", "-o", out, "-q").exit_code == 0
    plan = read_plan(out)
    assert plan_view(plan, "p").lower_bound == pytest.approx(plan.metrics["lower_bound"])


@needs_mpl
def test_a_png_of_the_users_in_an_earlier_report_is_not_deleted(inputs, tmp_path):
    # Any *.png counted as the report's: replacing the report deleted the user's own picture with it.
    out = tmp_path / "rep"
    assert _cli(["report", inputs["plan_asp"], "-o", out, "-q"]).exit_code == 0
    (out / "holiday_photo.png").write_bytes(PNG_MAGIC + b"mine")
    r = _cli(["report", inputs["plan_asp"], "-o", out])
    assert r.exit_code == 2 and "holds 'holiday_photo.png', which is no part of an aspc report" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert (out / "holiday_photo.png").read_bytes() == PNG_MAGIC + b"mine"
    # The run figures of an earlier report with runs are the report's own: replaced as before.
    assert _cli(["report", inputs["plan_asp"], inputs["run_asp"], "-o", tmp_path / "full", "-q"]).exit_code == 0
    assert _cli(["report", inputs["plan_asp"], "-o", tmp_path / "full", "-q"]).exit_code == 0
    assert {p.name for p in (tmp_path / "full").glob("*.png")} == PLAN_PNGS


def _edited_plan(plan: Path, out: Path, how: str) -> Path:
    """``plan`` rewritten with a hand edit ``inspect`` refuses: a metric, a row, or a metadata key removed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(plan)
    meta = dict(t.schema.metadata)
    if how == "metric":
        metrics = json.loads(meta[b"aspc.metrics"])
        metrics["lower_bound"] = 0
        meta[b"aspc.metrics"] = json.dumps(metrics).encode()
    elif how == "row":
        pred = t.column("predicted_len").to_numpy().copy()
        pred[3] *= 5
        t = t.set_column(t.schema.get_field_index("predicted_len"), "predicted_len", pa.array(pred))
    else:
        del meta[how.encode()]
    pq.write_table(t.replace_schema_metadata(meta), out)
    return out


@needs_mpl
@pytest.mark.parametrize("how", ["metric", "row", "aspc.metrics", "aspc.rows_hash"])
def test_report_refuses_an_edited_plan_as_inspect_does(inputs, tmp_path, how):
    # inspect verified the rows against the stored metrics; report showed the edited figures and exited 0.
    bad = _edited_plan(inputs["plan_asp"], tmp_path / "bad.parquet", how)
    want = _cli(["inspect", bad])
    assert want.exit_code == 2 and len(want.output.strip().splitlines()) == 1, want.output
    r = _cli(["report", bad, inputs["run_asp"], "-o", tmp_path / "rep"])
    assert r.exit_code == 2 and r.output == want.output, r.output
    assert "recompile" in r.output and not (tmp_path / "rep").exists()


@needs_mpl
@pytest.mark.parametrize("config", [{"workers": None}, {"workers": "x"}, {"workers": -3}, {"workers": 0}, 5])
def test_report_of_an_interrupted_run_with_a_damaged_meta_is_one_line(inputs, tmp_path, config):
    # An interrupted run's summary is recomputed from meta.json's config: a bad workers was a traceback.
    import shutil

    log = tmp_path / "killed"
    shutil.copytree(inputs["run_asp"], log)
    meta = json.loads((log / "meta.json").read_text())
    meta["status"] = "running"
    del meta["summary"]
    meta["config"] = meta["config"] | config if isinstance(config, dict) else config
    (log / "meta.json").write_text(json.dumps(meta))
    r = _cli(["report", inputs["plan_asp"], log, "-o", tmp_path / "rep"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert f"{log}: meta.json config" in r.output and r.output.rstrip().endswith("the run log is damaged")
    assert not (tmp_path / "rep").exists()


@needs_mpl
def test_a_rolling_scouts_rows_are_no_observed_prompts(inputs, tmp_path):
    # Its scout rows (ids ending in SCOUT_ID_SUFFIX, cut responses) counted as extra prompts and entered
    # Kendall tau and the MAE; predict train and --history leave them out.
    import pyarrow.compute as pc

    from aspc.emit import read_plan
    from aspc.emit.schema import SCOUT_ID_SUFFIX
    from aspc.report.data import plan_view, run_view
    from aspc.runtime.record.runlog import read_run_log

    log = tmp_path / "roll"
    args = ["--actual-lengths", inputs["data"], "--length-field", "lengths", "--log", log, "-q"]
    r = _cli(["run", inputs["plan_asp"], "--scout", "--scout-roll", *args])
    assert r.exit_code == 0, r.output
    plan_path, run_dir = log / "plans" / "epoch-1.parquet", log / "epoch-1"
    plan = read_plan(plan_path)
    ids = [str(p) for p in plan.column("prompt_id")]
    n_prompts = sum(not p.endswith(SCOUT_ID_SUFFIX) for p in ids)
    assert n_prompts == 240 < len(ids)  # the plan does hold scout rows
    view = run_view(plan_view(plan, "p"), read_run_log(run_dir), "roll")
    assert view.extra["prompts_observed"] == view.observed.size == n_prompts
    # The agreement figures are those of the prompts' own samples alone.
    keep = np.array([not p.endswith(SCOUT_ID_SUFFIX) for p in ids])
    plain = plan_view(plan, "p")
    plain.prompt_ids, plain.predicted = plain.prompt_ids[keep], plain.predicted[keep]
    want = run_view(plain, read_run_log(run_dir), "plain").extra
    assert view.extra["kendall_tau"] == want["kendall_tau"] and view.extra["length_mae"] == want["length_mae"]
    # A log cut short holding only scout samples shares the plan's ids: not refused as another plan's.
    cut = read_run_log(run_dir)
    samples = cut.tables["samples"]
    cut.tables["samples"] = samples.filter(pc.ends_with(samples.column("prompt_id"), SCOUT_ID_SUFFIX))
    assert cut.tables["samples"].num_rows and run_view(plan_view(plan, "p"), cut, "cut").extra["prompts_observed"] == 0
    r = _cli(["report", plan_path, run_dir, "-o", tmp_path / "rep", "-q"])
    assert r.exit_code == 0, r.output
    assert "240 prompts (+ " in (tmp_path / "rep" / "index.html").read_text(encoding="utf-8")


def test_inspect_shows_an_undefined_load_ratio_as_a_dash(tmp_path):
    # Every length 0: the lower bound is 0 and "load / LB" printed nan (with a RuntimeWarning).
    data = write_jsonl(tmp_path / "zeros.jsonl", [{"id": f"p{i}", "prompt": "hi " * (i + 1), "len": 0} for i in range(40)])
    plan = tmp_path / "zeros.parquet"
    assert _cli(["compile", data, "--length-field", "len", "--workers", "4", "-o", plan, "-q"]).exit_code == 0
    r = _cli(["inspect", plan])
    assert r.exit_code == 0, r.output
    rows = [line for line in r.output.splitlines() if re.match(r"^│\s+\d+\s+│\s+0\s+│", line)]
    assert rows and all(line.split("│")[3].strip() == "–" for line in rows), r.output
    assert "nan" not in r.output.lower() and "Warning" not in r.output
