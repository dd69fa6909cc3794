"""The prompt column encoded in two halves (aspc.emit.halves) gives pq.write_table's bytes exactly."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.emit import halves, stitch
from aspc.emit import schema as S
from tests.test_stitch import OPTIONS, _plain, _plan_table


def _split(table: pa.Table) -> bytes | None:
    parts = stitch.split_write(table, S.PROMPT, OPTIONS, lambda *a: halves.encode_in_halves(*a))
    return None if parts is None else b"".join(bytes(p) for p in parts)


@pytest.fixture
def counted(monkeypatch):
    """Halves from any size on; records whether each big column was cut (True) or left whole."""
    monkeypatch.setattr(halves, "HALVES_ROWS", 1)
    used: list[bool] = []
    encode = halves.encode_in_halves

    def spy(*args):
        out = encode(*args)
        used.append(out is not None)
        return out

    monkeypatch.setattr(halves, "encode_in_halves", spy)
    return used


@pytest.mark.parametrize("text,n,cut", [("distinct", 150_000, True), ("long", 6000, True), ("repeated", 150_000, False)])
def test_same_bytes_in_halves(counted, text, n, cut):
    table = _plan_table(np.random.default_rng(7), n, text)
    assert _split(table) == _plain(table)
    # Distinct prompts are cut; a dictionary that holds is never PLAIN, so it is left whole.
    assert counted == [cut]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2000, 9000), seed=st.integers(0, 2**32 - 1))
def test_same_bytes_wherever_the_cut_falls(n, seed):
    # Values of 0-3,000 bytes: a page ends after every batch or two, the cut anywhere.
    halves.HALVES_ROWS, keep = 1, halves.HALVES_ROWS
    try:
        table = _plan_table(np.random.default_rng(seed), n, "long")
        assert _split(table) == _plain(table)
    finally:
        halves.HALVES_ROWS = keep


def test_the_cut_is_a_page_end_of_the_whole_column(monkeypatch):
    monkeypatch.setattr(halves, "HALVES_ROWS", 1)
    table = _plan_table(np.random.default_rng(8), 150_000, "distinct")
    arr = table.column(S.PROMPT).chunk(0)
    p0, m, ends = halves.split_row(arr, OPTIONS)
    whole = stitch.whole(memoryview(_plain(table.select([S.PROMPT]))))
    pages = halves._pages(whole.data, whole.cc)
    rows = np.cumsum([p[2] for p in pages if p[0] == halves._DATA_PAGE])
    assert rows[0] == p0 and np.array_equal(rows[1:], ends)  # the dictionary-encoded page, then PLAIN ones
    assert m in ends[:-1]


def test_a_cut_off_a_page_end_is_refused(monkeypatch):
    monkeypatch.setattr(halves, "HALVES_ROWS", 1)
    table = _plan_table(np.random.default_rng(9), 150_000, "distinct").select([S.PROMPT])
    p0, m, ends = halves.split_row(table.column(0).chunk(0), OPTIONS)
    assert halves.encode_in_halves(table, OPTIONS, stitch._to_buffer) is not None
    for wrong in (m - halves._BATCH, m + halves._BATCH):  # a batch end, not a page end
        monkeypatch.setattr(halves, "split_row", lambda *a, w=wrong: (p0, w, ends))
        assert halves.encode_in_halves(table, OPTIONS, stitch._to_buffer) is None
    monkeypatch.setattr(halves, "split_row", lambda *a: (p0 + halves._BATCH, m, ends))  # wrong fallback row
    assert halves.encode_in_halves(table, OPTIONS, stitch._to_buffer) is None


def test_a_wrong_page_rule_is_caught(monkeypatch):
    # Believing pages of 512 KiB (the writer ends them at 1 MiB): the predicted page
    # ends disagree with the written ones, and the column is left whole.
    monkeypatch.setattr(halves, "HALVES_ROWS", 1)
    monkeypatch.setattr(halves, "_PAGE_BYTES", 1 << 19)
    table = _plan_table(np.random.default_rng(9), 150_000, "distinct").select([S.PROMPT])
    assert halves.split_row(table.column(0).chunk(0), OPTIONS) is not None
    assert halves.encode_in_halves(table, OPTIONS, stitch._to_buffer) is None


def test_what_halves_do_not_cover_is_left_whole(monkeypatch):
    table = _plan_table(np.random.default_rng(10), 150_000, "distinct")
    arr = table.column(S.PROMPT).chunk(0)
    assert len(arr) < halves.HALVES_ROWS and halves.split_row(arr, OPTIONS) is None  # small
    monkeypatch.setattr(halves, "HALVES_ROWS", 1)
    assert halves.split_row(arr, OPTIONS) is not None
    assert halves.split_row(arr, {**OPTIONS, "data_page_size": 1 << 16}) is None  # another page size
    assert halves.split_row(arr, {**OPTIONS, "use_dictionary": False}) is None
    with_null = pa.array(arr.to_pylist()[:-1] + [None], pa.string())
    assert halves.split_row(with_null, OPTIONS) is None
    assert halves.split_row(table.column(S.SOURCE_ROW).chunk(0), OPTIONS) is None  # not strings


def test_merged_statistics_are_the_whole_columns():
    a = [[3, stitch._I64, 0], [5, stitch._BINARY, b"m"], [6, stitch._BINARY, b"b"], [7, stitch._TRUE, True]]
    b = [[3, stitch._I64, 0], [5, stitch._BINARY, b"z"], [6, stitch._BINARY, b"a"], [7, stitch._TRUE, True]]
    merged = halves._merge_stats(a, b)
    assert [f[2] for f in merged] == [0, b"z", b"a", True]
    with pytest.raises(stitch._Unexpected):  # an inexact (truncated) bound cannot be merged
        halves._merge_stats(a, [*b[:3], [7, stitch._FALSE, False]])
    with pytest.raises(stitch._Unexpected):  # a bound one half dropped
        halves._merge_stats(a, b[:2])


def test_finding_the_cut_imports_no_pandas():
    # pa.array() of a Python list asks pandas whether the list is one of its
    # types, importing it (~0.3 s of GIL on a 2-core compile): the cut is found
    # from slices of the column instead.
    import subprocess
    import sys

    code = (
        "import sys, pyarrow as pa\n"
        "from aspc.emit import halves\n"
        "import numpy as np\n"
        "data = b''.join(f'prompt {i} '.encode() * 40 for i in range(halves.HALVES_ROWS))\n"
        "offsets = np.cumsum([0] + [len(f'prompt {i} ') * 40 for i in range(halves.HALVES_ROWS)], dtype=np.int32)\n"
        "arr = pa.StringArray.from_buffers(halves.HALVES_ROWS, pa.py_buffer(offsets), pa.py_buffer(data))\n"
        "assert halves.split_row(arr, {}) is not None\n"
        "assert 'pandas' not in sys.modules, 'pandas was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
