"""The column-wise paths behind ``aspc run --epochs`` at scale give what the per-prompt ones gave, bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aspc.epoch_predict import _Epoch, epoch_lengths
from aspc.errors import InputError
from aspc.io import lengths as L
from aspc.io.history import history_groups, read_history
from aspc.io.lengths_by_id import LengthsById
from aspc.predict.base import LengthPrediction
from aspc.predict.history import blend_history, blend_history_flat


def _rolled(actual, epoch, n, drift):
    """The per-prompt loop epoch_lengths ran before."""
    scale = (1.0 + drift) ** (epoch - 1)
    out = {}
    for pid, v in actual.items():
        v = np.asarray(v, dtype=np.float64)
        shift = ((epoch - 1) * n) % v.size if v.size else 0
        out[pid] = np.rint(np.roll(v, -shift) * scale)
    return out


def _same(a, b):
    assert list(a) == list(b)
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), k


@pytest.mark.parametrize("drift", [0.0, 0.07, -0.3])
def test_epoch_lengths_match_the_per_prompt_roll(drift):
    rng = np.random.default_rng(3)
    actual = {f"p{i}": rng.integers(0, 4000, size=rng.integers(1, 11)).astype(np.float64) for i in range(500)}
    actual["frac"] = np.array([2.5, 3.5, 0.49])
    for epoch in (1, 2, 3, 7):
        for n in (1, 3, 8):
            got = epoch_lengths(actual, epoch, n, drift)
            assert isinstance(got, LengthsById)
            _same(got, _rolled(actual, epoch, n, drift))
            _same(epoch_lengths(got, 1, n), _rolled(got, 1, n, 0.0))  # a LengthsById given


def test_epoch_lengths_keep_the_loop_where_columns_do_not_fit():
    odd = {"a": np.array([3.0, 4.0]), "b": np.array([])}  # an empty list of lengths
    got = epoch_lengths(odd, 2, 1)
    assert isinstance(got, dict)
    _same(got, _rolled(odd, 2, 1, 0.0))
    assert epoch_lengths({}, 2, 1) == {}


def _write_log(tmp_path, ids, lens):
    samples = tmp_path / "log" / "samples"
    samples.mkdir(parents=True)
    pq.write_table(pa.table({"prompt_id": ids, "response_len": lens}), samples / "part-00000.parquet")
    return tmp_path / "log"


def test_run_log_groups_sort_as_python_and_keep_log_order(tmp_path):
    ids = ["b", "é", "a", "b", "Z", "a", "zz", "€", "a"]
    lens = [5, 1, 2, 6, 9, 3, 7, 8, 4]
    log = _write_log(tmp_path, ids, lens)
    keys, values, offsets = history_groups(log)
    assert keys == sorted(set(ids))
    want = {k: [x for i, x in zip(ids, lens, strict=True) if i == k] for k in keys}
    assert {k: values[offsets[j] : offsets[j + 1]].tolist() for j, k in enumerate(keys)} == want
    got = read_history(log)
    assert list(got) == keys and {k: v.tolist() for k, v in got.items()} == want


def _slow(path, **kw):
    """read_lengths through the row reader alone."""
    saved = L._parquet_lengths
    L._parquet_lengths = lambda *a: None
    try:
        return L.read_lengths(path, **kw)
    finally:
        L._parquet_lengths = saved


@pytest.mark.parametrize(
    "table",
    [
        pa.table({"id": ["x", "y", "x"], "lengths": pa.array([[1, 2], [3], [4, 5, 6]], pa.list_(pa.int64()))}),
        pa.table({"id": [7, 3, 9], "lengths": pa.array([[1.5], [2.25, 0.0], [9.0]], pa.list_(pa.float32()))}),
        pa.table({"id": ["a", "b"], "lengths": pa.array([12, 30], pa.int32()), "when": [1.5, 2.5]}),
    ],
)
def test_parquet_lengths_by_column_match_the_row_reader(tmp_path, table):
    path = tmp_path / "lengths.parquet"
    pq.write_table(table, path)
    assert L._parquet_lengths(path, "id", "lengths") is not None
    _same(L.read_lengths(path, length_field="lengths"), _slow(path, length_field="lengths"))


@pytest.mark.parametrize(
    "table",
    [
        pa.table({"id": ["a", "b"], "lengths": pa.array([[1], []], pa.list_(pa.int64()))}),  # an empty list
        pa.table({"id": ["a", "b"], "lengths": pa.array([3, -1], pa.int64())}),  # negative
        pa.table({"id": ["a", "b"], "lengths": pa.array([3.0, float("nan")])}),
        pa.table({"id": ["a", None], "lengths": pa.array([3, 4])}),
        pa.table({"id": ["a", "b"], "lengths": pa.array([[1, None], [2]], pa.list_(pa.int64()))}),
        pa.table({"id": [1.5, 2.5], "lengths": pa.array([3, 4])}),
        pa.table({"id": ["a", "b"], "lengths": pa.array([3, 20_000_000])}),
        pa.table({"id": ["a", "b"], "other": [1, 2]}),
    ],
)
def test_parquet_rows_the_columns_cannot_take_go_to_the_row_reader(tmp_path, table):
    path = tmp_path / "lengths.parquet"
    pq.write_table(table, path)
    assert L._parquet_lengths(path, "id", "lengths") is None
    with pytest.raises(InputError) as slow:
        _slow(path, length_field="lengths")
    with pytest.raises(InputError) as got:
        L.read_lengths(path, length_field="lengths")
    assert str(got.value) == str(slow.value)


def test_blend_history_flat_is_blend_history():
    rng = np.random.default_rng(5)
    n = 400
    m = rng.uniform(20, 3000, n)
    base = LengthPrediction(m, m * 0.4, m * 0.9, m * 2.1)
    observed = [None if i % 7 == 0 else rng.integers(0, 5000, size=rng.integers(1, 9)).astype(float) for i in range(n)]
    observed[3] = np.array([])
    want = blend_history(base, observed, 0.5)
    seen = np.array([i for i, a in enumerate(observed) if a is not None and len(a)])
    got = blend_history_flat(
        base, seen, [len(observed[i]) for i in seen], np.concatenate([observed[i] for i in seen]), 0.5
    )
    for name in ("mean", "q10", "q50", "q90"):
        assert getattr(got, name).tobytes() == getattr(want, name).tobytes(), name


@pytest.mark.parametrize("frac", [False, True])
def test_epoch_means_are_np_mean(frac):
    rng = np.random.default_rng(9)
    arrays = [rng.integers(0, 9000, size=rng.integers(1, 40)).astype(float) for _ in range(300)]
    if frac:
        arrays = [a + rng.random(a.size) for a in arrays]
    keys = [f"k{i}" for i in range(len(arrays))]
    offsets = np.r_[0, np.cumsum([a.size for a in arrays])]
    ep = _Epoch((keys, np.concatenate(arrays), offsets), ["k5", "nope", "k1"])
    assert ep.rows.tolist() == [5, -1, 1]
    assert ep.means().tobytes() == np.array([np.mean(a) for a in arrays]).tobytes()
    sizes, values = ep.gather(np.array([5, 1]))
    assert sizes.tolist() == [arrays[5].size, arrays[1].size]
    assert values.tobytes() == np.concatenate([arrays[5], arrays[1]]).tobytes()


def test_read_history_of_one_file_is_float64_arrays(tmp_path):
    path = tmp_path / "l.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"q{i}", "length": [i, i + 1]}) for i in range(5)) + "\n")
    got = read_history(path)
    assert list(got) == [f"q{i}" for i in range(5)]
    assert all(v.dtype == np.float64 and v.tolist() == [i, i + 1] for i, v in enumerate(got.values()))


def test_running_out_of_memory_reading_a_run_log_is_no_damaged_log(tmp_path, monkeypatch):
    # pa.ArrowMemoryError is an ArrowException too: caught as one, it told the user to throw a good log away.
    monkeypatch.setattr(L, "committed_sample_parts", lambda path, **kw: [tmp_path / "part-0.parquet"])

    def oom(files, columns):
        raise pa.ArrowMemoryError("malloc of size 1 failed")

    monkeypatch.setattr(L, "read_parquet_parts", oom)
    with pytest.raises(MemoryError):
        L.run_log_groups(tmp_path)
