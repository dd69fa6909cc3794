"""The id-key kernel against a plain-Python oracle, and the tie order it gives (also run with NUMBA_DISABLE_JIT=1)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.schedule import _by_prediction, _id_keys

M64 = (1 << 64) - 1


def _mix(h: int) -> int:
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & M64
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & M64
    return h ^ (h >> 31)


def _oracle(ids: list[str], seed: int) -> list[int]:
    golden = 0x9E3779B97F4A7C15
    basis = 0xCBF29CE484222325 ^ _mix((seed * golden + golden) & M64)
    out = []
    for s in ids:
        h = basis
        for b in s.encode():
            h = ((h ^ b) * 0x100000001B3) & M64
        out.append(_mix(h))
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=30), st.integers(0, 2**63 - 1), st.booleans())
def test_keys_match_the_oracle(ids, seed, large):
    arr = pa.array(ids, type=pa.large_string() if large else pa.string())
    assert _id_keys(arr, seed).tolist() == _oracle(ids, seed)
    if len(ids) > 2:  # a slice and a chunked column read their own rows
        assert _id_keys(arr.slice(1), seed).tolist() == _oracle(ids[1:], seed)
        chunked = pa.chunked_array([arr.slice(0, 1), arr.slice(1)])
        assert _id_keys(chunked, seed).tolist() == _oracle(ids, seed)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=40), st.integers(0, 1000), st.randoms(use_true_random=False))
def test_ties_follow_the_ids_never_the_rows(levels, seed, rnd):
    n = len(levels)
    ids = [f"p{i}" for i in range(n)]
    mean = np.array(levels, dtype=np.float64)
    rows = _by_prediction(mean, pa.array(ids), seed)
    assert sorted(rows.tolist()) == list(range(n)) and np.all(np.diff(mean[rows]) >= 0)
    keys = _oracle(ids, seed)
    assert [ids[r] for r in rows] == [ids[i] for i in sorted(range(n), key=lambda i: (mean[i], keys[i]))]
    perm = list(range(n))
    rnd.shuffle(perm)
    again = _by_prediction(mean[perm], pa.array([ids[i] for i in perm]), seed)
    assert [ids[perm[r]] for r in again] == [ids[r] for r in rows]


_FLOATS = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, 1e-300, -1e-300, 5e-324, 1e300, -1e300]),
    st.floats(allow_nan=False, allow_infinity=True, width=64),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_FLOATS, st.integers(0, 3), st.integers(0, 2**64 - 1)), max_size=60), st.booleans())
def test_radix_order_matches_a_lexicographic_sort(rows, wide):
    # The (prediction, key) radix sort against NumPy's lexsort: ties of both (a key collision) in row order,
    # -0.0 equal to 0.0, every digit position (wide keys) and skipped digits (narrow ones).
    from aspc.schedule_kernel import float_order_bits, lex_argsort

    x = np.array([r[0] for r in rows], dtype=np.float64)
    k = np.array([r[2] if wide else r[1] for r in rows], dtype=np.uint64)
    got = lex_argsort(float_order_bits(x), k)
    assert got.tolist() == np.lexsort((np.arange(len(rows)), k, x)).tolist()


def test_ids_and_predictions_of_other_lengths_are_refused():
    # The radix kernel indexes both arrays without bounds checks: a mismatch was a segfault.
    import pytest

    with pytest.raises(ValueError, match="3 ids for 2 predictions"):
        _by_prediction(np.array([1.0, 2.0]), pa.array(["a", "b", "c"]), 0)
