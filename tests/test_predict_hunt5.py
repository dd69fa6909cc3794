"""Predictor training with awkward targets, huge numbers in metadata, and the name ``default``.

- A target whose prompts all fall in the validation split trains anyway, at the pooled level
  (it raised IndexError in the calibration, with NumPy warnings).
- Targets that cannot be told apart from their prompts (one prompt per target) are refused at
  train time (the predictor came out predicting 0 or 1e13 tokens), and so is any freshly trained
  head whose lengths no command would accept.
- A JSON integer beyond int64 in the metadata is refused in one line (``np.isfinite`` raised TypeError).
- ``default`` while ./default is a directory is refused, and the shipped predictor is an input
  that no output may replace or be written into.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import string
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.conftest import EXAMPLE, invoke_cli, one_line_error, save_tiny_bert, write_jsonl


def _rows(n: int | None = None) -> list[dict]:
    with open(EXAMPLE, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    return rows[:n]


def _one_held_out_target(d: Path) -> Path:
    """200 prompts of model A, except the first, model B: with --seed 9 it falls in the validation split."""
    rows = [{"id": r["id"], "prompt": r["prompt"], "length": r["lengths"][0], "model": "B" if i == 0 else "A"}
            for i, r in enumerate(_rows(200))]  # fmt: skip
    return write_jsonl(d / "one_held_out.jsonl", rows)


def _train(*args: object, quiet: bool = True) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "Mean of empty slice" came with the IndexError
        return invoke_cli("predict", "train", *args, *(["-q"] if quiet else []))


def _predictions(pred: Path, out: Path, *extra: object) -> dict:
    r = invoke_cli("predict", pred, EXAMPLE, "-o", out, "-q", *extra)
    assert r.exit_code == 0, r.output
    table = pq.read_table(out).to_pydict()
    table.pop("prompt_id")
    return table


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    pytest.importorskip("torch", reason="needs torch: pip install 'aspc[predict]'")
    pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[predict]'")
    words = ["the", "a", "write", "code", "list", "input"]
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-encoder"), words, string.ascii_lowercase + string.digits)


# -- 1: a target with no training row ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lexical", "static"])
def test_target_with_every_prompt_held_out_answers_at_the_pooled_level(tmp_path, kind, request) -> None:
    extra = ["--kind", kind] + (["--base-model", request.getfixturevalue("tiny")] if kind == "static" else [])
    out = tmp_path / "pred"
    r = _train(_one_held_out_target(tmp_path), "--target-field", "model", "--seed", 9, *extra, "-o", out, quiet=False)
    assert r.exit_code == 0, r.output
    assert "target B: every prompt fell in the validation split" in " ".join(r.output.split())
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["targets"] == ["A", "B"] and meta["training"]["untrained_targets"] == ["B"]
    assert _predictions(out, tmp_path / "b.parquet", "--target", "B") == _predictions(out, tmp_path / "p.parquet")


def test_many_small_targets_train(tmp_path) -> None:
    """300 targets of two prompts each: the validation split holds out both prompts of some of them."""
    rows = [{**r, "model": f"m{i % 300}"} for i, r in enumerate(_rows())]
    out = tmp_path / "pred"
    data = write_jsonl(tmp_path / "x.jsonl", rows)
    r = _train(data, "--length-field", "lengths", "--target-field", "model", "-o", out)
    assert r.exit_code == 0, r.output
    assert json.loads((out / "metadata.json").read_text())["training"]["untrained_targets"]
    p = _predictions(out, tmp_path / "p.parquet")
    assert 100 < np.median(p["predicted_len"]) < 1000 and max(p["predicted_q90"]) < 20_000


@pytest.mark.parametrize("kind", ["lexical", "static"])
def test_target_with_one_training_prompt_leaves_the_pooled_head_alone(kind, request) -> None:
    """Out of fold, a target with no row in the fit got intercept 0 (a level of one token): its residual of
    ~5 log units widened the pooled band by 10% (lexical) and raised the pooled mean by 60% (static). It is
    now scored at the fit's pooled level."""
    from aspc.predict import train_predictor

    base_model = request.getfixturevalue("tiny") if kind == "static" else None
    rows = _rows(200)
    texts, lengths = [r["prompt"] for r in rows], [r["lengths"][0] for r in rows]
    alone = train_predictor(kind, texts, lengths, targets=["A"] * 200, seed=9, base_model=base_model)
    targets = ["B" if i == 5 else "A" for i in range(200)]
    with_b = train_predictor(kind, texts, lengths, targets=targets, seed=9, base_model=base_model)
    assert with_b.metadata["training"].get("untrained_targets") is None  # B's prompt is a training one
    a, b = alone.predict(texts), with_b.predict(texts)
    assert np.median(b.mean) == pytest.approx(np.median(a.mean), rel=0.02)
    assert np.median(b.q90) == pytest.approx(np.median(a.q90), rel=0.02)


# -- 2: targets that cannot be told apart from their prompts -------------------------------------


@pytest.mark.parametrize("kind", ["lexical", "static"])
def test_one_target_per_prompt_is_refused(tmp_path, kind, request) -> None:
    extra = ["--kind", kind] + (["--base-model", request.getfixturevalue("tiny")] if kind == "static" else [])
    rows = [{**r, "model": "m-" + r["id"]} for r in _rows()]
    out = tmp_path / "pred"
    r = _train(write_jsonl(tmp_path / "x.jsonl", rows), "--length-field", "lengths", "--target-field", "model",
               "--validation-split", 0, *extra, "-o", out)  # fmt: skip
    msg = one_line_error(r, 2)
    assert "600 targets for 600 training prompts: only 0 of the prompts share their target" in msg
    assert "drop --target-field" in msg and not out.exists()


def test_targets_of_one_prompt_each_with_several_rows_are_refused(tmp_path) -> None:
    """Three rows (ids) of one prompt per target: the rows differ, the prompt does not."""
    rows = [{"id": f"{r['id']}-{j}", "prompt": r["prompt"], "length": r["lengths"][j], "model": f"m{i}"}
            for i, r in enumerate(_rows(200)) for j in range(3)]  # fmt: skip
    out = tmp_path / "pred"
    r = _train(write_jsonl(tmp_path / "x.jsonl", rows), "--target-field", "model", "--validation-split", 0, "-o", out)
    assert "only 0 of the prompts share their target" in one_line_error(r, 2) and not out.exists()


def test_a_head_no_command_would_accept_is_refused_at_train_time(tmp_path) -> None:
    """30 targets of two prompts (60 shared: enough) and 540 of one: the pooled head predicted 1e10 tokens."""
    rows = [{**r, "model": f"p{i // 2}" if i < 60 else f"s{i}"} for i, r in enumerate(_rows())]
    out = tmp_path / "pred"
    r = _train(write_jsonl(tmp_path / "x.jsonl", rows), "--length-field", "lengths", "--target-field", "model",
               "--validation-split", 0, "-o", out)  # fmt: skip
    msg = one_line_error(r, 2)
    assert "training gave an unusable predictor: the pooled head predicts lengths outside (0, 1e+09]" in msg
    assert not out.exists()


@pytest.mark.parametrize("level", [-800.0, 800.0])
def test_check_trained_heads_names_the_bad_head(level) -> None:
    from aspc.errors import InputError
    from aspc.predict.base import check_trained_heads
    from aspc.predict.lexical_train import train_lexical

    rows = _rows(120)
    texts = [r["prompt"] for r in rows]
    pred = train_lexical(texts, [r["lengths"] for r in rows], targets=["x", "y"] * 60, validation_split=0)
    check_trained_heads(pred, texts)
    pred.intercepts[1] = level  # target y's level: predicts 0 tokens, or inf
    with pytest.raises(InputError, match="the head of target 'y' predicts lengths outside"):
        check_trained_heads(pred, texts)


# -- 3: integers beyond int64 in the metadata ----------------------------------------------------


@pytest.fixture(scope="module")
def lexical(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("lexical")
    rows = [{**r, "model": f"m{i % 2}"} for i, r in enumerate(_rows())]
    r = invoke_cli("predict", "train", write_jsonl(d / "x.jsonl", rows), "--length-field", "lengths",
                   "--target-field", "model", "-o", d / "pred", "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    write_jsonl(d / "hist.jsonl", [{"id": r["id"], "length": r["lengths"][0]} for r in rows[:100]])
    return d / "pred"


def _edited(src: Path, dst: Path, path: tuple[str, ...], value: object) -> Path:
    shutil.copytree(src, dst)
    meta = json.loads((dst / "metadata.json").read_text())
    d = meta
    for key in path[:-1]:
        d = d[key]
    d[path[-1]] = value
    (dst / "metadata.json").write_text(json.dumps(meta))
    return dst


@pytest.mark.parametrize("field", ["history_kappa", "history_within_log_var", "history_within_band_var",
                                   "history_within_log_var_by_target", "history_within_band_var_by_target"])
def test_huge_integer_history_metadata_is_refused_in_one_line(tmp_path, lexical, field) -> None:
    value = {"m0": 10**30} if field.endswith("_by_target") else 10**30
    pred = _edited(lexical, tmp_path / "p", (field,), value)
    out = tmp_path / "out.parquet"
    r = invoke_cli("predict", pred, EXAMPLE, "--history", lexical.parent / "hist.jsonl", "-o", out, "-q")
    msg = one_line_error(r, 2)
    assert msg.startswith(f"Error: predictor p: metadata {field} ") and msg.endswith("; retrain it")
    assert "ufunc" not in msg and not out.exists()


@pytest.mark.parametrize("path", [("marginal", "max"), ("config", "lam")])
def test_integer_past_the_float_range_is_refused_in_one_line(tmp_path, lexical, path) -> None:
    pred = _edited(lexical, tmp_path / "p", path, 10**400)
    out = tmp_path / "plan.parquet"
    msg = one_line_error(invoke_cli("compile", EXAMPLE, "--predictor", pred, "-o", out, "-q"), 2)
    assert msg.endswith("retrain it") and not out.exists()


def test_static_history_kappa_huge_integer_is_refused(tmp_path, tiny) -> None:
    src = tmp_path / "static"
    r = invoke_cli("predict", "train", EXAMPLE, "--length-field", "lengths", "--kind", "static", "--base-model", tiny,
                   "-o", src, "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    hist = write_jsonl(tmp_path / "h.jsonl", [{"id": r["id"], "length": r["lengths"][0]} for r in _rows(50)])
    pred = _edited(src, tmp_path / "p", ("history_kappa",), 10**30)
    msg = one_line_error(invoke_cli("predict", pred, EXAMPLE, "--history", hist, "-o", tmp_path / "o.parquet"), 2)
    assert msg.startswith("Error: predictor p: metadata history_kappa ") and "is not a positive number" in msg


@pytest.mark.parametrize(
    ("norm", "cqr", "words"), [([5, 10**30], 0.0, "norm [5, 1000"), ([5, 1.0], 10**30, "cqr_adjust 1000")]
)
def test_transformer_metadata_huge_integers_are_refused(norm, cqr, words) -> None:
    from aspc.predict.transformer import _checked_meta

    with pytest.raises(ValueError) as info:
        _checked_meta({"targets": [], "norm": norm, "cqr_adjust": cqr})
    assert str(info.value).startswith(words) and "ufunc" not in str(info.value)


def test_finite_number() -> None:
    from aspc.predict.base import finite_number

    assert all(finite_number(x) for x in (0, -3, 2**63 - 1, -(2**63), 1.5, 1e300))
    assert not any(finite_number(x) for x in (2**63, 10**30, -(10**400), float("nan"), float("inf"), True, "1", None))


# -- 4: 'default' while ./default is a directory -------------------------------------------------


def test_default_shadowed_by_a_predictor_directory_is_refused(tmp_path, monkeypatch) -> None:
    from aspc.predict import default_predictor_path

    monkeypatch.chdir(tmp_path)
    shutil.copytree(default_predictor_path(), "default")  # what `aspc predict train ... -o default` leaves
    commands = [
        ("predict", "default", EXAMPLE, "-o", "o.parquet"),
        ("predict", "eval", "default", EXAMPLE, "--length-field", "lengths"),
        ("compile", EXAMPLE, "--predictor", "default", "-o", "o.parquet"),
        ("predict", "train", EXAMPLE, "--length-field", "lengths", "--init", "default", "-o", "o"),
        ("probe", EXAMPLE, "--backend", "sim", "--actual-lengths", EXAMPLE, "--length-field", "lengths",
         "--prompts", "100", "--log", "L", "-o", "o"),  # --init default is probe's default
        ("simulate", EXAMPLE, "--predictor", "default", "--strategies", "asp"),
    ]  # fmt: skip
    for args in commands:
        msg = one_line_error(invoke_cli(*args, "-q"), 2)
        assert "'default' names the shipped predictor, but ./default is also a directory here" in msg, args
        assert "pass ./default" in msg and not Path("o.parquet").exists() and not Path("o").exists()


def test_a_folder_named_default_that_is_no_predictor_shadows_nothing(tmp_path, monkeypatch) -> None:
    # A config folder called default made every probe (--init default is its default) refuse to start.
    monkeypatch.chdir(tmp_path)
    Path("default").mkdir()
    (Path("default") / "settings.yaml").write_text("a: 1\n")
    probe = invoke_cli("probe", EXAMPLE, "--backend", "sim", "--actual-lengths", EXAMPLE, "--length-field", "lengths",
                       "--prompts", "100", "--log", "L", "-o", "o", "-q")  # fmt: skip
    assert probe.exit_code == 0, probe.output
    assert invoke_cli("predict", "default", EXAMPLE, "-o", "p.parquet", "-q").exit_code == 0


def test_default_directory_by_its_path_and_the_implicit_default_still_work(tmp_path, monkeypatch) -> None:
    from aspc.predict import default_predictor_path

    monkeypatch.chdir(tmp_path)
    shutil.copytree(default_predictor_path(), "default")
    assert invoke_cli("predict", "./default", EXAMPLE, "-o", "o.parquet", "-q").exit_code == 0
    assert invoke_cli("compile", EXAMPLE, "-o", "plan.parquet", "-q").exit_code == 0  # no name given: shipped one


# -- 5: the shipped predictor is an input --------------------------------------------------------


def _digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_the_shipped_predictor_is_never_written(tmp_path) -> None:
    from aspc.predict import default_predictor_path

    shipped = default_predictor_path()
    before = _digest(shipped)
    refused = [
        (("predict", "train", EXAMPLE, "--length-field", "lengths", "--init", "default", "-o", shipped),
         "is also an input"),
        (("predict", "train", EXAMPLE, "--length-field", "lengths", "--kind", "static", "-o", shipped),
         "is also an input"),  # its prior
        (("predict", "default", EXAMPLE, "-o", shipped / "preds.parquet"), "lies inside the input directory"),
        (("compile", EXAMPLE, "--predictor", "default", "-o", shipped / "plan.parquet"),
         "lies inside the input directory"),
        (("compile", EXAMPLE, "-o", shipped / "plan.parquet"), "lies inside the input directory"),
        (("probe", EXAMPLE, "--backend", "sim", "--actual-lengths", EXAMPLE, "--length-field", "lengths",
          "--prompts", "100", "--log", shipped / "L", "-o", tmp_path / "o"), "lies inside the input directory"),
        (("probe", EXAMPLE, "--backend", "sim", "--actual-lengths", EXAMPLE, "--length-field", "lengths",
          "--init", "none", "--prompts", "100", "--log", tmp_path / "L", "-o", shipped / "o"),
         "lies inside the input directory"),  # --init none still schedules the probe with it
    ]  # fmt: skip
    for args, words in refused:
        assert words in one_line_error(invoke_cli(*args, "-q"), 2), args
        assert _digest(shipped) == before, args
