"""``aspc predict`` through click's CliRunner: the contract invocations and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.predict.base import FORMAT_VERSION

STYLES = {"in one word": 3, "briefly": 60, "in a paragraph": 150, "in detail": 400, "as a long essay": 900}


def write_data(path: Path, n: int, seed: int = 0, start: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    names = list(STYLES)
    with open(path, "w") as fh:
        for i in range(start, start + n):
            style = names[rng.integers(len(names))]
            lengths = np.maximum(1, np.round(rng.lognormal(np.log(STYLES[style]), 0.3, size=3))).astype(int)
            fh.write(
                json.dumps(
                    {
                        "id": f"q{i}",
                        "prompt": f"Describe topic {i % 7} {style} (ticket {i}).",
                        "length": lengths.tolist(),
                    }
                )
                + "\n"
            )
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli")
    train = write_data(d / "TRAIN.jsonl", 300)
    test = write_data(d / "TEST.jsonl", 80, seed=1, start=1000)
    hist = d / "HIST.jsonl"
    with open(hist, "w") as fh:
        for line in test.read_text().splitlines()[:40]:
            rec = json.loads(line)
            fh.write(json.dumps({"id": rec["id"], "length": rec["length"][0]}) + "\n")
    pred = d / "pred"
    res = CliRunner().invoke(
        main,
        [
            "predict",
            "train",
            str(train),
            "--length-field",
            "length",
            "--kind",
            "lexical",
            "-o",
            str(pred),
            "--quiet",
        ],
    )
    assert res.exit_code == 0, res.output
    return {"dir": d, "train": train, "test": test, "hist": hist, "pred": pred}


def run(*args: str):
    return CliRunner().invoke(main, ["predict", *args])


def test_train_writes_directory(files) -> None:
    meta = json.loads((files["pred"] / "metadata.json").read_text())
    assert meta["aspc_predictor"] == "lexical" and meta["format_version"] == FORMAT_VERSION
    assert {"kendall_tau", "coverage_q10_q90"} <= set(meta["validation"])
    assert len(meta["training"]["input_sha256"]) == 64
    res = run(
        "train", str(files["train"]), "--length-field", "length", "-o", str(files["dir"] / "p2"), "--json"
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["identity"]["kind"] == "lexical" and "validation" in out


def test_predict_default_invocation(files) -> None:
    out = files["dir"] / "preds.parquet"
    res = run(str(files["pred"]), str(files["test"]), "-o", str(out))
    assert res.exit_code == 0, res.output
    table = pq.read_table(out).to_pydict()
    assert list(table) == ["prompt_id", "predicted_len", "predicted_q10", "predicted_q50", "predicted_q90"]
    assert table["prompt_id"][:2] == ["q1000", "q1001"] and len(table["prompt_id"]) == 80
    assert all(
        a <= b <= c
        for a, b, c in zip(
            table["predicted_q10"], table["predicted_q50"], table["predicted_q90"], strict=True
        )
    )
    res = run(
        "default",
        str(files["test"]),
        "-o",
        str(files["dir"] / "d.parquet"),
        "--target",
        "qwen2.5-7b",
        "--json",
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["predictor"]["target"] == "Qwen--Qwen2.5-7B-Instruct-1M"


def test_predict_with_history_moves_toward_observed(files) -> None:
    plain, hist = files["dir"] / "plain.parquet", files["dir"] / "hist.parquet"
    assert run(str(files["pred"]), str(files["test"]), "-o", str(plain)).exit_code == 0
    res = run(
        str(files["pred"]), str(files["test"]), "-o", str(hist), "--history", str(files["hist"]), "--json"
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["with_history"] == 40
    a, b = pq.read_table(plain).to_pydict(), pq.read_table(hist).to_pydict()
    observed = [json.loads(line)["length"] for line in files["hist"].read_text().splitlines()]
    for i, obs in enumerate(observed):
        before, after = a["predicted_len"][i], b["predicted_len"][i]
        assert abs(np.log(after / obs)) <= abs(np.log(before / obs)) + 1e-9
    assert a["predicted_len"][40:] == b["predicted_len"][40:]


def test_eval_json_keys(files) -> None:
    res = run("eval", str(files["pred"]), str(files["test"]), "--length-field", "length", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    keys = {"kendall_tau", "spearman", "mae", "bucket_accuracy", "coverage_q10_q90", "n"}
    assert keys <= set(out) and keys <= set(out["baseline"])
    assert out["n"] == 80 and out["kendall_tau"] > out["baseline"]["kendall_tau"] + 0.3
    assert out["mae"] < out["baseline"]["mae"]
    human = run("eval", str(files["pred"]), str(files["test"]), "--length-field", "length")
    assert human.exit_code == 0 and "Kendall" in human.stdout
    # The table is eval's result (no file is written): -q printed nothing at all.
    quiet = run("eval", str(files["pred"]), str(files["test"]), "--length-field", "length", "-q")
    assert quiet.exit_code == 0 and quiet.stdout == human.stdout and not quiet.stderr, quiet.output


def test_eval_on_one_prompt_reports_no_rank_figures(files) -> None:
    one = files["dir"] / "one.jsonl"
    one.write_text(files["test"].read_text().splitlines()[0] + "\n")
    res = run("eval", str(files["pred"]), str(one), "--length-field", "length", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    for got in (out, out["baseline"]):
        assert got["n"] == 1 and got["kendall_tau"] is None and got["spearman"] is None
        assert got["bucket_accuracy"] is None and got["mae"] is not None
    human = run("eval", str(files["pred"]), str(one), "--length-field", "length")
    assert human.exit_code == 0, human.output
    tau_row = next(line for line in human.stdout.splitlines() if "Kendall" in line)
    assert "0.000" not in tau_row and "–" in tau_row
    assert "need 2 prompts" in human.stderr


@pytest.mark.parametrize(
    "args,match",
    [
        (["eval", "{dir}/missing", "{test}", "--length-field", "length"], "no such predictor directory"),
        (["{dir}/missing", "{test}", "-o", "{dir}/x.parquet"], "no such predictor directory"),
        # A trailing slash names a directory: it was dropped and a file named x.parquet written.
        (["{dir}/pred", "{test}", "-o", "{dir}/x.parquet/"], "ends with '/', which names a directory"),
        (
            [
                "train",
                "{test}",
                "--length-field",
                "length",
                "--kind",
                "lexical",
                "-o",
                "{dir}/p3",
                "--device",
                "npu",
            ],
            "npu",
        ),
        (["train", "{dir}/few.jsonl", "--length-field", "length", "-o", "{dir}/p4"], "at least 50"),
        # --base-model is read by transformer and static; --device by no lexical predictor (not "no CUDA").
        (["train", "{test}", "--base-model", "{dir}/none", "-o", "{dir}/p3"], "--base-model applies to --kind "
         "transformer and static"),  # fmt: skip
        (["train", "{test}", "--device", "cuda", "-o", "{dir}/p3"], "the lexical predictor trains on the CPU"),
        (["{dir}/pred", "{test}", "--device", "cpu", "-o", "{dir}/x.parquet"], "a lexical predictor runs on the CPU"),
        (["eval", "default", "{test}", "--device", "cuda"], "--device cuda: a lexical predictor runs on the CPU"),
        (["train", "{dir}/neg.jsonl", "--length-field", "length", "-o", "{dir}/p5"], "length"),
        (["train", "{dir}/empty.jsonl", "--length-field", "length", "-o", "{dir}/p6"], "empty"),
        (
            ["train", "{test}", "--length-field", "length", "--epochs", "3", "-o", "{dir}/p7"],
            "transformer only",
        ),
    ],
)
def test_bad_input_one_line_errors(files, args, match) -> None:
    d = files["dir"]
    write_data(d / "few.jsonl", 20)
    (d / "neg.jsonl").write_text(
        "\n".join(
            json.dumps({"id": f"n{i}", "prompt": f"p {i}", "length": -5 if i == 3 else 10}) for i in range(60)
        )
        + "\n"
    )
    (d / "empty.jsonl").write_text("")
    res = run(*(a.format(dir=d, test=files["test"]) for a in args))
    assert res.exit_code != 0
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), res.output
    assert match in lines[0]
    assert "Traceback" not in res.output
    assert not any(p.name.startswith(("p3", "p4", "p5", "p6", "p7", "x.parquet")) for p in d.iterdir())


def test_wrong_kind_and_version(files, tmp_path) -> None:
    import shutil

    bad = tmp_path / "old"
    shutil.copytree(files["pred"], bad)
    meta = json.loads((bad / "metadata.json").read_text())
    (bad / "metadata.json").write_text(json.dumps({**meta, "format_version": 0}))
    res = run(str(bad), str(files["test"]), "-o", str(tmp_path / "o.parquet"))
    assert res.exit_code != 0 and "version 0" in res.output
    assert not (tmp_path / "o.parquet").exists()


def test_every_command_has_help() -> None:
    for args in (
        ["predict", "--help"],
        ["predict", "train", "--help"],
        ["predict", "eval", "--help"],
        ["predict", "apply", "--help"],
    ):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0 and len(res.output) > 100, args
    assert "Train, evaluate and apply" in CliRunner().invoke(main, ["predict", "--help"]).output


def test_skipped_rows_are_reported_by_train_eval_and_apply(files) -> None:
    # --on-bad-line skip dropped rows without a word in predict (the help promises "skip it and report it"):
    # each command now says which rows and why, as compile does, and --json lists them.
    d = files["dir"]
    lines = files["train"].read_text().splitlines()[:80]
    rec = json.loads(lines[4])
    lines[4] = json.dumps({**rec, "prompt": ""})  # bad for apply too, which reads no lengths
    bad = d / "bad_row.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    said = "skipped 1 bad rows (--on-bad-line skip): lines 5; line 5: prompt is empty"
    for args in (
        ["train", str(bad), "--length-field", "length", "-o", str(d / "p_skip")],
        ["eval", str(files["pred"]), str(bad), "--length-field", "length"],
        [str(files["pred"]), str(bad), "-o", str(d / "skip.parquet")],
    ):
        res = run(*args, "--on-bad-line", "skip", "--json")
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert out["n_skipped"] == 1 and [s["line"] for s in out["skipped_rows"]] == [5], args
        assert out["skipped_rows"][0]["reason"] == "prompt is empty"
        assert said in " ".join(res.stderr.split()), res.stderr
    ok = run("eval", str(files["pred"]), str(files["test"]), "--length-field", "length", "--json")
    assert json.loads(ok.stdout)["n_skipped"] == 0 and "skipped" not in ok.stderr


def test_group_field_with_too_few_groups_says_it_was_ignored(files) -> None:
    # With fewer than 3 sources the bands fall back to random-prompt folds: that was silent.
    d = files["dir"]
    for n_groups, said in ((2, True), (3, False)):
        recs = [json.loads(x) for x in files["train"].read_text().splitlines()[:120]]
        data = d / f"groups{n_groups}.jsonl"
        data.write_text("".join(json.dumps({**r, "source": f"s{i % n_groups}"}) + "\n" for i, r in enumerate(recs)))
        res = run("train", str(data), "--length-field", "length", "--group-field", "source", "-o",
                  str(d / f"pg{n_groups}"), "--json")  # fmt: skip
        assert res.exit_code == 0, res.output
        folds = json.loads(res.stdout)["training"]["residual_folds"]
        assert folds == ("random prompts" if said else "leave one group out")
        msg = " ".join(res.stderr.split())
        assert ("--group-field 'source' ignored: the training prompts hold 2 groups" in msg) is said, res.stderr


def test_a_null_prompt_in_jsonl_is_named_null_for_predict_too(files) -> None:
    # compile said "is null; fix the row", predict eval "missing prompt field; pass --prompt-field NAME".
    rows = files["test"].read_text().splitlines()
    bad = json.loads(rows[0])
    bad["prompt"] = None
    data = files["dir"] / "nullp.jsonl"
    data.write_text("\n".join([json.dumps(bad), *rows[1:]]) + "\n")
    res = run("eval", str(files["pred"]), str(data), "--length-field", "length")
    assert res.exit_code == 2 and "prompt field 'prompt' is null" in res.output, res.output
