"""A run name too long for a figure's legend: the page shows the tag its cut label ends in."""

from __future__ import annotations

import html

from tests.conftest import invoke_cli
from tests.test_hunt27_report import _plan_and_run, _records


def test_the_page_names_each_cut_legend_labels_tag_beside_the_whole_name(tmp_path):
    from aspc.report.canvas import LABEL_CHARS, short_label

    name = "qwen2.5-7b-instruct_grpo_lr1e-6_kl0.001_seed1_gb64_w8_asp_replan"
    assert len(name) > LABEL_CHARS
    plan, run = _plan_and_run(tmp_path, _records(40), run_name=name)
    r = invoke_cli("report", plan, run, "-o", tmp_path / "rep", "-q")
    assert r.exit_code == 0, r.output
    page = html.unescape((tmp_path / "rep" / "index.html").read_text(encoding="utf-8"))
    tag = short_label(name).rsplit(" ", 1)[1]
    assert tag.startswith("#") and f"{name} {tag}" in page
