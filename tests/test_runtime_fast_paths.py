"""Shortcuts of simulate and the recorder against the code they replace: same values, bit for bit."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest
from conftest import lognormal_records, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.compiler import CompileConfig, InputOptions
from aspc.runtime import RunConfig
from aspc.runtime.record import metrics
from aspc.runtime.record.resume import work_hash
from aspc.runtime.work import work_from_table
from aspc.testing.plans import plan_table


def _old_work_hash(work) -> str:
    h = hashlib.sha256()
    h.update("\x00".join(str(p) for p in work.prompt_ids.tolist()).encode())
    h.update(np.ascontiguousarray(work.row_offsets, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(work.n_samples, dtype=np.int64).tobytes())
    return h.hexdigest()


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.text(min_size=0, max_size=6), min_size=1, max_size=30, unique=True),
       cut=st.integers(0, 30), large=st.booleans())
def test_work_hash_is_the_joined_ids_hash(ids, cut, large):
    ids = [i.encode("utf-8", "replace").decode("utf-8") for i in ids]  # Arrow strings are valid UTF-8
    t = plan_table(np.arange(len(ids)), n_samples=2)
    col = pa.array(ids, pa.large_string() if large else pa.string())
    t = t.set_column(t.schema.get_field_index("prompt_id"), "prompt_id", col)
    cut = min(cut, len(ids))
    for table in (t, pa.concat_tables([t.slice(0, cut), t.slice(cut)])):
        work = work_from_table(table)
        assert work_hash(work) == _old_work_hash(work)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), n=st.integers(1, 60), big=st.booleans())
def test_slot_bubbles_sort_equals_the_two_key_lexsort(data, n, big):
    lens = np.asarray(data.draw(st.lists(st.integers(0, 10**9 if big else 50), min_size=n, max_size=n)))
    mb = np.sort(np.asarray(data.draw(st.lists(st.integers(0, 2**40 if big else 6), min_size=n, max_size=n))))
    fast = metrics.slot_bubbles(lens, mb)

    def lexsorted(lens, mb):
        order = np.lexsort((lens, mb))
        return lens[order], mb[order]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metrics, "_sorted_by_minibatch", lexsorted)
        assert metrics.slot_bubbles(lens, mb) == fast


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("sim")
    return write_jsonl(d / "in.jsonl", lognormal_records(400, seed=9, n_lengths=3))


@pytest.mark.parametrize("repeats", [1, 2])
def test_simulate_by_input_row_equals_the_id_join(monkeypatch, dataset, repeats):
    import aspc.simulate as sim
    import aspc.simulate_inputs as simulate_inputs

    inputs = InputOptions(length_field="lengths")
    cfg = CompileConfig(samples_per_prompt=3, workers=4, batch_size=16)
    rc = RunConfig(workers=4, global_batch=24)
    names = ["random", "asp", "oracle", "oracle-exact"]

    def table(res):
        return sim.comparison_table(res)

    fast = table(sim.simulate_strategies(dataset, inputs, cfg, rc, strategies=names, repeats=repeats))
    joined = []
    real_join = simulate_inputs.LengthsById.join

    def spy(self, ids):
        joined.append(len(ids))
        return real_join(self, ids)

    monkeypatch.setattr(simulate_inputs.LengthsById, "join", spy)
    again = table(sim.simulate_strategies(dataset, inputs, cfg, rc, strategies=names, repeats=repeats))
    assert again == fast
    if repeats == 1:
        assert joined == []  # no id was hashed: rows found by input row, plans keyed by their own ids
    monkeypatch.setattr(simulate_inputs.RowAligned, "rows_of", lambda self, rows: None)
    monkeypatch.setattr(simulate_inputs.RowAligned, "for_plan", lambda self, plan_table: self.by_id)
    slow = table(sim.simulate_strategies(dataset, inputs, cfg, rc, strategies=names, repeats=repeats))
    assert slow == fast
