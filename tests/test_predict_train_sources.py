"""``aspc predict train`` from run logs and one-row-per-sample datasets, ``--init`` refits, count errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.errors import InputError
from aspc.predict import load_predictor
from aspc.predict.lexical_train import train_lexical
from aspc.predict.metrics import evaluate
from aspc.predict.pairs import read_dataset_pairs

STYLES = {"in one word": 3, "briefly": 60, "in a paragraph": 150, "in detail": 400, "as a long essay": 900}


def records(n: int, seed: int = 0, start: int = 0, k: int = 4, scale: float = 1.0) -> list[dict]:
    rng = np.random.default_rng(seed)
    names = list(STYLES)
    out = []
    for i in range(start, start + n):
        style = names[rng.integers(len(names))]
        lens = np.maximum(1, np.round(rng.lognormal(np.log(STYLES[style] * scale), 0.3, size=k))).astype(int)
        out.append({"id": f"q{i}", "prompt": f"Describe topic {i % 7} {style} (ticket {i}).", "lengths": lens.tolist()})
    return out


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def run_log(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("runlog")
    data = write(d / "prompts.jsonl", records(240))
    plan = d / "plan.parquet"
    assert cli("compile", str(data), "-o", str(plan), "--quiet").exit_code == 0
    res = cli("run", str(plan), "--actual-lengths", str(data), "--length-field", "lengths", "-n", "2",
              "--log", str(d / "RUN"), "--quiet")  # fmt: skip
    assert res.exit_code == 0, res.output
    return {"dir": d, "data": data, "plan": plan, "run": d / "RUN"}


def test_train_from_run_log_uses_every_committed_sample(run_log) -> None:
    out = run_log["dir"] / "pred"
    res = cli("predict", "train", str(run_log["run"]), "--kind", "lexical", "-o", str(out), "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["training"]["source"] == "run log"
    samples = pq.read_table(run_log["run"] / "samples").num_rows
    assert samples == 480
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["training"]["n_samples"] + 0 <= samples and meta["training"]["n_prompts"] >= 200
    # The run replayed the first two recorded lengths of each prompt; the predictor learnt them.
    test = write(run_log["dir"] / "test.jsonl", records(120, seed=5, start=5000))
    ev = cli("predict", "eval", str(out), str(test), "--length-field", "lengths", "--json")
    assert ev.exit_code == 0, ev.output
    r = json.loads(ev.output)
    assert r["kendall_tau"] > 0.6 and r["kendall_tau"] > r["baseline"]["kendall_tau"] + 0.5
    assert r["coverage_q10_q90_samples"] == r["coverage_q10_q90"]


def test_run_log_without_plan_or_samples(run_log, tmp_path) -> None:
    import shutil

    bare = tmp_path / "RUN"
    shutil.copytree(run_log["run"], bare)
    (bare / "plan.parquet").unlink()
    res = cli("predict", "train", str(bare), "-o", str(tmp_path / "p"))
    assert res.exit_code == 2 and "--plan" in res.output and not (tmp_path / "p").exists()
    ok = cli("predict", "train", str(bare), "--plan", str(run_log["plan"]), "-o", str(tmp_path / "p"), "--quiet")
    assert ok.exit_code == 0, ok.output
    meta = json.loads((bare / "meta.json").read_text())
    meta["parts"]["samples"] = [0, 0]  # nothing committed
    (bare / "meta.json").write_text(json.dumps(meta))
    res = cli("predict", "train", str(bare), "--plan", str(run_log["plan"]), "-o", str(tmp_path / "q"))
    assert res.exit_code == 2 and "0 committed samples" in res.output and "at least 50" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "q").exists()


def test_a_missing_plan_is_named_not_the_log(run_log, tmp_path) -> None:
    # It said "no plan.parquet in the run log ...; pass --plan PLAN" to a log that holds one.
    res = cli("predict", "train", str(run_log["run"]), "--plan", str(tmp_path / "typo.parquet"), "-o", str(tmp_path / "p"))
    line = res.output.strip()
    assert res.exit_code == 2 and len(line.splitlines()) == 1 and not (tmp_path / "p").exists()
    assert "typo.parquet: does not exist" in line and "drop --plan to use" in line, line


def test_a_plan_the_log_did_not_run_is_refused(run_log, tmp_path) -> None:
    # The same ids with other texts (each prompt moved to the next row) trained silently on wrong pairs.
    rows = records(240)
    texts = [r["prompt"] for r in rows]
    shuffled = write(tmp_path / "shuf.jsonl", [{**r, "prompt": texts[i - 1]} for i, r in enumerate(rows)])
    other = tmp_path / "other.parquet"
    assert cli("compile", str(shuffled), "-o", str(other), "--quiet").exit_code == 0
    res = cli("predict", "train", str(run_log["run"]), "--plan", str(other), "-o", str(tmp_path / "p"))
    assert res.exit_code == 2 and "not the plan run log" in res.output and "pass --plan" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "p").exists()
    ok = cli("predict", "train", str(run_log["run"]), "--plan", str(run_log["plan"]), "-o", str(tmp_path / "q"), "-q")
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize(
    "cmd, extra, match",
    [
        (["train"], ["--length-field", "foo"], "--length-field applies to a dataset file, not to a run log"),
        (["train"], ["--prompt-field", "foo", "--id-field", "key"], "--prompt-field, --id-field apply to a dataset"),
        (["train"], ["--on-bad-line", "skip"], "--on-bad-line applies to a dataset file"),
        (["eval", "default"], ["--length-field", "lengths"], "--length-field applies to a dataset file"),
        (["eval", "default"], ["--prompt-field", "prompt"], "--prompt-field applies to a dataset file"),
    ],
)
def test_dataset_options_with_a_run_log_are_refused(run_log, tmp_path, cmd, extra, match) -> None:
    # A run log carries its own lengths and takes prompt texts from its plan: these options were silently
    # ignored (the reverse of "--plan applies to a run log directory, not to a dataset file").
    out = ["-o", str(tmp_path / "p")] if cmd == ["train"] else []
    res = cli("predict", *cmd, str(run_log["run"]), *extra, *out)
    assert res.exit_code == 2 and match in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "p").exists()


def test_a_run_logs_meta_json_names_the_directory_to_pass(run_log, tmp_path) -> None:
    # It was read as a JSON dataset: "meta.json: expected a JSON array of records; use JSONL ...".
    meta = str(run_log["run"] / "meta.json")
    want = f"{meta} is the meta.json of the run log {run_log['run']}; pass the run log directory {run_log['run']}"
    for args in (
        ["compile", str(run_log["data"]), "--history", meta, "-o", str(tmp_path / "x.parquet")],
        ["predict", "train", meta, "-o", str(tmp_path / "p")],
    ):
        res = cli(*args)
        assert res.exit_code == 2 and want in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


def test_one_row_per_sample_dataset_pools_rows(tmp_path) -> None:
    rows = [{"id": r["id"], "prompt": r["prompt"], "length": x} for r in records(60) for x in r["lengths"]]
    pairs = read_dataset_pairs(write(tmp_path / "rows.jsonl", rows), length_field="length")
    assert len(pairs) == 60 and pairs.n_samples == 240
    np.testing.assert_array_equal(pairs.lengths[0], records(60)[0]["lengths"])
    bad = rows + [{"id": "q0", "prompt": "another prompt", "length": 3}]
    with pytest.raises(InputError, match="repeats with a different prompt"):
        read_dataset_pairs(write(tmp_path / "bad.jsonl", bad), length_field="length")


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (records(20), "20 \\(prompt, length\\) pairs found, training needs at least 50"),
        ([{**r, "lengths": [7, 7]} for r in records(80)], "all 160 observed lengths equal 7"),
    ],
)
def test_too_few_or_constant_pairs(tmp_path, rows, match) -> None:
    data = write(tmp_path / "d.jsonl", rows)
    res = cli("predict", "train", str(data), "--length-field", "lengths", "-o", str(tmp_path / "p"))
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1
    import re

    assert re.search(match, res.output), res.output
    assert not (tmp_path / "p").exists()


def test_init_refit_helps_with_few_pairs_and_keeps_contract(tmp_path) -> None:
    # Prior: plenty of pairs from a "model"; policy: the same prompts' styles, 2.5x more verbose.
    prior_rows = records(500, seed=1)
    prior = train_lexical([r["prompt"] for r in prior_rows], [r["lengths"] for r in prior_rows], seed=0)
    prior.save(tmp_path / "prior")
    few = records(80, seed=2, start=9000, k=1, scale=2.5)
    test = records(300, seed=3, start=20000, scale=2.5)
    scratch = train_lexical([r["prompt"] for r in few], [r["lengths"] for r in few], seed=0)
    refit = train_lexical([r["prompt"] for r in few], [r["lengths"] for r in few], seed=0, init=prior)
    texts, lens = [r["prompt"] for r in test], [np.asarray(r["lengths"], float) for r in test]
    e_s, e_r, e_p = (evaluate(p.predict(texts), lens) for p in (scratch, refit, prior))
    assert e_r["kendall_tau"] >= e_s["kendall_tau"] + 0.05  # the prior's text weights carry over
    target = np.array([a.mean() for a in lens])
    off_prior = abs(np.log(np.median(prior.predict(texts).mean / target)))
    off_refit = abs(np.log(np.median(refit.predict(texts).mean / target)))
    assert off_refit < 0.5 * off_prior  # re-levelled toward the verbose policy
    assert e_r["mae"] < e_p["mae"] and e_r["mae"] < 0.5 * e_s["mae"]
    assert e_r["coverage_q10_q90"] > e_p["coverage_q10_q90"] + 0.3
    assert refit.metadata["training"]["init"]["hash"] == prior.content_hash()
    data = write(tmp_path / "data.jsonl", [{**r, "length": r["lengths"]} for r in few])
    for init in (str(tmp_path / "prior"), "default"):
        res = cli("predict", "train", str(data), "--length-field", "length", "--kind", "lexical",
                  "--init", init, "-o", str(tmp_path / "out"), "--quiet")  # fmt: skip
        assert res.exit_code == 0, res.output
        assert load_predictor(tmp_path / "out").predict(texts[:3]).mean.shape == (3,)


def test_init_of_another_kind_is_a_one_line_error(tmp_path) -> None:
    data = write(tmp_path / "d.jsonl", records(80))
    res = cli("predict", "train", str(data), "--length-field", "lengths", "--init", str(tmp_path / "nope"),
              "-o", str(tmp_path / "p"))  # fmt: skip
    assert res.exit_code == 2 and "--init" in res.output and not (tmp_path / "p").exists()


def test_truncated_weights_are_a_one_line_error(tmp_path) -> None:
    rows = records(100)
    train_lexical([r["prompt"] for r in rows], [r["lengths"] for r in rows]).save(tmp_path / "p")
    w = tmp_path / "p" / "weights.npz"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    data = write(tmp_path / "t.jsonl", rows[:5])
    res = cli("predict", "eval", str(tmp_path / "p"), str(data), "--length-field", "lengths")
    assert res.exit_code == 2 and "corrupt" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
