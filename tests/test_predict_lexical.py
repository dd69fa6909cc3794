"""Lexical predictor: features, solver, training, persistence, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from aspc.errors import ConfigError, InputError, PredictorError
from aspc.predict import load_predictor, train_predictor
from aspc.predict.base import FORMAT_VERSION
from aspc.predict.features import FeatureConfig, featurize
from aspc.predict.lexical import LexicalPredictor
from aspc.predict.lexical_train import train_lexical
from aspc.predict.metrics import baseline_prediction, evaluate
from aspc.predict.ridge import ridge_fit

# Length words with a real effect: the response length follows the instruction.
STYLES = {
    "in one word": 3,
    "in one sentence": 25,
    "briefly": 60,
    "in a paragraph": 150,
    "in detail": 400,
    "as a long essay": 900,
}
TOPICS = ["cats", "the ocean", "rust lifetimes", "roman history", "tea", "sorting", "jazz", "volcanoes"]


def synthetic(n: int, seed: int = 0, k: int = 4) -> tuple[list[str], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    names = list(STYLES)
    texts, lengths = [], []
    for i in range(n):
        style = names[rng.integers(len(names))]
        topic = TOPICS[rng.integers(len(TOPICS))]
        texts.append(f"Explain {topic} {style}. (request {i})")
        lengths.append(np.maximum(1, np.round(rng.lognormal(np.log(STYLES[style]), 0.3, size=k))))
    return texts, lengths


@pytest.fixture(scope="module")
def trained() -> tuple[LexicalPredictor, list[str], list[np.ndarray]]:
    texts, lengths = synthetic(600)
    return train_lexical(texts[:500], lengths[:500], seed=0), texts[500:], lengths[500:]


def test_features_are_stable_across_processes() -> None:
    cfg = FeatureConfig(bits=12, char_ngrams=(3,))
    f = featurize(["Hello wörld, hello!", ""], cfg)
    code = (
        "from aspc.predict.features import FeatureConfig, featurize;"
        "f = featurize(['Hello wörld, hello!', ''], FeatureConfig(bits=12, char_ngrams=(3,)));"
        "print(sorted(f.cols.tolist()))"
    )
    # A different PYTHONHASHSEED must not change the buckets (saved weights depend on them).
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
        cwd=str(__import__("pathlib").Path.cwd()),
    )
    assert json.loads(out.stdout) == sorted(f.cols.tolist())
    assert f.n_rows == 2 and f.cols.max() < 4096
    # Case-insensitive words: "Hello" and "hello" share a bucket.
    words = featurize(["Hello", "hello"], FeatureConfig(bits=12, word_bigrams=False))
    assert sorted(words.cols[words.rows == 0]) == sorted(words.cols[words.rows == 1])


def test_ridge_matches_dense_solution() -> None:
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(list("abcdefgh"), size=rng.integers(1, 8))) for _ in range(80)]
    f = featurize(texts, FeatureConfig(bits=6, word_bigrams=False)).compact()
    y = rng.normal(size=80)
    lam = 0.7
    sol = ridge_fit(f, y, lam, tol=1e-12, max_iter=2000)
    h = np.zeros((80, f.n_hashed))
    np.add.at(h, (f.rows, f.cols), f.vals)
    # Closed form with unpenalised dense columns: augment and solve the normal equations.
    x = np.hstack([f.dense, h])
    pen = np.r_[np.zeros(f.dense.shape[1]), np.full(f.n_hashed, lam)]
    w = np.linalg.lstsq(x.T @ x + np.diag(pen), x.T @ y, rcond=None)[0]
    np.testing.assert_allclose(x @ w, sol.predict(f), atol=1e-6)


def test_learns_and_beats_baseline(trained) -> None:
    pred, texts, lengths = trained
    res = evaluate(pred.predict(texts), lengths)
    base = evaluate(baseline_prediction(len(texts), pred.metadata["marginal"]), lengths)
    assert res["kendall_tau"] > 0.6 > base["kendall_tau"] + 0.5
    assert res["mae"] < 0.5 * base["mae"]
    assert 0.6 < res["coverage_q10_q90"] < 0.95
    p = pred.predict(texts)
    assert np.all((p.q10 <= p.q50) & (p.q50 <= p.q90) & (p.q10 > 0))
    meta = pred.metadata
    assert meta["validation"]["n"] == 50 and len(meta["training"]["data_sha256"]) == 64
    assert meta["history_kappa"] > 0


def test_save_load_identical_and_deterministic(trained, tmp_path) -> None:
    pred, texts, _ = trained
    pred.save(tmp_path / "p")
    again = load_predictor(tmp_path / "p")
    a, b = pred.predict(texts), again.predict(texts)
    for f in ("mean", "q10", "q50", "q90"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert again.identity() == pred.identity() and again.identity()["format_version"] == FORMAT_VERSION
    t2, l2 = synthetic(600)
    other = train_lexical(t2[:500], l2[:500], seed=0)
    assert other.content_hash() == pred.content_hash()  # same data and seed: same weights
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]  # no temporary leftovers
    other.save(tmp_path / "q")  # byte for byte, metadata too (it held the training's wall-clock seconds)
    for f in sorted(x.name for x in (tmp_path / "p").iterdir()):
        assert (tmp_path / "p" / f).read_bytes() == (tmp_path / "q" / f).read_bytes(), f


def test_targets_share_text_weights_with_own_levels() -> None:
    texts, lengths = synthetic(300, seed=2)
    t = texts + texts
    lens = lengths + [a * 3 for a in lengths]
    pred = train_lexical(t, lens, targets=["small-model"] * 300 + ["Verbose-Model-7B"] * 300, seed=0)
    pooled = pred.predict(texts[:20]).mean
    small = pred.with_target("small").predict(texts[:20]).mean
    verbose = pred.with_target("verbose-model-7b").predict(texts[:20]).mean
    np.testing.assert_allclose(verbose / small, 3.0, rtol=0.15)
    assert np.all((small < pooled) & (pooled < verbose))
    assert pred.with_target("verbose").identity()["target"] == "Verbose-Model-7B"
    with pytest.raises(ConfigError, match="matches none"):
        pred.with_target("llama")
    with pytest.raises(ConfigError, match="matches several"):
        pred.with_target("model")
    assert set(pred.metadata["validation"]["per_target"]) == {"small-model", "Verbose-Model-7B"}


def test_a_target_named_exactly_wins_over_one_differing_by_case():
    # Heads 'A' and 'a': '--target a' took 'A' (the first case-insensitive match); 'a' was unreachable.
    from aspc.predict.lexical import resolve_target

    assert resolve_target("a", ["A", "a"]) == "a" and resolve_target("A", ["A", "a"]) == "A"
    assert resolve_target("qwen", ["Qwen", "Qwen2.5"]) == "Qwen"  # equal ignoring case beats containing
    names = ["Qwen--Qwen2.5-14B-Instruct", "google--gemma-3-12b-it", "google--gemma-3-4b-it"]
    with pytest.raises(ConfigError, match="matches several") as err:
        resolve_target("gemma", names)
    assert "gemma-3-12b-it, google--gemma-3-4b-it; give one of them in full" in str(err.value)
    assert "Qwen" not in str(err.value)  # only the targets that matched


@pytest.mark.parametrize(
    "texts,lengths,match",
    [
        ([], [], "empty"),
        (["a"] * 10, [1.0] * 10, "at least 50"),
        (["a"] * 60, [1.0] * 59 + [-3.0], "negative"),
        (["a"] * 60, [1.0] * 59 + ["many"], "not a number"),
        (["a"] * 60, [1.0] * 59 + [float("nan")], "not finite"),
        (["a"] * 60, [1.0] * 59 + [[]], "no length"),
        (["a"] * 60, [1.0] * 59, "59 length"),
    ],
)
def test_bad_training_input(texts, lengths, match) -> None:
    with pytest.raises(InputError, match=match):
        train_predictor("lexical", texts, lengths)


def test_bad_options() -> None:
    texts, lengths = synthetic(60)
    with pytest.raises(ConfigError, match="unknown predictor kind"):
        train_predictor("magic", texts, lengths)
    with pytest.raises(ConfigError, match="transformer only"):
        train_predictor("lexical", texts, lengths, epochs=2)
    with pytest.raises(ConfigError, match="validation split"):
        train_predictor("lexical", texts, lengths, validation_split=1.5)


def test_load_errors(trained, tmp_path) -> None:
    pred, _, _ = trained
    with pytest.raises(PredictorError, match="no such predictor directory"):
        load_predictor(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PredictorError, match="not an aspc predictor"):
        load_predictor(tmp_path / "empty")
    pred.save(tmp_path / "p")
    with pytest.raises(PredictorError, match="expected transformer"):
        load_predictor(tmp_path / "p", kind="transformer")
    meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
    (tmp_path / "p" / "metadata.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(PredictorError, match="version 99"):
        load_predictor(tmp_path / "p")
    (tmp_path / "p" / "metadata.json").write_text(json.dumps({**meta, "aspc_predictor": "oracle"}))
    with pytest.raises(PredictorError, match="unknown predictor kind"):
        load_predictor(tmp_path / "p")
    (tmp_path / "p" / "metadata.json").write_text(json.dumps(meta))
    (tmp_path / "p" / "weights.npz").write_bytes(b"not an npz")
    with pytest.raises(PredictorError, match="corrupt"):
        load_predictor(tmp_path / "p")


def _edited(pred, tmp_path, name, *, arrays=None, config=None):
    """``pred`` saved, then its weights or feature configuration edited by hand, the hash dropped
    (a predictor without ``weights_sha256`` loads: the README allows it)."""
    d = tmp_path / name
    pred.save(d)
    with np.load(d / "weights.npz") as z:
        a = {k: z[k] for k in z.files}
    np.savez_compressed(d / "weights.npz", **{**a, **(arrays or {})})
    meta = json.loads((d / "metadata.json").read_text())
    del meta["weights_sha256"]
    meta["config"]["features"].update(config or {})
    (d / "metadata.json").write_text(json.dumps(meta))
    return d


@pytest.mark.parametrize(
    "arrays",
    [{"alpha": np.zeros(3)}, {"alpha": np.full(5, np.nan)}, {"intercepts": np.zeros((2, 2))},
     {"intercepts": np.array([1e5, 1e5])}, {"cal0_slope": np.zeros(0)}, {"cal0_slope": np.array([np.inf])},
     {"cal0_centers": np.array([-np.inf, 5.0])}],
    ids=["alpha-shape", "alpha-nan", "intercepts-2d", "intercepts-huge", "slope-empty", "slope-inf", "centre-inf"],
)  # fmt: skip
def test_edited_weights_are_refused_in_one_line(trained, tmp_path, arrays) -> None:
    pred, texts, _ = trained
    if "cal0_centers" in arrays:
        with np.load(_edited(pred, tmp_path, "probe") / "weights.npz") as z:
            arrays = {"cal0_centers": np.concatenate([arrays["cal0_centers"][:1], z["cal0_centers"][1:]])}
    d = _edited(pred, tmp_path, "p", arrays=arrays)
    with pytest.raises(PredictorError, match="missing or corrupt"):
        load_predictor(d).predict(texts)


@pytest.mark.parametrize(
    "config",
    [{"head_bytes": -1}, {"tail_bytes": 10**11}, {"char_ngrams": [0]}, {"word_bigrams": "false"},
     {"bits": True}, {"bits": 18.0}],
)  # fmt: skip
def test_edited_feature_configuration_is_refused(trained, tmp_path, config) -> None:
    pred, texts, _ = trained
    with pytest.raises(PredictorError, match="missing or corrupt"):
        load_predictor(_edited(pred, tmp_path, "p", config=config))


@pytest.mark.parametrize(
    "kwargs", [{"word_bigrams": 1}, {"head_bytes": 1 << 30}, {"char_ngrams": (0,)}, {"bits": 18.0}, {"tail_bytes": -1}]
)
def test_feature_configuration_the_loader_refuses_is_refused_when_built(kwargs) -> None:
    """A configuration built in Python obeys the loader's rules: it used to train and save, then fail to load."""
    with pytest.raises(ValueError, match="features\\."):
        FeatureConfig(**kwargs)


def test_feature_configuration_built_in_python_round_trips() -> None:
    cfg = FeatureConfig(char_ngrams=[3], bits=np.int64(12), word_bigrams=np.bool_(False))
    assert cfg == FeatureConfig(char_ngrams=(3,), bits=12, word_bigrams=False)
    assert FeatureConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize("edit", [{"max": -1.0}, {"min": "0"}, {"min": 50.0, "max": 10.0}, {"max": None}])
def test_edited_length_range_is_refused(trained, tmp_path, edit) -> None:
    """The training lengths' range bounds how far predictions stray; a hand-edited one is refused."""
    pred, texts, _ = trained
    pred.save(tmp_path / "p")
    meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
    assert {"min", "max"} <= set(meta["marginal"])
    meta["marginal"].update(edit)
    (tmp_path / "p" / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(PredictorError, match=f"^{tmp_path / 'p'}: predictor metadata marginal min/max"):
        load_predictor(tmp_path / "p")  # refused on load, naming the directory


def test_failed_save_leaves_target_untouched(trained, tmp_path, monkeypatch) -> None:
    pred, texts, _ = trained
    pred.save(tmp_path / "p")
    before = load_predictor(tmp_path / "p").predict(texts).mean

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("aspc.predict.lexical.write_metadata", boom)
    with pytest.raises(OSError):
        pred.save(tmp_path / "p")
    np.testing.assert_array_equal(load_predictor(tmp_path / "p").predict(texts).mean, before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]


def test_default_predictor_ships_and_predicts() -> None:
    pred = load_predictor("default")
    assert pred.kind == "lexical" and pred.metadata["name"] == "default"
    p = pred.predict(["Write a haiku about autumn.", "Implement a red-black tree in C++ with full deletion."])
    assert np.all(p.mean > 0) and np.all(p.q10 <= p.q90)
    qwen = load_predictor("default", target="qwen2.5-7b")
    assert qwen.identity()["target"] == "Qwen--Qwen2.5-7B-Instruct-1M"
    assert qwen.identity()["hash"] == pred.identity()["hash"]


def test_default_predictor_needs_no_torch() -> None:
    code = (
        "import sys; from aspc.predict import load_predictor;"
        "load_predictor('default').predict(['hello there']);"
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_validation_split_that_leaves_too_few_to_train_is_refused(tmp_path) -> None:
    from aspc.predict.base import validation_prompt_count

    texts, lengths = synthetic(200)
    n = len(set(texts))
    with pytest.raises(ConfigError, match=rf"--validation-split 0.9 holds out {round(n * 0.9)} of {n} distinct prompts"):
        train_predictor("lexical", texts, lengths, validation_split=0.9)
    # What the message suggests is accepted, and a split too small to hold out 10 means none.
    with pytest.raises(ConfigError) as info:
        validation_prompt_count(200, 0.99)
    suggested = float(str(info.value).split("use ")[1].split(" ")[0])
    assert validation_prompt_count(200, suggested) == round(200 * suggested) > 0
    assert validation_prompt_count(200, 0.04) == 0 and validation_prompt_count(45, 0.1) == 0
    with pytest.raises(ConfigError, match="use 0 "):
        validation_prompt_count(45, 0.5)
    # The CLI says it in one line and writes nothing.
    from click.testing import CliRunner

    from aspc.cli import main

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": t, "length": float(np.mean(a))}) + "\n" for t, a in zip(texts, lengths, strict=True)))
    r = CliRunner().invoke(main, ["predict", "train", str(data), "--length-field", "length", "--validation-split", "0.99",
                                  "-o", str(tmp_path / "pred")])
    assert r.exit_code == 2 and "--validation-split 0.99 holds out" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "pred").exists()
