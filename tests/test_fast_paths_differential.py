"""Fast paths against the exact slow paths they stand in for, on adversarial inputs: same keys, order and bits.

Pairs: run log grouping by Arrow (``run_log_groups``) vs its Python-object sort; Parquet lengths read by
column (``_parquet_lengths``) vs the row reader; the columnar join (``LengthsById``, ``RowAligned``) vs a
dict; the columnar epoch path (``epoch_prediction``, ``epoch_lengths``, ``_Epoch``) vs the per-prompt code
it replaced; chunked ``featurize_compact`` and ``merge_entries`` vs whole-matrix ``np.unique``/``np.bincount``.
The two divergences found (a null id in a bare samples folder; the mean of -0.0 lengths) are fixed and pinned here.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspc import portable_math as pm
from aspc.emit import schema as S
from aspc.epoch_predict import _Epoch, epoch_lengths, epoch_prediction
from aspc.errors import InputError
from aspc.io import lengths as L
from aspc.io.history import read_history
from aspc.io.lengths_by_id import LengthsById
from aspc.io.ragged import RaggedLengths
from aspc.predict.base import LengthPrediction
from aspc.predict.features import FeatureConfig, featurize, featurize_compact
from aspc.predict.history import DEFAULT_KAPPA, at_least_one_token, blend_history
from aspc.predict.sparse_kernel import merge_entries
from aspc.replan import prediction_of, refit_factor
from aspc.runtime.lengths import join_actual_lengths
from aspc.runtime.work import work_from_table
from aspc.simulate_inputs import RowAligned, known_lengths
from aspc.testing.plans import plan_table
from tests.test_epochs_scale import _rolled  # the per-prompt loop epoch_lengths ran before
from tests.test_epochs_scale import _slow as _by_rows  # read_lengths through the row reader alone

SETTINGS = settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

# Code points whose UTF-8 byte order and UTF-16 order differ (U+E000 / U+FFFF vs U+10000), ASCII
# around NUL and DEL, a 2-byte and a 3-byte lead, and the last code point.
ID_PIECES = ["", "a", "b", "Z", " ", "\x00", "\x7f", "\x80", "é", "€", "\ud7ff", "\ue000", "\uffff",
             "\U00010000", "\U0010ffff", "1", "01"]  # fmt: skip
ids_text = st.lists(st.sampled_from(ID_PIECES), max_size=4).map("".join)


def _same_dict(a, b):
    assert list(a) == list(b)
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), k


# ---------------------------------------------------------------------------------------------------------
# 1. run_log_groups: Arrow dictionary_encode + sort vs the Python-object sort


def _write_samples(log: Path, parts, types) -> Path:
    samples = log / "samples"
    samples.mkdir(parents=True, exist_ok=True)
    for j, ((ids, lens), typ) in enumerate(zip(parts, types, strict=True)):
        table = pa.table({"prompt_id": pa.array(ids, typ), "response_len": pa.array(lens, pa.int64())})
        pq.write_table(table, samples / f"part-{j:06d}.parquet", row_group_size=3)  # several chunks a part
    return log


def _groups_by_python(path):
    """run_log_groups through its Python-object sort alone."""
    saved = L._group_string_ids
    L._group_string_ids = lambda col: None
    try:
        return L.run_log_groups(path)
    finally:
        L._group_string_ids = saved


def _check_groups(got, ids, lens):
    keys, values, offsets = got
    assert keys == sorted(set(ids))
    assert values.dtype == np.float64 and offsets.dtype == np.int64 and offsets.tolist()[-1] == len(ids)
    want = {k: [float(x) for i, x in zip(ids, lens, strict=True) if i == k] for k in keys}
    assert {k: values[offsets[j] : offsets[j + 1]].tolist() for j, k in enumerate(keys)} == want


_part = st.lists(st.tuples(ids_text, st.integers(0, 10**7)), max_size=10).map(
    lambda r: ([i for i, _ in r], [x for _, x in r])
)


@SETTINGS
@given(parts=st.lists(_part, min_size=1, max_size=3), large=st.lists(st.booleans(), min_size=3, max_size=3))
def test_run_log_groups_by_arrow_are_the_python_sort(tmp_path_factory, parts, large):
    log = tmp_path_factory.mktemp("log")
    types = [pa.large_string() if b else pa.string() for b in large[: len(parts)]]
    _write_samples(log, parts, types)
    ids = [i for p in parts for i in p[0]]
    lens = [x for p in parts for x in p[1]]
    fast, slow = L.run_log_groups(log), _groups_by_python(log)
    _check_groups(fast, ids, lens)
    assert fast[0] == slow[0] and fast[1].tobytes() == slow[1].tobytes() and fast[2].tobytes() == slow[2].tobytes()
    bounds = fast[2].tolist()
    segments = [fast[1][s:e] for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
    _same_dict(L.read_lengths(log), dict(zip(fast[0], segments, strict=True)))


@pytest.mark.parametrize(
    "second", [pa.large_string(), pa.dictionary(pa.int32(), pa.string()), pa.string_view()], ids=str
)
def test_run_log_parts_of_other_string_types_group_alike(tmp_path, second):
    parts = [(["b", "\U00010000", "a"], [1, 2, 3]), (["\uffff", "a", "c"], [4, 5, 6]), ([], [])]
    _write_samples(tmp_path, parts, [pa.string(), second, pa.string()])
    ids = ["b", "\U00010000", "a", "\uffff", "a", "c"]
    fast, slow = L.run_log_groups(tmp_path), _groups_by_python(tmp_path)
    _check_groups(fast, ids, [1, 2, 3, 4, 5, 6])
    assert fast[0] == slow[0] and fast[1].tobytes() == slow[1].tobytes() and fast[2].tobytes() == slow[2].tobytes()


def test_a_run_log_written_by_aspc_run_groups_as_python(tmp_path):
    from click.testing import CliRunner

    from aspc.cli import main

    ids = ["b", "é", "\uffff", "\U00010000", "a b", "10", "9", "Z", "\U0010ffff", "\ue000"]
    lengths = {i: [k * 10 + 1, k * 10 + 2, k * 10 + 3] for k, i in enumerate(ids)}
    rows = [{"id": i, "prompt": f"say {k} things " * (k + 1), "lengths": lengths[i]} for k, i in enumerate(ids)]
    data = tmp_path / "in.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    run = CliRunner()
    r = run.invoke(main, ["compile", str(data), "-o", str(tmp_path / "plan.parquet"), "--length-field", "lengths",
                          "--samples-per-prompt", "2"], catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 0, r.output
    r = run.invoke(main, ["run", str(tmp_path / "plan.parquet"), "--actual-lengths", str(data), "--length-field",
                          "lengths", "--log", str(tmp_path / "RUN"), "--quiet", "--workers", "2", "--global-batch",
                          "4"], catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 0, r.output
    fast, slow = L.run_log_groups(tmp_path / "RUN"), _groups_by_python(tmp_path / "RUN")
    assert fast[0] == slow[0] == sorted(ids)
    assert fast[1].tobytes() == slow[1].tobytes() and fast[2].tobytes() == slow[2].tobytes()
    got = L.read_lengths(tmp_path / "RUN")
    assert {k: sorted(v.tolist()) for k, v in got.items()} == {i: [float(x) for x in lengths[i][:2]] for i in ids}


def test_a_null_prompt_id_in_a_bare_samples_dir_is_an_input_error(tmp_path):
    # The Python-sort fallback raised TypeError (np.argsort of None and str); one null row was keyed "None".
    _write_samples(tmp_path / "two", [(["a", None, "b"], [1, 2, 3])], [pa.string()])
    _write_samples(tmp_path / "one", [([None], [1])], [pa.string()])
    for d in ("two", "one"):
        with pytest.raises(InputError, match="null prompt_id"):
            L.run_log_groups(tmp_path / d)


# ---------------------------------------------------------------------------------------------------------
# 2. _parquet_lengths (by column) vs the row reader


def _outcome(read, path, **kw):
    try:
        got = read(path, **kw)
    except InputError as exc:
        return "error", str(exc)
    return "ok", [(k, v.dtype.str, v.shape, v.tobytes()) for k, v in got.items()]


_PARQUET_CASES = {
    "negative zero": pa.table({"id": ["a", "b"], "lengths": pa.array([-0.0, 0.0])}),
    "subnormals in lists, an id twice": pa.table(
        {"id": ["a", "a"], "lengths": pa.array([[-0.0, 5e-324], [1e-310]], pa.list_(pa.float64()))}
    ),
    "float32 extremes": pa.table(
        {"id": ["a", "b"], "lengths": pa.array([np.float32(1e-45), np.float32(1e7)], pa.float32())}
    ),
    "float32 past MAX_LENGTH": pa.table({"id": ["a"], "lengths": pa.array([np.float32(10_000_001)], pa.float32())}),
    "just past MAX_LENGTH": pa.table({"id": ["a"], "lengths": pa.array([np.nextafter(1e7, 2e7)])}),
    "uint64 ids above int64": pa.table({"id": pa.array([2**64 - 1, 2**63], pa.uint64()), "lengths": [1, 2]}),
    "int8 ids, uint8 lengths": pa.table(
        {"id": pa.array([-128, 127, -128], pa.int8()), "lengths": pa.array([1, 255, 0], pa.uint8())}
    ),
    "uint64 MAX_LENGTH": pa.table({"id": ["a"], "lengths": pa.array([10_000_000], pa.uint64())}),
    "uint64 huge": pa.table({"id": ["a"], "lengths": pa.array([2**64 - 1], pa.uint64())}),
    "dictionary ids": pa.table({"id": pa.array(["b", "a", "b"]).dictionary_encode(), "lengths": [1, 2, 3]}),
    "large_string ids, large_list int16": pa.table(
        {
            "id": pa.array(["b", "a", "b"], pa.large_string()),
            "lengths": pa.array([[1], [2], [3, 4]], pa.large_list(pa.int16())),
        }
    ),
    "length column twice": pa.Table.from_arrays(
        [pa.array(["a"]), pa.array([1]), pa.array([2])], names=["id", "lengths", "lengths"]
    ),
    "id column twice": pa.Table.from_arrays(
        [pa.array(["a"]), pa.array(["b"]), pa.array([2])], names=["id", "id", "lengths"]
    ),
    "struct beside": pa.table({"id": ["a"], "lengths": [3], "s": pa.array([{"x": 1, "y": [None]}])}),
    "timestamp beside": pa.table({"id": ["a"], "lengths": [3], "t": pa.array([0], pa.timestamp("s"))}),
    "null in a list": pa.table({"id": ["a", "b"], "lengths": pa.array([[1, None], [2]], pa.list_(pa.int64()))}),
    "null list": pa.table({"id": ["a", "b"], "lengths": pa.array([[1], None], pa.list_(pa.int64()))}),
    "fixed-size list": pa.table({"id": ["a"], "lengths": pa.array([[1, 2]], pa.list_(pa.int64(), 2))}),
    "float16": pa.table({"id": ["a"], "lengths": pa.array([np.float16(3)], pa.float16())}),
    "bool lengths": pa.table({"id": ["a"], "lengths": [True]}),
    "NUL and empty ids": pa.table({"id": ["a\x00", "a", ""], "lengths": [1, 2, 3]}),
    "binary ids": pa.table({"id": pa.array([b"a"], pa.binary()), "lengths": [7]}),
    "float ids": pa.table({"id": [1.0], "lengths": [7]}),
}


@pytest.mark.parametrize("name", list(_PARQUET_CASES))
def test_parquet_lengths_by_column_are_the_row_readers(tmp_path, name):
    path = tmp_path / "lengths.parquet"
    pq.write_table(_PARQUET_CASES[name], path, row_group_size=2)
    assert _outcome(L.read_lengths, path, length_field="lengths") == _outcome(_by_rows, path, length_field="lengths")


def test_parquet_one_column_as_id_and_length(tmp_path):
    path = tmp_path / "lengths.parquet"
    pq.write_table(pa.table({"id": pa.array([3, 4, 3], pa.int32())}), path)
    assert L._parquet_lengths(path, "id", "id") is not None
    assert _outcome(L.read_lengths, path, length_field="id") == _outcome(_by_rows, path, length_field="id")


_INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
_FLOATS = [0.0, -0.0, 5e-324, 1.5, 0.49, 9_999_999.5, 1e7, float(np.nextafter(1e7, 2e7)), float("nan"), -1.0]


@st.composite
def _length_tables(draw):
    n = draw(st.integers(1, 6))
    id_type = draw(st.sampled_from([*_INT_TYPES, pa.string(), pa.large_string()]))
    if pa.types.is_integer(id_type):
        info = np.iinfo(np.dtype(str(id_type)))
        ids = draw(st.lists(st.sampled_from([int(info.min), int(info.max), 0, 7]), min_size=n, max_size=n))
    else:
        ids = draw(st.lists(ids_text, min_size=n, max_size=n))
    len_type = draw(st.sampled_from([*_INT_TYPES, pa.float32(), pa.float64()]))
    clean = draw(st.booleans())  # only values the columns take: the fast path answers
    if pa.types.is_integer(len_type):
        info = np.iinfo(np.dtype(str(len_type)))
        value = st.sampled_from([int(info.min), int(info.max), 0, 1, 9_999_999, 10_000_000, 10_000_001])
        value = value.filter(lambda v: info.min <= v <= info.max and (not clean or 0 <= v <= 10_000_000))
    else:
        value = st.sampled_from(_FLOATS[:6] if clean else _FLOATS)
    if not clean:
        value = st.one_of(value, value, value, value, st.none())  # a null now and then
    shape = draw(st.sampled_from(["scalar", "list", "large_list"]))
    if shape == "scalar":
        lens = pa.array(draw(st.lists(value, min_size=n, max_size=n)), len_type)
    else:
        lists = draw(st.lists(st.lists(value, min_size=1 if clean else 0, max_size=3), min_size=n, max_size=n))
        lens = pa.array(lists, pa.list_(len_type) if shape == "list" else pa.large_list(len_type))
    return pa.table({"id": pa.array(ids, id_type), "lengths": lens}), draw(st.integers(1, 4))


@settings(SETTINGS, max_examples=150)
@given(case=_length_tables())
def test_parquet_lengths_of_any_widths_and_values_are_the_row_readers(tmp_path_factory, case):
    table, row_group = case
    path = tmp_path_factory.mktemp("pq") / "lengths.parquet"
    pq.write_table(table, path, row_group_size=row_group)
    assert _outcome(L.read_lengths, path, length_field="lengths") == _outcome(_by_rows, path, length_field="lengths")


# ---------------------------------------------------------------------------------------------------------
# 3. The columnar join (LengthsById, RowAligned) vs a dict


def _joined(work, actual, **kw):
    try:
        got = join_actual_lengths(work, actual, **kw)
    except InputError as exc:
        return "error", str(exc)
    return "ok", got.response_len.dtype.str, got.response_len.tobytes(), got.notes, got.source


_JOIN_IDS = ["", "1", "01", "1.0", " 1", "a", "a ", "A", "é", "\U00010000", "\x00", "p0000000"]
_JOIN_VALUES = [0.0, -0.0, 0.5, 1.5, 2.5, 7.0, 1e7, 4e9]


@settings(SETTINGS, max_examples=200)
@given(data=st.data())
def test_join_by_id_in_columns_is_the_dict_join(data):
    keys = data.draw(st.lists(st.sampled_from(_JOIN_IDS), min_size=1, max_size=8, unique=True))
    segs = [np.array(data.draw(st.lists(st.sampled_from(_JOIN_VALUES), min_size=1, max_size=4))) for _ in keys]
    # A permutation, a subset, repeats, or ids with no lengths.
    plan_ids = data.draw(st.lists(st.sampled_from([*keys, "zz-missing"]), min_size=1, max_size=10,
                                  unique=data.draw(st.booleans())))  # fmt: skip
    table = plan_table(np.arange(len(plan_ids)), n_samples=data.draw(st.sampled_from([1, 2, 5])), ids=plan_ids)
    if data.draw(st.booleans()):
        table = table.set_column(0, S.PROMPT_ID, pa.array(plan_ids, pa.large_string()))
    cut = data.draw(st.integers(0, len(plan_ids)))
    work = work_from_table(pa.concat_tables([table.slice(0, cut), table.slice(cut)]))
    cap = data.draw(st.sampled_from([None, 1, 3]))
    plain = dict(zip(keys, segs, strict=True))
    by_id = LengthsById(pa.array(keys, data.draw(st.sampled_from([pa.string(), pa.large_string()]))),
                        RaggedLengths.from_arrays(segs))  # fmt: skip
    want = _joined(work, plain, max_new_tokens=cap, source_name="x")
    assert _joined(work, by_id, max_new_tokens=cap, source_name="x") == want
    if all(p in plain for p in plan_ids):  # keyed by the plan's own ids: the _same_ids shortcut
        own = LengthsById(work.table.column(S.PROMPT_ID), RaggedLengths.from_arrays([plain[p] for p in plan_ids]))
        assert _joined(work, own, max_new_tokens=cap, source_name="x") == want


@settings(SETTINGS, max_examples=150)
@given(data=st.data())
def test_lengths_by_input_row_are_the_lengths_by_id(data):
    n = data.draw(st.integers(1, 10))
    ids = data.draw(st.lists(st.sampled_from(_JOIN_IDS), min_size=n, max_size=n, unique=True))
    rows = np.sort(np.array(data.draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n, unique=True))))
    segs = [np.array(data.draw(st.lists(st.sampled_from(_JOIN_VALUES), min_size=1, max_size=3))) for _ in ids]
    by_id = LengthsById(pa.array(ids, pa.string()), RaggedLengths.from_arrays(segs))
    aligned = RowAligned(by_id, rows)
    pick = data.draw(st.lists(st.integers(0, n - 1), max_size=12, unique=data.draw(st.booleans())))
    picked = [ids[i] for i in pick]
    table = SimpleNamespace(source_rows=rows[pick], id_array=pa.array(picked, pa.string()), ids=picked)
    want = known_lengths(dict(zip(ids, segs, strict=True)), table)
    for got in (known_lengths(aligned, table), known_lengths(by_id, table)):
        assert got.values.tobytes() == want.values.tobytes() and got.offsets.tobytes() == want.offsets.tobytes()
    plan = aligned.for_plan(pa.table({S.PROMPT_ID: table.id_array, S.SOURCE_ROW: pa.array(rows[pick], pa.int64())}))
    assert plan is by_id or list(plan) == picked
    assert all(plan[p].tobytes() == segs[ids.index(p)].tobytes() for p in picked)


# ---------------------------------------------------------------------------------------------------------
# 4. The columnar epoch path vs the per-prompt code it replaced


def _epoch_prediction_per_prompt(plan, logs):
    """epoch_prediction as it was before the columnar path (0503c25^): dicts of arrays, np.mean per prompt."""
    t = plan.table
    ids = t.column(S.PROMPT_ID).to_pylist()
    base = at_least_one_token(prediction_of(t))
    per_epoch = [read_history(p) for p in logs]
    last = per_epoch[-1]
    observed = [last.get(pid) for pid in ids]
    seen = np.array([o is not None and o.size > 0 for o in observed])
    if seen.sum() >= 32:
        obs = np.flatnonzero(seen)
        y = pm.log(np.maximum([float(np.mean(observed[i])) for i in obs], 1.0))
        f = refit_factor(t.column(S.PROMPT).to_pylist(), base.mean, obs, y)
        base = LengthPrediction(base.mean * f, base.q10 * f, base.q50 * f, base.q90 * f)
    pred = blend_history(base, observed, DEFAULT_KAPPA)
    if len(per_epoch) >= 2:
        prev = per_epoch[-2]
        common = [pid for pid in ids if pid in prev and pid in last]
        if common:
            g = pm.mean([np.mean(last[p]) for p in common]) / max(pm.mean([np.mean(prev[p]) for p in common]), 1e-9)
            pred = LengthPrediction(pred.mean * g, pred.q10 * g, pred.q50 * g, pred.q90 * g)
    return pred


_POOL = [f"q{i}" for i in range(45)] + ["", "é", "\U00010000"]
# Zero, one token, equal values, MAX_LENGTH. A run log's lengths past MAX_LENGTH (2**52 once drew sums past 2**53,
# the exact-sum shortcut's limit) are refused as damage now (tests/test_runlog_damage.py); the sums past 2**53 are
# test_epoch_means_of_edge_groups_are_np_mean's.
_LOG_LENGTHS = st.sampled_from([0, 1, 2, 7, 7, 7, 100, 4000, 10**7])


@settings(SETTINGS, max_examples=40)
@given(data=st.data())
def test_epoch_prediction_is_the_per_prompt_one(tmp_path_factory, data):
    n_plan = data.draw(st.sampled_from([1, 5, 40]))
    ids = data.draw(st.permutations(_POOL))[:n_plan]
    predicted = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 300.0, 1e6]), min_size=n_plan,
                                            max_size=n_plan)))  # fmt: skip
    plan = SimpleNamespace(table=plan_table(np.arange(n_plan), ids=ids, predicted=predicted))
    root = tmp_path_factory.mktemp("epochs")
    logs = []
    for e in range(data.draw(st.integers(1, 3))):
        # Prompts with no, one or several lengths in an epoch; ids not in the plan; an empty epoch.
        rows = data.draw(st.lists(st.tuples(st.sampled_from([*_POOL, "not-planned"]), _LOG_LENGTHS), max_size=120))
        if data.draw(st.booleans()):
            rows += [(i, data.draw(_LOG_LENGTHS)) for i in ids for _ in range(data.draw(st.integers(1, 3)))]
        samples = root / f"log{e}" / "samples"
        samples.mkdir(parents=True)
        if rows:
            pq.write_table(pa.table({"prompt_id": pa.array([r[0] for r in rows], pa.string()),
                                     "response_len": pa.array([r[1] for r in rows], pa.int64())}),
                           samples / "part-000000.parquet")  # fmt: skip
        logs.append(root / f"log{e}")
    got, want = epoch_prediction(plan, logs), _epoch_prediction_per_prompt(plan, logs)
    for name in ("mean", "q10", "q50", "q90"):
        assert getattr(got, name).tobytes() == getattr(want, name).tobytes(), name


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@settings(SETTINGS, max_examples=300)
@given(
    actual=st.dictionaries(
        st.sampled_from(["", "a", "\ud800", "é", "\U00010000", "\x00", "1"]),  # a lone surrogate: the dict loop
        st.lists(st.sampled_from([0.0, -0.0, 0.5, 1.5, 2.5, -3.0, 1e300, float("nan"), float("inf"), 7.0]), max_size=5),
        max_size=6,
    ),
    epoch=st.integers(1, 9),
    n=st.integers(1, 9),
    drift=st.sampled_from([0.0, 0.07, -0.3, -1.0, 1e-17]),
)
def test_epoch_lengths_of_odd_ids_and_values_are_the_per_prompt_roll(actual, epoch, n, drift):
    actual = {k: np.array(v) for k, v in actual.items()}
    got = epoch_lengths(actual, epoch, n, drift)
    _same_dict(got, _rolled(actual, epoch, n, drift))
    _same_dict(epoch_lengths(got, epoch, n, drift), _rolled(_rolled(actual, epoch, n, drift), epoch, n, drift))


@pytest.mark.parametrize(
    "groups",
    [
        [[5.0]],  # one observation
        [[7.0] * 9, [7.0]],  # identical values
        [[2.0**52, 2.0**52], [1.0]],  # a total past 2**53: averaged group by group
        [[2.0**53 - 1], [0.0]],
        [[0.0, 0.0], [3.0, 0.0]],
        [[0.5, 1.5], [3.0]],  # fractions: group by group
    ],
)
def test_epoch_means_of_edge_groups_are_np_mean(groups):
    arrays = [np.array(g) for g in groups]
    ep = _Epoch(([f"k{i}" for i in range(len(arrays))], np.concatenate(arrays), np.r_[0, np.cumsum([a.size for a in arrays])]),
                ["k0"])  # fmt: skip
    assert ep.means().tobytes() == np.array([np.mean(a) for a in arrays]).tobytes()


def test_epoch_mean_of_negative_zero_lengths_is_np_mean():
    # The exact-sum shortcut (np.add.reduceat / sizes) kept a group of -0.0 at -0.0; np.mean's sum starts from 0.0.
    if np.signbit(np.mean(np.array([-0.0]))):
        pytest.skip("this NumPy's mean keeps -0.0 itself")
    ep = _Epoch((["k"], np.array([-0.0, -0.0]), np.array([0, 2])), ["k"])
    assert ep.means().tobytes() == np.array([np.mean(np.array([-0.0, -0.0]))]).tobytes()


# ---------------------------------------------------------------------------------------------------------
# 5. featurize_compact in chunks and merge_entries vs the whole matrix, np.unique and np.bincount

_TEXT_PIECES = ["", " ", "a", "A", "the", "\x00", "\n", "é", "数", "\ud800", "\U0001f600", "_", "x" * 9, "Ab cd", "\t"]


@settings(SETTINGS, max_examples=200)
@given(
    texts=st.lists(st.lists(st.sampled_from(_TEXT_PIECES), max_size=8).map("".join), max_size=12),
    config=st.builds(
        FeatureConfig,
        bits=st.sampled_from([1, 3, 18]),
        char_ngrams=st.sampled_from([(), (1,), (2, 3)]),
        word_bigrams=st.booleans(),
        head_bytes=st.sampled_from([0, 1, 4, 3072]),
        tail_bytes=st.sampled_from([0, 2, 1024]),
    ),
    chunk=st.integers(1, 13),
)
def test_featurize_compact_in_chunks_is_the_whole_compacted_matrix(texts, config, chunk):
    whole = featurize(texts, config)
    want = whole.compact()
    got = featurize_compact(texts, config, chunk=chunk)
    for k in ("dense", "rows", "cols", "vals"):
        g, w = getattr(got, k), getattr(want, k)
        assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes(), k
    assert got.n_hashed == want.n_hashed
    key = whole.rows * whole.n_hashed + whole.cols
    uniq, inv = np.unique(key, return_inverse=True)
    assert want.rows.tobytes() == (uniq // whole.n_hashed).astype(np.int64).tobytes()
    assert want.cols.tobytes() == (uniq % whole.n_hashed).astype(np.int64).tobytes()
    assert want.vals.tobytes() == np.bincount(inv.reshape(-1), weights=whole.vals, minlength=uniq.size).tobytes()


_ENTRY_VALUES = [0.0, -0.0, 1.0, -1.0, 5e-324, float("nan"), float("inf"), -float("inf"), 1e308, 0.1, 1 / 3]


@settings(SETTINGS, max_examples=300)
@given(n_rows=st.integers(1, 4), n_cols=st.integers(1, 4), data=st.data())
def test_merge_entries_of_special_values_is_unique_and_bincount(n_rows, n_cols, data):
    n = data.draw(st.integers(0, 20))
    rows = np.array(data.draw(st.lists(st.integers(0, n_rows - 1), min_size=n, max_size=n)), dtype=np.int64)
    cols = np.array(data.draw(st.lists(st.integers(0, n_cols - 1), min_size=n, max_size=n)), dtype=np.int64)
    vals = np.array(data.draw(st.lists(st.sampled_from(_ENTRY_VALUES), min_size=n, max_size=n)), dtype=np.float64)
    r, c, v = merge_entries(rows, cols, vals, n_rows, n_cols)
    uniq, inv = np.unique(rows * n_cols + cols, return_inverse=True)
    assert r.tobytes() == (uniq // n_cols).astype(np.int64).tobytes()
    assert c.tobytes() == (uniq % n_cols).astype(np.int64).tobytes()
    want = np.bincount(inv.reshape(-1), weights=vals, minlength=uniq.size).astype(np.float64)
    assert v.tobytes() == want.tobytes()
