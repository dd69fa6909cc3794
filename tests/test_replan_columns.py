"""used_columns against np.unique, the definition it replaced (a sort of every entry)."""

from __future__ import annotations

import numpy as np
import pytest

from aspc.predict.features import FeatureConfig, Features, featurize
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
