"""Damaged or hand-edited predictor directories (``aspc predict DIR``, ``--predictor DIR``, ``predict eval DIR``,
``predict train --init DIR`` and ``-o DIR``) that once got past the loaders.

Covered: metadata.json nested 100,000 deep (as the predictor read and as the ``-o`` directory); static and
transformer weights edited so that predictions are NaN or inf (refused as the lexical kind refuses them);
out-of-range refit settings (lexical ``config.lam``/``folds``/``calibration_bins``/``max_iter``, static
``config.lam_grid``); a ``shared_band`` that is not true or false; a weights.npz member whose header claims a
huge shape. Each is one ``Error:`` line and a non-zero exit, never a traceback, a NaN in an output, or a
silently changed prediction. Target names edited in metadata.json (outside the weights hash) are refused by
``targets_sha256``; a directory without that field (older aspc) loads as before.
"""

from __future__ import annotations

import io
import json
import shutil
import string
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import lognormal_records, save_tiny_bert, write_jsonl


def _cli(*args: object):
    """``aspc ARGS`` in process, exceptions caught: a traceback shows as ``result.exception``."""
    from aspc.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


def _refused(result) -> str:
    """The one ``Error:`` line of a refused command (no traceback, non-zero exit)."""
    exc = result.exception
    assert exc is None or isinstance(exc, SystemExit), f"traceback: {exc!r}"
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code != 0, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("data")
    records = lognormal_records(120)
    for i, r in enumerate(records):
        r["model"] = ("alpha", "beta", "gamma")[i % 3]
    return {"dir": d, "prompts": write_jsonl(d / "x.jsonl", records)}


def _train(data: dict[str, Path], name: str, *extra: object) -> Path:
    out = data["dir"] / name
    r = _cli("predict", "train", data["prompts"], "--length-field", "lengths", *extra, "-o", out, "-q")
    assert r.exit_code == 0 and r.exception is None, r.output
    return out


@pytest.fixture(scope="module")
def lexical(data) -> Path:
    return _train(data, "lex")


@pytest.fixture(scope="module")
def lexical_targets(data) -> Path:
    return _train(data, "lexT", "--target-field", "model")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide random BERT (seconds to distil or fine-tune)."""
    pytest.importorskip("torch", reason="needs torch")
    pytest.importorskip("transformers", reason="needs transformers")
    return save_tiny_bert(tmp_path_factory.mktemp("tiny"), ["prompt", "number", "word"],
                          string.ascii_lowercase + string.digits)  # fmt: skip


@pytest.fixture(scope="module")
def static(data, tiny) -> Path:
    return _train(data, "static", "--kind", "static", "--base-model", tiny, "--no-prior")


def _copy(src: Path, dst: Path, edit: Any = None, drop_hash: bool = False) -> Path:
    shutil.copytree(src, dst)
    meta = json.loads((dst / "metadata.json").read_text())
    if edit is not None:
        edit(meta)
    if drop_hash:
        meta.pop("weights_sha256")
    (dst / "metadata.json").write_text(json.dumps(meta))
    return dst


def _predict(pred: Path, data: dict[str, Path], out: Path, *extra: object):
    return _cli("predict", pred, data["prompts"], "-o", out, "-q", *extra)


# -- unedited predictors answer finite, ordered quantiles, the same bytes twice --------------------
def test_unedited_lexical_predictions_are_finite_ordered_and_reproducible(tmp_path, data, lexical) -> None:
    import pyarrow.parquet as pq

    outs = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    for out in outs:
        r = _predict(lexical, data, out)
        assert r.exit_code == 0, r.output
    assert outs[0].read_bytes() == outs[1].read_bytes()
    t = pq.read_table(outs[0]).to_pydict()
    q10, q50, q90 = (np.array(t[f"predicted_q{q}"]) for q in (10, 50, 90))
    assert np.all(np.isfinite(q90)) and np.all(q10 > 0) and np.all(q10 <= q50) and np.all(q50 <= q90)


# -- deeply nested metadata.json: the 'unreadable' / 'not an aspc predictor' line ---------------------
# Was: a RecursionError traceback, exit 1 (base.py read_metadata caught only JSONDecodeError/UnicodeDecodeError).
def test_deeply_nested_metadata_is_unreadable(tmp_path, data, lexical) -> None:
    bad = shutil.copytree(lexical, tmp_path / "deep")
    (bad / "metadata.json").write_text("[" * 100_000 + "]" * 100_000)
    out = tmp_path / "p.parquet"
    assert "metadata.json" in _refused(_predict(bad, data, out))
    assert not out.exists()


# Was: a RecursionError traceback from base.py check_output_dir (it caught OSError/ValueError only).
def test_deeply_nested_metadata_in_output_dir_is_not_a_predictor(tmp_path, data, lexical) -> None:
    bad = tmp_path / "deep"
    bad.mkdir()
    (bad / "metadata.json").write_text("[" * 100_000 + "]" * 100_000)
    msg = _refused(_cli("predict", "train", data["prompts"], "--length-field", "lengths", "-o", bad, "-q"))
    assert "not an aspc predictor" in msg
    assert [p.name for p in bad.iterdir()] == ["metadata.json"]


# -- non-finite predictions are refused by every kind -------------------------------------------------
# Was: exit 0 and NaN in every predicted_* column (static.py predict had no finite check like lexical's).
def test_static_non_finite_predictions_are_refused(tmp_path, data, static) -> None:
    bad = _copy(static, tmp_path / "bad", drop_hash=True)
    with np.load(bad / "head.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["head_intercepts"] = arrays["head_intercepts"] + 1e5
    np.savez(bad / "head.npz", **arrays)
    out = tmp_path / "p.parquet"
    assert "not finite" in _refused(_predict(bad, data, out))
    assert not out.exists()


def test_lexical_non_finite_predictions_are_refused(tmp_path, data, lexical) -> None:
    """The lexical kind refuses the same edit (it always did; the other kinds now share its check)."""
    bad = _copy(lexical, tmp_path / "bad", drop_hash=True)
    with np.load(bad / "weights.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["intercepts"] = arrays["intercepts"] + 1e5
    np.savez_compressed(bad / "weights.npz", **arrays)
    out = tmp_path / "p.parquet"
    assert "not finite" in _refused(_predict(bad, data, out))
    assert not out.exists()


# Was: exit 0 and NaN in every predicted_* column (transformer.py predict had no finite check like lexical's).
def test_transformer_non_finite_predictions_are_refused(tmp_path, data, tiny) -> None:
    from safetensors.numpy import load_file, save_file

    pred = _train(data, "transformer", "--kind", "transformer", "--base-model", tiny, "--freeze-encoder",
                  "--epochs", "1", "--device", "cpu")  # fmt: skip
    bad = _copy(pred, tmp_path / "bad", drop_hash=True)
    w = load_file(str(bad / "model.safetensors"))
    w["head.3.bias"][:] = np.nan
    save_file(w, str(bad / "model.safetensors"))
    out = tmp_path / "p.parquet"
    assert "not finite" in _refused(_predict(bad, data, out, "--device", "cpu"))
    assert not out.exists()


# -- lexical refit settings from metadata are range-checked at load -----------------------------------
# Was: lam -1 or 0 a ValueError traceback ('lam must be positive', ridge.py), Infinity a ZeroDivisionError.
@pytest.mark.parametrize("lam", [-1.0, 0.0, float("inf")])
def test_lexical_init_with_bad_lam_is_one_line(tmp_path, data, lexical, lam) -> None:
    bad = _copy(lexical, tmp_path / "bad", lambda m: m["config"].__setitem__("lam", lam))
    out = tmp_path / "out"
    msg = _refused(
        _cli("predict", "train", data["prompts"], "--length-field", "lengths", "--init", bad, "-o", out, "-q")
    )
    assert "lam" in msg
    assert not out.exists()


# Was: NaN lam refused as 'give more varied prompts'; max_iter -1 refit silently with 0 iterations; folds 0
# and calibration_bins 0 (or 2.5, cast by int()) loaded as if training had written them.
@pytest.mark.parametrize(("key", "value"), [("lam", float("nan")), ("lam", "1.0"), ("max_iter", -1), ("folds", 0),
                                            ("calibration_bins", 0), ("calibration_bins", 2.5)])  # fmt: skip
def test_lexical_out_of_range_config_is_refused_naming_it(tmp_path, data, lexical, key, value) -> None:
    bad = _copy(lexical, tmp_path / "bad", lambda m: m["config"].__setitem__(key, value))
    out = tmp_path / "p.parquet"
    assert f"config.{key}" in _refused(_predict(bad, data, out))
    assert not out.exists()


# -- static refit penalty grid from metadata is checked at load ----------------------------------------
# Was: [] a bare AssertionError traceback in static_train ('assert best is not None'); [-1.0] refit silently
# with a negative ridge penalty.
@pytest.mark.parametrize("grid", [[], [-1.0], [0.1, float("nan")]])
def test_static_init_with_bad_lam_grid_is_one_line(tmp_path, data, static, grid) -> None:
    bad = _copy(static, tmp_path / "bad", lambda m: m["config"].__setitem__("lam_grid", grid))
    out = tmp_path / "out"
    r = _cli("predict", "train", data["prompts"], "--length-field", "lengths", "--kind", "static", "--init", bad,
             "-o", out, "-q")  # fmt: skip
    assert "config.lam_grid" in _refused(r)
    assert not out.exists()


# -- shared_band must be true or false -------------------------------------------------------------------
# Was: "false" (a true string) read by truthiness: exit 0, every target head's q10/q90 silently changed.
@pytest.mark.parametrize("value", ["false", 1])
def test_shared_band_not_a_bool_is_refused(tmp_path, data, lexical_targets, value) -> None:
    bad = _copy(lexical_targets, tmp_path / "bad", lambda m: m.__setitem__("shared_band", value))
    out = tmp_path / "p.parquet"
    assert "shared_band" in _refused(_predict(bad, data, out, "--target", "alpha"))
    assert not out.exists()


# -- target names are bound to their heads by targets_sha256 ----------------------------------------------
# Was: exit 0 with alpha's head for --target beta, and --json reported the unedited directory's predictor hash
# (the names are outside the weights hash, which cannot take them without changing every existing hash).
def test_swapped_target_names_do_not_keep_the_identity(tmp_path, data, lexical_targets) -> None:
    def swap(m: dict[str, Any]) -> None:
        m["targets"][0], m["targets"][1] = m["targets"][1], m["targets"][0]

    bad = _copy(lexical_targets, tmp_path / "bad", swap)
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    ra = _cli("predict", lexical_targets, data["prompts"], "-o", a, "--json", "--target", "beta")
    rb = _cli("predict", bad, data["prompts"], "-o", b, "--json", "--target", "beta")
    if rb.exit_code != 0:
        assert "target names do not match their recorded hash" in _refused(rb)
        assert not b.exists()
        return
    assert ra.exit_code == 0
    same_hash = json.loads(ra.output)["predictor"]["hash"] == json.loads(rb.output)["predictor"]["hash"]
    assert not (same_hash and a.read_bytes() != b.read_bytes())


def test_directory_without_targets_hash_still_loads_and_predicts(tmp_path, data, lexical_targets) -> None:
    """A directory written before ``targets_sha256`` existed: same identity, same predictions."""
    old = _copy(lexical_targets, tmp_path / "old", lambda m: m.pop("targets_sha256"))
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    ra = _cli("predict", lexical_targets, data["prompts"], "-o", a, "--json", "--target", "beta")
    rb = _cli("predict", old, data["prompts"], "-o", b, "--json", "--target", "beta")
    assert ra.exit_code == 0 and rb.exit_code == 0, rb.output
    assert json.loads(ra.output)["predictor"]["hash"] == json.loads(rb.output)["predictor"]["hash"]
    assert a.read_bytes() == b.read_bytes()


def test_tampered_targets_hash_is_refused(tmp_path, data, lexical_targets) -> None:
    bad = _copy(lexical_targets, tmp_path / "bad", lambda m: m.__setitem__("targets_sha256", "0" * 64))
    out = tmp_path / "p.parquet"
    msg = _refused(_predict(bad, data, out, "--target", "beta"))
    assert "target names do not match their recorded hash" in msg and msg.endswith("retrain it"), msg
    assert not out.exists()


# -- a weights member whose header claims a huge shape is corrupt weights ------------------------------
def _fake_npy(shape: tuple[int, ...]) -> bytes:
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': " + repr(shape) + ", }"
    hdr += " " * (118 - len(hdr)) + "\n"
    return b"\x93NUMPY\x01\x00" + len(hdr).to_bytes(2, "little") + hdr.encode() + b"\0" * 64


# Was: 'Error: out of memory; try a smaller input or batch' (the CLI's generic handler), blaming the input.
def test_weights_member_with_huge_header_shape_is_corrupt(tmp_path, data, lexical) -> None:
    bad = _copy(lexical, tmp_path / "bad", drop_hash=True)
    with np.load(bad / "weights.npz") as z:
        arrays = {k: z[k] for k in z.files}
    with zipfile.ZipFile(bad / "weights.npz", "w") as zf:
        for k, v in arrays.items():
            buf = io.BytesIO()
            np.save(buf, v)
            zf.writestr(k + ".npy", _fake_npy((2**40,)) if k == "beta" else buf.getvalue())
    out = tmp_path / "p.parquet"
    assert "corrupt" in _refused(_predict(bad, data, out))
    assert not out.exists()
