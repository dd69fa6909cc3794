"""Features.compact and replan.used_columns against np.unique and np.bincount, the definitions they replaced."""

from __future__ import annotations

import numpy as np
import pytest

from aspc.predict.features import FeatureConfig, Features, featurize, featurize_compact
from aspc.predict.sparse_kernel import merge_entries
from aspc.replan import used_columns


def _oracle(x: Features) -> tuple[np.ndarray, int]:
    used, cols = np.unique(x.cols, return_inverse=True)
    return cols.reshape(-1).astype(np.int64), max(1, int(used.size))


@pytest.mark.parametrize("n,n_hashed", [(0, 16), (1, 16), (7, 8), (300, 8), (2000, 1 << 18)])
def test_used_columns_ranks_the_columns_as_np_unique(n, n_hashed):
    rng = np.random.default_rng(n)
    cols = rng.integers(0, n_hashed, n).astype(np.int64)
    x = Features(np.zeros((4, 3)), rng.integers(0, 4, n).astype(np.int64), cols, rng.random(n), n_hashed)
    got = used_columns(x)
    want_cols, want_n = _oracle(x)
    assert got.cols.dtype == np.int64 and np.array_equal(got.cols, want_cols) and got.n_hashed == want_n
    assert got.rows is x.rows and got.vals is x.vals and got.dense is x.dense


def test_used_columns_of_real_features_keeps_the_matrix():
    texts = ["write a poem about the sea", "sum 2 and 3", "", "explain quicksort step by step " * 5]
    x = featurize(texts, FeatureConfig()).compact()
    got = used_columns(x)
    want_cols, want_n = _oracle(x)
    assert np.array_equal(got.cols, want_cols) and got.n_hashed == want_n
    beta = np.random.default_rng(0).normal(size=want_n)
    full = np.zeros(x.n_hashed)
    full[np.unique(x.cols)] = beta
    np.testing.assert_array_equal(got.hashed_matvec(beta), x.hashed_matvec(full))


def _compact_oracle(x: Features) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    key = x.rows * x.n_hashed + x.cols
    uniq, inv = np.unique(key, return_inverse=True)
    return uniq // x.n_hashed, uniq % x.n_hashed, np.bincount(inv, weights=x.vals, minlength=len(uniq))


@pytest.mark.parametrize("n,n_rows,n_hashed", [(0, 3, 8), (1, 1, 1), (50, 2, 4), (3000, 40, 64), (3000, 5, 1 << 12)])
def test_compact_merges_repeats_as_np_unique_and_bincount(n, n_rows, n_hashed):
    # Few rows and columns: many repeated (row, col) pairs, whose values must add in storage order.
    rng = np.random.default_rng(n + n_rows)
    x = Features(np.zeros((n_rows, 2)), rng.integers(0, n_rows, n).astype(np.int64),
                 rng.integers(0, n_hashed, n).astype(np.int64), rng.lognormal(size=n) * 1e-3 + rng.random(n), n_hashed)  # fmt: skip
    got = x.compact()
    for g, w in zip((got.rows, got.cols, got.vals), _compact_oracle(x), strict=True):
        assert g.tobytes() == w.tobytes()
    # np.bincount of no entries gave int64 values; float64 always now
    assert (got.rows.dtype, got.cols.dtype, got.vals.dtype) == (np.int64, np.int64, np.float64)
    assert got.dense is x.dense and got.n_hashed == n_hashed


def test_compact_of_real_features_and_out_of_range_entries():
    x = featurize(["the cat sat on the mat the cat", "a b a b a b", "", "x" * 500], FeatureConfig())
    got = x.compact()
    for g, w in zip((got.rows, got.cols, got.vals), _compact_oracle(x), strict=True):
        assert g.tobytes() == w.tobytes()
    with pytest.raises(ValueError, match="outside a 2 x 4 matrix"):
        merge_entries(np.array([0, 2]), np.array([0, 1]), np.ones(2), 2, 4)
    with pytest.raises(ValueError, match="outside a 2 x 4 matrix"):
        merge_entries(np.array([0, 1]), np.array([0, 4]), np.ones(2), 2, 4)


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_featurize_compact_in_chunks_is_the_whole_matrix(chunk):
    rng = np.random.default_rng(chunk)
    words = ["sort", "the", "list", "élan", "数据", "\n", "def f(x):", "x" * 300, ""]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(0, 40)))) for _ in range(23)]
    want = featurize(texts, FeatureConfig()).compact()
    got = featurize_compact(texts, FeatureConfig(), chunk=chunk)
    for k in ("dense", "rows", "cols", "vals"):
        assert getattr(got, k).dtype == getattr(want, k).dtype and getattr(got, k).tobytes() == getattr(want, k).tobytes()
    assert got.n_hashed == want.n_hashed
