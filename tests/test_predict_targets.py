"""Several policies' lengths in one dataset: ``--target-field`` heads, ``--group-field`` bands, ``--target`` at compile."""

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
from aspc.predict.metrics import evaluate
from aspc.predict.pairs import read_dataset_pairs
from tests.conftest import EXAMPLE, write_jsonl

STYLES = {"in one word": 3, "briefly": 60, "in a paragraph": 150, "in detail": 400, "as a long essay": 900}
# Two policies answering the same prompts: "verbose" writes three times as much as "terse".
SCALE = {"terse": 1.0, "verbose": 3.0}
SOURCES = ("alpaca", "code", "math", "chat")


def rows(n: int, seed: int = 0, start: int = 0, k: int = 3) -> list[dict]:
    rng = np.random.default_rng(seed)
    names = list(STYLES)
    out = []
    for i in range(start, start + n):
        style = names[rng.integers(len(names))]
        for model, scale in SCALE.items():
            lens = rng.lognormal(np.log(STYLES[style] * scale), 0.3, size=k)
            out.append({
                "id": f"q{i}",
                "prompt": f"Describe topic {i % 7} {style} (ticket {i}).",
                "model": model,
                "source": SOURCES[i % len(SOURCES)],
                "lengths": np.maximum(1, np.round(lens)).astype(int).tolist(),
            })  # fmt: skip
    return out


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("targets")
    data = write_jsonl(d / "train.jsonl", rows(240))
    test = write_jsonl(d / "test.jsonl", rows(120, seed=7, start=9000))
    out = d / "pred"
    res = cli("predict", "train", str(data), "--length-field", "lengths", "--target-field", "model",
              "--group-field", "source", "-o", str(out), "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    return {"dir": d, "data": data, "test": test, "pred": out, "summary": json.loads(res.output)}


def test_pairs_are_per_prompt_and_target_with_one_group_per_prompt(tmp_path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", rows(30))
    pairs = read_dataset_pairs(data, length_field="lengths", target_field="model", group_field="source")
    assert len(pairs) == 60 and len(set(pairs.ids)) == 30
    assert pairs.targets == [m for _ in range(30) for m in SCALE]
    assert pairs.groups == [SOURCES[i % 4] for i in range(30) for _ in SCALE]
    # Without the target field the two policies' lengths of a prompt pool into one entry.
    pooled = read_dataset_pairs(data, length_field="lengths")
    assert len(pooled) == 30 and pooled.targets is None and pooled.groups is None
    assert pooled.n_samples == pairs.n_samples


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"source": "other"}, "line 61: prompt id 'q0' repeats in group 'other', earlier 'alpaca'"),
        ({"model": None}, "line 61: missing target field 'model'; give every row one, or drop --target-field"),
        ({"model": ["a"]}, "line 61: target field 'model' must be a name \\(a string\\), got list"),
        ({"source": " "}, "line 61: group field 'source' is empty"),
    ],
)
def test_bad_target_or_group_names_the_line(tmp_path, change, match) -> None:
    data = rows(30) + [{**rows(1)[0], "model": "third", **change}]
    path = write_jsonl(tmp_path / "d.jsonl", data)
    with pytest.raises(InputError, match=match):
        read_dataset_pairs(path, length_field="lengths", target_field="model", group_field="source")
    skipped = read_dataset_pairs(path, length_field="lengths", target_field="model", group_field="source",
                                 on_bad_line="skip")  # fmt: skip
    assert len(skipped) == 60


def test_train_makes_a_head_per_target_and_leaves_groups_out(trained) -> None:
    summary = trained["summary"]
    assert summary["targets"] == ["terse", "verbose"]
    meta = json.loads((trained["pred"] / "metadata.json").read_text())
    assert meta["training"]["residual_folds"] == "leave one group out"
    assert set(meta["validation"]["per_target"]) == {"terse", "verbose"}
    texts = [f"Describe topic 1 {s} (ticket 1)." for s in STYLES]
    terse = load_predictor(trained["pred"], target="terse").predict(texts).mean
    verbose = load_predictor(trained["pred"], target="verb").predict(texts).mean
    # Same text score, a level per policy: the verbose head predicts about three times the terse one.
    np.testing.assert_allclose(verbose / terse, 3.0, rtol=0.25)
    assert np.all(np.diff(terse) > 0)


def test_eval_scores_each_row_by_its_heads(trained) -> None:
    res = cli("predict", "eval", str(trained["pred"]), str(trained["test"]), "--length-field", "lengths",
              "--target-field", "model", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    r = json.loads(res.output)
    assert set(r["per_target"]) == {"terse", "verbose"} and r["n"] == 240
    assert all(m["kendall_tau"] > 0.6 and m["n"] == 120 for m in r["per_target"].values())
    assert r["mean_over_targets"]["kendall_tau"] == pytest.approx(
        np.mean([m["kendall_tau"] for m in r["per_target"].values()])
    )
    # The pooled head sits between the two levels; each row's own head knows its policy's.
    pairs = read_dataset_pairs(trained["test"], length_field="lengths", target_field="model")
    pooled = evaluate(load_predictor(trained["pred"]).predict(pairs.texts), pairs.lengths)
    assert r["n"] == pooled["n"] and r["mae"] < 0.7 * pooled["mae"]
    text = cli("predict", "eval", str(trained["pred"]), str(trained["test"]), "--length-field", "lengths",
               "--target-field", "model")  # fmt: skip
    assert text.exit_code == 0 and "per target model" in text.output and "verbose" in text.output


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["eval", "{pred}", "{test}", "--target", "terse", "--target-field", "model"], "not both"),
        (["eval", "{pred}", "{test}", "--target-field", "lengths"], "--target-field 'lengths' is also the --length-field"),
        (["eval", "default", "{test}", "--target-field", "model"],
         "target 'terse' matches none of the predictor's targets"),
        (["train", "{data}", "--target-field", "model", "--group-field", "model", "-o", "{out}"],
         "--target-field and --group-field are both 'model'"),
        (["train", "{data}", "--kind", "transformer", "--group-field", "source", "-o", "{out}"],
         "--group-field applies to --kind lexical and static"),
    ],
)
def test_field_errors_are_one_line(trained, tmp_path, args, match) -> None:
    paths = {"pred": trained["pred"], "test": trained["test"], "data": trained["data"], "out": tmp_path / "o"}
    argv = [a.format(**{k: str(v) for k, v in paths.items()}) for a in args]
    res = cli("predict", *argv, "--length-field", "lengths") if "--length-field" not in argv else cli("predict", *argv)
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and match in res.output, res.output
    assert not (tmp_path / "o").exists()


def test_eval_target_field_needs_heads(tmp_path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", rows(60))
    plain = tmp_path / "plain"
    assert cli("predict", "train", str(data), "--length-field", "lengths", "-o", str(plain), "--quiet").exit_code == 0
    res = cli("predict", "eval", str(plain), str(data), "--length-field", "lengths", "--target-field", "model")
    assert res.exit_code == 2 and "has no per-model heads" in res.output


def test_run_log_has_no_target_or_group_fields(tmp_path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [{**r, "lengths": r["lengths"]} for r in rows(60) if r["model"] == "terse"])
    plan = tmp_path / "plan.parquet"
    assert cli("compile", str(data), "-o", str(plan), "--quiet").exit_code == 0
    run = tmp_path / "RUN"
    ok = cli("run", str(plan), "--actual-lengths", str(data), "--length-field", "lengths", "--log", str(run), "--quiet")
    assert ok.exit_code == 0, ok.output
    res = cli("predict", "train", str(run), "--group-field", "source", "-o", str(tmp_path / "p"))
    assert res.exit_code == 2 and "is a run log" in res.output and not (tmp_path / "p").exists()


def test_compile_picks_a_head_of_the_default(tmp_path) -> None:
    pooled, head = tmp_path / "pooled.parquet", tmp_path / "head.parquet"
    assert cli("compile", str(EXAMPLE), "-o", str(pooled), "--quiet").exit_code == 0
    res = cli("compile", str(EXAMPLE), "--target", "qwen2.5-7b", "-o", str(head), "--quiet")
    assert res.exit_code == 0, res.output
    meta = {k.decode(): v.decode() for k, v in pq.read_schema(head).metadata.items()}
    assert json.loads(meta["aspc.predictor"])["target"] == "Qwen--Qwen2.5-7B-Instruct-1M"
    assert json.loads(meta["aspc.config"])["head"] == "qwen2.5-7b"
    assert "head" not in json.loads({k.decode(): v.decode() for k, v in pq.read_schema(pooled).metadata.items()}
                                    ["aspc.config"])  # fmt: skip
    a = pq.read_table(pooled, columns=["predicted_len"]).column(0).to_numpy()
    b = pq.read_table(head, columns=["predicted_len"]).column(0).to_numpy()
    assert not np.array_equal(np.sort(a), np.sort(b))


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--target", "llama"], "target 'llama' matches several of the predictor's targets"),
        (["--target", "qwen2.5-7b", "--length-field", "lengths"], "give --length-field or --target, not both"),
    ],
)
def test_compile_target_errors(tmp_path, extra, match) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [r for r in rows(40) if r["model"] == "terse"])
    out = tmp_path / "plan.parquet"
    res = cli("compile", str(data), "-o", str(out), *extra)
    assert res.exit_code == 2 and match in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.slow
def test_cli_reproduces_the_benchmarks_lexical_heads(shared_data, tmp_path) -> None:
    """``predict train --target-field --group-field`` is the benchmark's train-split predictor, weight for weight."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from aspc.predict.lexical_train import train_lexical

    cols = ["dataset", "model", "prompt_id", "prompt_text", "output_sizes", "split"]
    t = pq.read_table(shared_data, columns=cols)
    train = t.filter(pc.equal(t["split"], "train"))
    # A fifth of the train prompts keeps the test short; the equality is what is checked.
    ids = sorted(set(train["prompt_id"].to_pylist()))[::5]
    train = train.filter(pc.is_in(train["prompt_id"], value_set=pa.array(ids)))
    path = tmp_path / "train.parquet"
    pq.write_table(train, path)
    out = tmp_path / "pred"
    res = cli("predict", "train", str(path), "--prompt-field", "prompt_text", "--id-field", "prompt_id",
              "--length-field", "output_sizes", "--target-field", "model", "--group-field", "dataset",
              "--validation-split", "0", "-o", str(out), "--quiet")  # fmt: skip
    assert res.exit_code == 0, res.output
    d = train.to_pydict()
    ref = train_lexical(d["prompt_text"], [np.asarray(o, dtype=np.float64) for o in d["output_sizes"]],
                        targets=d["model"], groups=d["dataset"], seed=0, validation_split=0.0)  # fmt: skip
    got = load_predictor(out)
    assert got.targets == ref.targets
    np.testing.assert_array_equal(got.beta, ref.beta)
    np.testing.assert_array_equal(got.intercepts, ref.intercepts)


@pytest.mark.slow
def test_the_shipped_default_is_what_its_script_trains(shared_data, tmp_path):
    # The training code moved on (per-model band scales, portable math) and the shipped files did
    # not follow: the README's "trained by scripts/train_default_predictor.py" no longer held.
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "default"
    r = subprocess.run([sys.executable, str(root / "scripts" / "train_default_predictor.py"), "--data", str(shared_data),
                        "--output", str(out)], capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert r.returncode == 0, r.stderr
    shipped = root / "aspc" / "predict" / "default"
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in shipped.iterdir())
    for p in shipped.iterdir():
        assert (out / p.name).read_bytes() == p.read_bytes(), f"{p.name} differs: retrain the shipped default"
