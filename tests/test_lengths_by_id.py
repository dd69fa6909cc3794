"""Columnar lengths by id (aspc.io.lengths_by_id) against the dict of arrays they replace."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.io import RaggedLengths
from aspc.io.gather import dispatch_positions
from aspc.io.lengths_by_id import LengthsById


@st.composite
def keyed(draw):
    n = draw(st.integers(1, 30))
    ids = draw(st.lists(st.text(min_size=1, max_size=5), min_size=n, max_size=n, unique=True))
    segs = [np.array(draw(st.lists(st.integers(0, 99), min_size=1, max_size=6)), dtype=np.float64) for _ in ids]
    return ids, segs


@settings(max_examples=100, deadline=None)
@given(keyed(), st.data())
def test_join_matches_a_dict_lookup(kv, data):
    ids, segs = kv
    by_id = LengthsById(pa.array(ids, pa.string()), RaggedLengths.from_arrays(segs))
    plain = dict(zip(ids, segs, strict=True))
    assert len(by_id) == len(plain) and list(by_id) == ids
    for pid in ids:
        assert pid in by_id and np.array_equal(by_id[pid], plain[pid])
    assert "\x00not-an-id" not in by_id
    wanted = data.draw(st.lists(st.sampled_from(ids), max_size=40))
    missing, joined = by_id.join(pa.array(wanted + ["\x00absent"], pa.string()))
    assert missing.tolist() == [len(wanted)] and joined is None
    missing, joined = by_id.join(pa.array(wanted, pa.string()))
    assert missing.size == 0
    assert [s.tolist() for s in joined] == [plain[p].tolist() for p in wanted]
    assert by_id.rows_of(wanted).tolist() == [ids.index(p) for p in wanted]


@settings(max_examples=100, deadline=None)
@given(keyed(), st.integers(1, 7))
def test_head_is_a_slice_of_every_segment(kv, k):
    _, segs = kv
    head = RaggedLengths.from_arrays(segs).head(k)
    assert [s.tolist() for s in head] == [s[:k].tolist() for s in segs]
    with pytest.raises(ValueError):
        RaggedLengths.from_arrays(segs).head(0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=12), st.randoms())
def test_dispatch_positions_concatenate_the_minibatches_in_order(sizes, rnd):
    bounds = np.r_[0, np.cumsum(sizes)]
    order = list(range(len(sizes)))
    rnd.shuffle(order)
    expected = np.concatenate([np.arange(bounds[k], bounds[k + 1]) for k in order])
    assert dispatch_positions(bounds, np.array(order)).tolist() == expected.tolist()
