"""The static predictor: its Numba kernel against a NumPy oracle, training on a tiny random
encoder (distillation, determinism, round trip, CLI contract, bad input), and real MiniLM
(the distilled vectors; the whole CLI workflow in a slow test)."""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.cli import main
from aspc.predict.static_kernel import _segmented_mean_kernel, segmented_mean
from tests.conftest import save_tiny_bert

WORDS = ["describe", "topic", "ticket", "in", "one", "word", "briefly", "a", "paragraph", "detail", "as", "long",
         "essay", "explain", "the", "code", "above"]  # fmt: skip
STYLES = {"in one word": 3, "briefly": 60, "in a paragraph": 150, "in detail": 400, "as a long essay": 900}


# -- kernel -----------------------------------------------------------------
def _oracle(segments: list[list[int]], table: np.ndarray) -> np.ndarray:
    rows = [table[s].astype(np.float64).mean(0) if s else np.zeros(table.shape[1]) for s in segments]
    return np.array(rows, dtype=np.float64).reshape(len(segments), table.shape[1])


def _flat(segments: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    flat = np.array([i for s in segments for i in s], dtype=np.int64)
    return flat, np.concatenate([[0], np.cumsum([len(s) for s in segments])]).astype(np.int64)


ragged = st.lists(st.lists(st.integers(0, 39), max_size=12), max_size=16)


@settings(max_examples=60, deadline=None)
@given(segments=ragged, dim=st.integers(1, 9), seed=st.integers(0, 2**32 - 1), f64=st.booleans())
def test_segmented_mean_matches_numpy(segments, dim, seed, f64) -> None:
    table = np.random.default_rng(seed).normal(size=(40, dim)).astype(np.float64 if f64 else np.float32)
    flat, offsets = _flat(segments)
    got = segmented_mean(flat, offsets, table)
    assert got.shape == (len(segments), dim) and got.dtype == table.dtype
    np.testing.assert_allclose(got, _oracle(segments, table), rtol=1e-6, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(segments=ragged, seed=st.integers(0, 2**32 - 1))
def test_segmented_mean_python_path_matches_numpy(segments, seed) -> None:
    # The kernel's own Python body (what NUMBA_DISABLE_JIT=1 runs) against the oracle.
    table = np.random.default_rng(seed).normal(size=(40, 5)).astype(np.float32)
    flat, offsets = _flat(segments)
    out = np.empty((len(segments), 5), np.float32)
    getattr(_segmented_mean_kernel, "py_func", _segmented_mean_kernel)(flat, offsets, table, out)
    np.testing.assert_allclose(out, _oracle(segments, table), rtol=1e-6, atol=1e-6)


def test_segmented_mean_rejects_malformed_input() -> None:
    table = np.zeros((4, 2), np.float32)
    for flat, offsets in (([0, 4], [0, 2]), ([0, -1], [0, 2]), ([0, 1], [0, 3]), ([0, 1], [1, 2]), ([0, 1], [0, 2, 1, 2])):
        with pytest.raises(ValueError):
            segmented_mean(np.array(flat), np.array(offsets), table)
    with pytest.raises(ValueError):
        segmented_mean(np.array([0]), np.array([0, 1]), np.zeros((4, 2), np.int64))
    assert segmented_mean(np.empty(0, np.int64), np.array([0]), table).shape == (0, 2)


# -- a tiny random encoder --------------------------------------------------
@pytest.fixture(scope="module")
def torch():
    t = pytest.importorskip("torch", reason="needs torch: pip install 'aspc[predict]'")
    pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[predict]'")
    before = t.get_num_threads()
    t.set_num_threads(1)  # a tiny encoder gains nothing from threads on a shared 2-core machine
    yield t
    t.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, torch) -> Path:
    """A 2-layer, 32-wide BERT with random weights and a word-piece vocabulary covering the test prompts."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-encoder"), WORDS, string.ascii_lowercase + string.digits + ".,()")


def write_data(path: Path, n: int, seed: int = 0, start: int = 0, n_lengths: int = 3, field: str = "length") -> Path:
    """Prompts whose style words set the length (lognormal around the style's level)."""
    rng = np.random.default_rng(seed)
    names = list(STYLES)
    with open(path, "w") as fh:
        for i in range(start, start + n):
            style = names[rng.integers(len(names))]
            lengths = np.maximum(1, np.round(rng.lognormal(np.log(STYLES[style]), 0.3, size=n_lengths))).astype(int)
            rec = {"id": f"q{i}", "prompt": f"Describe topic {i % 7} {style} (ticket {i}).", field: lengths.tolist()}
            fh.write(json.dumps(rec) + "\n")
    return path


def run(*args) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("static")
    train = write_data(d / "train.jsonl", 300)
    test = write_data(d / "test.jsonl", 80, seed=1, start=1000)
    pred = d / "pred"
    res = run("predict", "train", train, "--length-field", "length", "--kind", "static", "--base-model", tiny,
              "-o", pred, "--quiet")  # fmt: skip
    assert res.exit_code == 0, res.output
    return {"dir": d, "train": train, "test": test, "pred": pred}


def test_distilled_table_is_the_encoder_output_per_token(files, tiny, torch) -> None:
    import transformers

    from aspc.predict import load_predictor

    pred = load_predictor(files["pred"])
    enc = transformers.AutoModel.from_pretrained(str(tiny), local_files_only=True).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny), local_files_only=True)
    assert pred.table.shape == (enc.config.vocab_size, 32) and pred.table.dtype == np.float16
    for word in ("essay", "briefly", "##7"):
        t = tok.convert_tokens_to_ids(word)
        with torch.inference_mode():
            h = enc(input_ids=torch.tensor([[tok.cls_token_id, t, tok.sep_token_id]])).last_hidden_state[0, 1]
        # Equal up to the float16 storage (half an ulp: 2**-11 relative) and batched-vs-single rounding.
        np.testing.assert_allclose(pred.table[t].astype(np.float32), h.numpy(), rtol=1e-3, atol=1e-4)
    assert not np.allclose(pred.table[5], pred.table[6], atol=1e-2)  # distinct tokens, distinct vectors


def test_static_predictor_learns_and_predicts_in_order(files) -> None:
    from aspc.predict import load_predictor
    from aspc.predict.metrics import kendall_tau

    pred = load_predictor(files["pred"])
    recs = [json.loads(line) for line in files["test"].read_text().splitlines()]
    p = pred.predict([r["prompt"] for r in recs])
    truth = np.array([np.mean(r["length"]) for r in recs])
    assert kendall_tau(p.mean, truth) > 0.6  # the style word is the signal; random vectors still tell it
    assert np.all((p.q10 <= p.q50) & (p.q50 <= p.q90) & (p.mean > 0))
    meta = json.loads((files["pred"] / "metadata.json").read_text())
    assert meta["aspc_predictor"] == "static" and meta["validation"]["kendall_tau"] > 0.6
    assert meta["training"]["ridge_lam"] in meta["config"]["lam_grid"]


def test_folded_head_equals_the_explicit_embedding_head(files) -> None:
    from aspc.predict import load_predictor
    from aspc.predict.static import embed
    from aspc.predict.transformer import _length_features

    pred = load_predictor(files["pred"])
    texts = ["", "Describe topic 3 in detail.", "as a long essay " * 400, "zz\u00e9\u4e00 ((", "briefly"]
    emb = embed(pred.tokenizer, pred.table.astype(np.float32), texts, pred.config).astype(np.float64)
    h = pred.head
    want = ((emb - h["mu"]) / h["sd"]) @ h["w"] + _length_features(texts) @ h["w_len"]
    np.testing.assert_allclose(pred.text_scores(texts), want, rtol=1e-5, atol=1e-5)
    assert np.all(emb[0] == 0)  # a prompt without tokens: the zero vector, no NaN


def test_round_trip_arrow_and_targets(files, tmp_path, tiny) -> None:
    from aspc.predict import load_predictor, train_predictor

    pred = load_predictor(files["pred"])
    texts = [json.loads(line)["prompt"] for line in files["test"].read_text().splitlines()]
    a = pred.predict(texts)
    b = pred.predict(pa.array(texts), ids=pa.array([str(i) for i in range(len(texts))]))
    np.testing.assert_array_equal(a.mean, b.mean)
    pred.save(tmp_path / "again")
    back = load_predictor(tmp_path / "again")
    assert back.content_hash() == pred.content_hash() and back.identity()["kind"] == "static"
    np.testing.assert_array_equal(back.predict(texts).q90, a.q90)
    # Targets: shared text weights, a level per target; the pooled head sits between them.
    rng = np.random.default_rng(0)
    tr = [f"Describe topic {i} {s} (ticket {i})." for i, s in enumerate(rng.choice(list(STYLES), 240))]
    lengths, targets = [], []
    for i, t in enumerate(tr):
        style = next(s for s in STYLES if s in t)
        who = "model-long" if i % 2 else "model-short"
        lengths.append(np.array([STYLES[style] * (3.0 if who == "model-long" else 1.0)]))
        targets.append(who)
    multi = train_predictor("static", tr, lengths, targets=targets, base_model=str(tiny))
    long_, short = multi.with_target("long").predict(texts).mean, multi.with_target("short").predict(texts).mean
    pooled = multi.predict(texts).mean
    assert np.all(long_ > pooled) and np.all(pooled > short)
    assert multi.with_target("long").identity()["target"] == "model-long"


def test_same_data_and_seed_give_identical_bytes(files, tiny) -> None:
    other = files["dir"] / "pred-again"
    res = run("predict", "train", files["train"], "--length-field", "length", "--kind", "static", "--base-model", tiny,
              "-o", other, "--quiet")  # fmt: skip
    assert res.exit_code == 0, res.output
    names = sorted(str(p.relative_to(files["pred"])) for p in files["pred"].rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(other)) for p in other.rglob("*") if p.is_file())
    assert {"table.npy", "head.npz", "tokenizer.json", "prior/weights.npz"} <= set(names)
    for name in names:
        assert (files["pred"] / name).read_bytes() == (other / name).read_bytes(), name


def test_cli_apply_eval_and_compile(files) -> None:
    out = files["dir"] / "preds.parquet"
    res = run("predict", files["pred"], files["test"], "-o", out)
    assert res.exit_code == 0, res.output
    table = pq.read_table(out).to_pydict()
    assert list(table) == ["prompt_id", "predicted_len", "predicted_q10", "predicted_q50", "predicted_q90"]
    assert len(table["prompt_id"]) == 80 and table["prompt_id"][0] == "q1000"
    res = run("predict", "eval", files["pred"], files["test"], "--length-field", "length", "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["predictor"]["kind"] == "static" and got["kendall_tau"] > got["baseline"]["kendall_tau"] + 0.3
    assert 0.0 <= got["coverage_q10_q90_samples"] <= 1.0
    plan = files["dir"] / "plan.parquet"
    res = run("compile", files["test"], "--predictor", files["pred"], "--batch-size", "8", "--slack", "4",
              "--group-size", "4", "--seed", "0", "-o", plan, "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    ident = json.loads(pq.read_metadata(plan).metadata[b"aspc.predictor"])
    from aspc.predict import load_predictor

    assert ident["kind"] == "static" and ident["hash"] == load_predictor(files["pred"]).content_hash()
    res = run("simulate", files["test"], "--length-field", "length", "--predictor", files["pred"],
              "--strategies", "random,asp", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output


def test_refits_static_lexical_and_bad_init(files, tmp_path, tiny) -> None:
    fresh = write_data(tmp_path / "new.jsonl", 120, seed=5, start=5000)
    res = run("predict", "train", fresh, "--kind", "static", "--init", files["pred"], "-o", tmp_path / "refit", "--json")
    assert res.exit_code == 0, res.output
    meta = json.loads((tmp_path / "refit" / "metadata.json").read_text())
    assert meta["training"]["init"]["kind"] == "static"
    assert (tmp_path / "refit" / "table.npy").read_bytes() == (files["pred"] / "table.npy").read_bytes()
    # On top of a lexical predictor (here the default, as without --init): its score is an offset,
    # stored with the predictor; --no-prior fits the static head alone.
    res = run("predict", "train", fresh, "--kind", "static", "--init", "default", "--base-model", tiny,
              "-o", tmp_path / "onlex", "--quiet")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert (tmp_path / "onlex" / "prior" / "metadata.json").is_file()
    res = run("predict", tmp_path / "onlex", files["test"], "-o", tmp_path / "p.parquet")
    assert res.exit_code == 0, res.output
    res = run("predict", "train", fresh, "--kind", "static", "--no-prior", "--base-model", tiny,
              "-o", tmp_path / "alone", "--quiet")  # fmt: skip
    assert res.exit_code == 0, res.output
    alone = json.loads((tmp_path / "alone" / "metadata.json").read_text())
    assert alone["prior"] is None and not (tmp_path / "alone" / "prior").exists()
    assert meta["prior"]["kind"] == "lexical"  # the refit kept the init's prior (the default)
    # --no-prior was silently ignored with a static or lexical --init (the refit kept the prior): refused.
    for init in (files["pred"], "default"):
        res = run("predict", "train", fresh, "--kind", "static", "--init", init, "--no-prior", "-o", tmp_path / "z")
        assert res.exit_code == 2 and "--no-prior does not apply with a" in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "z").exists()
    res = run("predict", "train", fresh, "--kind", "lexical", "--no-prior", "-o", tmp_path / "y")
    assert res.exit_code == 2 and "--no-prior applies to --kind static only" in res.output
    res = run("predict", "train", fresh, "--kind", "static", "--init", files["pred"], "--base-model", tiny,
              "-o", tmp_path / "x")  # fmt: skip
    assert res.exit_code == 2 and "give one" in res.output and not (tmp_path / "x").exists()


def test_init_from_transformer_distils_its_fine_tuned_encoder(files, tmp_path, tiny, torch) -> None:
    from aspc.predict import train_predictor

    recs = [json.loads(line) for line in files["train"].read_text().splitlines()][:120]
    texts, lengths = [r["prompt"] for r in recs], [np.array(r["length"], float) for r in recs]
    tf = train_predictor("transformer", texts, lengths, base_model=str(tiny), epochs=1, device="cpu", seed=0)
    static = train_predictor("static", texts, lengths, init=tf)
    t = int(tf.tokenizer.convert_tokens_to_ids("essay"))
    enc = tf.net.encoder.eval()
    with torch.inference_mode():
        ids = torch.tensor([[tf.tokenizer.cls_token_id, t, tf.tokenizer.sep_token_id]])
        h = enc(input_ids=ids).last_hidden_state[0, 1].numpy()
    np.testing.assert_allclose(static.table[t].astype(np.float32), h, rtol=1e-3, atol=1e-4)
    assert static.metadata["training"]["init"]["kind"] == "transformer"
    assert static.metadata["base_model"].startswith("encoder of transformer predictor")


@pytest.mark.parametrize(
    "n, lengths, args, match",
    [
        (49, None, [], "49 (prompt, length) pairs found, training needs at least 50"),
        (80, 7, [], "all 80 observed lengths equal 7"),
        (80, None, ["--epochs", "2"], "--epochs and --freeze-encoder apply to --kind transformer only"),
    ],
)
def test_bad_input_one_line_no_output(tmp_path, tiny, n, lengths, args, match) -> None:
    data = write_data(tmp_path / "d.jsonl", n, n_lengths=1)
    if lengths is not None:
        recs = [json.loads(x) | {"length": lengths} for x in data.read_text().splitlines()]
        data.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "pred"
    res = run("predict", "train", data, "--kind", "static", "--base-model", tiny, "-o", out, *args)
    assert res.exit_code == 2, res.output
    assert match in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert [p.name for p in tmp_path.iterdir()] == ["d.jsonl"] and "Traceback" not in res.output


def test_corrupt_directory_is_one_clear_error(files, tmp_path) -> None:
    import shutil

    from aspc.errors import PredictorError
    from aspc.predict import load_predictor

    bad = tmp_path / "bad"
    shutil.copytree(files["pred"], bad)
    table = bytearray((bad / "table.npy").read_bytes())
    table[-7] ^= 0x40  # one weight changed: the recorded hash catches it
    (bad / "table.npy").write_bytes(bytes(table))
    with pytest.raises(PredictorError, match="modified or corrupt"):
        load_predictor(bad)
    head = (bad / "head.npz").read_bytes()
    (bad / "head.npz").write_bytes(head[: len(head) // 2])
    with pytest.raises(PredictorError, match="corrupt"):
        load_predictor(bad)
    shutil.copy(files["pred"] / "head.npz", bad / "head.npz")
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(PredictorError, match="corrupt"):
        load_predictor(bad)


# -- real MiniLM --------------------------------------------------------------
def test_real_minilm_distilled_vectors(torch) -> None:
    import transformers

    from aspc.predict.static_train import distil_table
    from aspc.predict.transformer import default_base_model

    path = default_base_model()
    enc = transformers.AutoModel.from_pretrained(str(path), local_files_only=True).float().eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    ids = tok.convert_tokens_to_ids(["essay", "code", "the", "##ing", "write"])
    got = distil_table(torch, enc, tok.cls_token_id, tok.sep_token_id, ids=ids, batch=2)  # batches of 2, 2, 1
    for row, t in zip(got, ids, strict=True):
        with torch.inference_mode():
            h = enc(input_ids=torch.tensor([[tok.cls_token_id, t, tok.sep_token_id]])).last_hidden_state[0, 1]
        np.testing.assert_allclose(row, h.numpy(), rtol=1e-4, atol=1e-5)
    assert not np.allclose(got[0], got[1])


@pytest.mark.slow
def test_real_minilm_cli_workflow(tmp_path) -> None:
    pytest.importorskip("torch", reason="needs torch: pip install 'aspc[predict]'")
    train = write_data(tmp_path / "data.jsonl", 400)
    test = write_data(tmp_path / "test.jsonl", 100, seed=3, start=9000, field="lengths")
    pred = tmp_path / "pred"
    res = run("predict", "train", train, "--length-field", "length", "--kind", "static", "-o", pred, "--quiet")
    assert res.exit_code == 0, res.output
    assert np.load(pred / "table.npy").shape == (30522, 384)
    res = run("predict", pred, test, "-o", tmp_path / "preds.parquet")
    assert res.exit_code == 0, res.output
    assert pq.read_table(tmp_path / "preds.parquet").num_rows == 100
    res = run("predict", "eval", pred, test, "--length-field", "lengths", "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["kendall_tau"] > 0.5 and "coverage_q10_q90_samples" in got
    res = run("compile", test, "--predictor", pred, "-o", tmp_path / "plan.parquet", "--batch-size", "8",
              "--slack", "4", "--group-size", "4")  # fmt: skip
    assert res.exit_code == 0, res.output
