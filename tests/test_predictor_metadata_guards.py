"""Hand-edited or damaged static and transformer predictor directories, and history metadata of any
predictor: each is refused with one ``Error:`` line (exit 2) and no plan, never a traceback, a NumPy
warning or a silently changed prediction. Both predictors are trained once on a tiny random encoder."""

from __future__ import annotations

import dataclasses
import json
import shutil
import string
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import invoke_cli, lognormal_records, one_line_error, save_tiny_bert, write_jsonl


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide BERT with random weights (seconds to distil or train on, where MiniLM takes ~20 s)."""
    pytest.importorskip("torch", reason="needs torch: pip install 'aspc[predict]'")
    pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[predict]'")
    words = ["prompt", "number", "word"]
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-encoder"), words, string.ascii_lowercase + string.digits)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """120 prompts with four lengths each, and a history of one length for the first 60 of them."""
    d = tmp_path_factory.mktemp("data")
    records = lognormal_records(120)
    hist = [{"id": r["id"], "length": r["lengths"][0]} for r in records[:60]]
    return {"dir": d, "prompts": write_jsonl(d / "x.jsonl", records), "history": write_jsonl(d / "h.jsonl", hist)}


def _train(data: dict[str, Path], tiny: Path, kind: str, *extra: str) -> Path:
    out = data["dir"] / kind
    r = invoke_cli("predict", "train", data["prompts"], "--length-field", "lengths", "--kind", kind,
                   "--base-model", tiny, *extra, "-o", out, "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def static(data, tiny) -> Path:
    return _train(data, tiny, "static")


@pytest.fixture(scope="module")
def transformer(data, tiny) -> Path:
    return _train(data, tiny, "transformer", "--freeze-encoder", "--epochs", "1", "--device", "cpu")


def _edited(src: Path, dst: Path, meta_edit: Any = None, head_edit: Any = None, table: Any = None) -> Path:
    """A copy of ``src`` with its metadata and (static) arrays changed; array edits drop the weights' hash."""
    shutil.copytree(src, dst)
    meta = json.loads((dst / "metadata.json").read_text())
    if meta_edit is not None:
        meta_edit(meta)
    if head_edit is not None or table is not None:
        meta.pop("weights_sha256")  # without it nothing else notices the edit
    if head_edit is not None:
        with np.load(dst / "head.npz") as z:
            head = {k: z[k] for k in z.files}
        head_edit(head)
        np.savez(dst / "head.npz", **head)
    if table is not None:
        np.save(dst / "table.npy", table(np.load(dst / "table.npy")))
    (dst / "metadata.json").write_text(json.dumps(meta))
    return dst


def _compile_error(data: dict[str, Path], pred: Path, *extra: object) -> str:
    out = pred.parent / "out.parquet"  # the test's own tmp_path: a plan an earlier test wrote is not this one's
    msg = one_line_error(invoke_cli("compile", data["prompts"], "--predictor", pred, *extra, "-o", out, "-q"), 2)
    assert not out.exists()
    return msg


def _eval_error(data: dict[str, Path], pred: Path) -> str:
    return one_line_error(invoke_cli("predict", "eval", pred, data["prompts"], "--length-field", "lengths", "--json"), 2)


def _set(key: str, value: Any, section: str | None = None) -> Any:
    def edit(meta: dict[str, Any]) -> None:
        (meta if section is None else meta[section])[key] = value

    return edit


def test_unedited_predictors_compile(data, static, transformer) -> None:
    for pred in (static, transformer):
        r = invoke_cli("compile", data["prompts"], "--predictor", pred, "--history", data["history"],
                       "-o", data["dir"] / f"{pred.name}.parquet", "-q")  # fmt: skip
        assert r.exit_code == 0, r.output


@pytest.mark.parametrize("targets", [["a", "b"], "abc", ["a", "a"], [""], [1], None])
def test_static_targets_must_name_the_heads(tmp_path, data, static, targets) -> None:
    # Two target names on a predictor with one head indexed past its intercepts: IndexError.
    pred = _edited(static, tmp_path / "t", _set("targets", targets))
    for msg in (_compile_error(data, pred), _eval_error(data, pred)):
        assert "targets" in msg and msg.endswith("; retrain it"), msg


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("history_kappa", "x"),
        ("history_kappa", float("nan")),
        ("history_kappa", -1),
        ("history_kappa", 0),
        ("history_kappa", True),
        ("history_within_log_var", "x"),
        ("history_within_log_var", float("inf")),
        ("history_within_band_var", "x"),
        ("history_within_band_var", -5),
        ("history_within_log_var_by_target", 5),
        ("history_within_band_var_by_target", {"m": "x"}),
    ],
)
def test_history_metadata_is_checked(tmp_path, data, static, field, value) -> None:
    # Before: ValueError, a NumPy loop error or AttributeError, and a NaN or negative kappa went into the plan.
    pred = _edited(static, tmp_path / "t", _set(field, value))
    msg = _compile_error(data, pred, "--history", data["history"])
    assert f"metadata {field} " in msg and msg.endswith("; retrain it"), msg


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.pop("norm"),
        _set("norm", "x"),
        _set("norm", [0.0]),
        _set("norm", [0.0, 0.0]),
        _set("norm", [5.0, float("nan")]),
        lambda m: m.pop("cqr_adjust"),
        _set("cqr_adjust", "x"),
        _set("cqr_adjust", None),
        _set("cqr_adjust", float("inf")),
        _set("max_tokens", -5, "config"),
        _set("max_tokens", 0, "config"),
        _set("max_tokens", 2.5, "config"),
        _set("targets", "a"),
    ],
    ids=["no-norm", "norm-str", "norm-short", "norm-zero-std", "norm-nan", "no-cqr", "cqr-str", "cqr-null", "cqr-inf",
         "max-tokens-neg", "max-tokens-0", "max-tokens-float", "targets-str"],
)  # fmt: skip
def test_transformer_metadata_is_checked(tmp_path, data, transformer, edit) -> None:
    # Before: KeyError, TypeError or ValueError from prediction, and a long traceback from the tokenizer.
    pred = _edited(transformer, tmp_path / "t", edit)
    msg = _compile_error(data, pred)
    assert "transformer predictor files are missing or corrupt" in msg and msg.endswith("; retrain it"), msg


@pytest.mark.parametrize(
    ("key", "value"),
    [("head_chars", -5), ("tail_chars", -1000), ("head_chars", 1e300), ("head_chars", 0), ("head_chars", "512"),
     ("tail_chars", True), ("tail_chars", 10**7)],
)  # fmt: skip
def test_static_cut_must_be_a_sane_integer(tmp_path, data, static, key, value) -> None:
    # Not in the weights' hash: an edited cut silently changed the plan under the same predictor hash.
    pred = _edited(static, tmp_path / "t", _set(key, value, "config"))
    msg = _compile_error(data, pred)
    assert f"config.{key} {value!r} is not an integer" in msg, msg


@pytest.mark.parametrize(("key", "value"), [("head_chars", 1024), ("tail_chars", 0)])
def test_static_cut_in_range_is_in_the_hash(tmp_path, data, static, key, value) -> None:
    # A sane but edited cut changes every prediction: before, the weights' hash did not cover it
    # and the plan named the trained predictor's hash.
    pred = _edited(static, tmp_path / "t", _set(key, value, "config"))
    msg = _compile_error(data, pred)
    assert "weights do not match their recorded hash" in msg, msg


def test_static_cut_changes_the_identity_only_off_its_default(static) -> None:
    from aspc.predict.static import StaticPredictor

    pred = StaticPredictor.load(static)
    assert (pred.config.head_chars, pred.config.tail_chars) == (512, 128)
    trained = pred.content_hash()
    meta = json.loads((static / "metadata.json").read_text())
    assert meta["weights_sha256"] == trained  # the trained cut adds nothing: hashes (and plans) stay
    pred.config, pred._hash = dataclasses.replace(pred.config, head_chars=1024), None
    assert pred.content_hash() != trained


def _head(key: str, value: Any) -> Any:
    def edit(head: dict[str, np.ndarray]) -> None:
        head[f"head_{key}"] = value(head[f"head_{key}"])

    return edit


@pytest.mark.parametrize(
    ("head", "table"),
    [
        (_head("intercepts", lambda v: v[:0]), None),
        (_head("intercepts", lambda v: v[:1]), None),
        (_head("intercepts", lambda v: np.stack([v, v])), None),
        (_head("sd", np.zeros_like), None),
        (_head("mu", lambda v: np.full_like(v, np.nan)), None),
        (_head("w", lambda v: v[:-1]), None),
        (_head("w_len", lambda v: v.astype(np.complex128)), None),
        (None, lambda t: t.astype(np.complex64)),
        (None, lambda t: np.where(np.arange(t.shape[1]) == 3, np.inf, t).astype(t.dtype)),
        (None, lambda t: t[0]),
    ],
    ids=["intercepts-empty", "intercepts-one", "intercepts-2d", "sd-zero", "mu-nan", "w-short", "w-len-complex",
         "table-complex", "table-inf", "table-1d"],
)  # fmt: skip
def test_static_arrays_are_checked_without_their_hash(tmp_path, data, static, head, table) -> None:
    # Before: IndexError, a broadcasting ValueError, NaN predictions with exit 0, a ComplexWarning.
    pred = _edited(static, tmp_path / "t", head_edit=head, table=table)
    # Recorded, not raised: an error-filter would turn the warning into an exception the load wraps anyway.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        msgs = [_compile_error(data, pred), _eval_error(data, pred)]
    assert not [str(w.message) for w in caught]
    for msg in msgs:
        assert "static predictor files are missing or corrupt" in msg and msg.endswith("; retrain it"), msg


def test_format_version_string_is_shown_as_one(tmp_path, data, static) -> None:
    # Before: "predictor format version 2, this aspc reads version 2".
    pred = _edited(static, tmp_path / "t", _set("format_version", "2"))
    assert "predictor format version '2', this aspc reads version 2" in _compile_error(data, pred)
