"""The lexical bulk kernel's fast inputs give bit-identical scores: float32 weights, Arrow columns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from aspc.predict import load_predictor
from aspc.predict.features import FeatureConfig, featurize
from aspc.predict.lexical_kernel import hashed_scores

VOCAB = ["abc", "DEF", "gh\nij", "k_l", "12", "é", "ü", "中文", "—", "x\x00y", "\n", "  ", "a.b", "Zz9"]


def _texts(seed: int, n: int = 300) -> list[str]:
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(VOCAB, size=int(rng.integers(0, 700)))) for _ in range(n)]
    return texts + ["", " ", "!!!", "a", "A" * 5000, "\n" * 4100, "x\x00" * 3000]


@pytest.mark.parametrize("config", [FeatureConfig(), FeatureConfig(head_bytes=40, tail_bytes=16),
                                    FeatureConfig(word_bigrams=False, bits=12)])
def test_float32_weights_score_as_their_float64_widening(config):
    texts = _texts(1)
    beta32 = np.random.default_rng(2).normal(size=1 << config.bits).astype(np.float32)
    s32, d32 = hashed_scores(texts, config, beta32)
    s64, d64 = hashed_scores(texts, config, beta32.astype(np.float64))
    np.testing.assert_array_equal(s32, s64)
    np.testing.assert_array_equal(d32, d64)
    # And both are the feature matrix's product (the brute-force oracle).
    f = featurize([t.replace("\ud800", "") for t in texts], config)
    np.testing.assert_allclose(s64, f.hashed_matvec(beta32.astype(np.float64)), rtol=0, atol=1e-9)
    np.testing.assert_array_equal(d64, f.dense)


@pytest.mark.parametrize("kind", ["array", "chunked", "sliced", "large"])
def test_an_arrow_column_scores_as_its_strings(kind):
    config = FeatureConfig(head_bytes=200, tail_bytes=64)
    texts = _texts(3)
    beta = np.random.default_rng(4).normal(size=1 << config.bits).astype(np.float32)
    arr = pa.array(["pad", *texts, "pad"], pa.string())
    col = {
        "array": pa.array(texts, pa.string()),
        "chunked": pa.chunked_array([pa.array(texts[:7]), pa.array([], pa.string()), pa.array(texts[7:])]),
        "sliced": arr.slice(1, len(texts)),
        "large": pa.array(texts, pa.large_string()),
    }[kind]
    want = hashed_scores(texts, config, beta)
    got = hashed_scores(col, config, beta)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_arrow_columns_with_nulls_or_not_strings_are_refused():
    config = FeatureConfig()
    beta = np.zeros(1 << config.bits)
    with pytest.raises(ValueError, match="without nulls"):
        hashed_scores(pa.array(["a", None]), config, beta)
    with pytest.raises(ValueError, match="strings"):
        hashed_scores(pa.array([1, 2]), config, beta)


def test_the_default_predictor_gives_the_same_prediction_for_a_list_and_a_column():
    pred = load_predictor("default")
    texts = _texts(5, 200)
    a, b = pred.predict(texts), pred.predict(pa.array(texts, pa.string()))
    for name in ("mean", "q10", "q50", "q90"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
