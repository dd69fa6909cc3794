"""The stitched two-thread Parquet write (aspc.emit.stitch) gives pq.write_table's bytes exactly."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.emit import plan as plan_module
from aspc.emit import schema as S
from aspc.emit import stitch

OPTIONS = plan_module._WRITE_OPTIONS


def _plain(table: pa.Table, **options) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **{**OPTIONS, **options})
    return sink.getvalue().to_pybytes()


def _split(table: pa.Table, column: str = S.PROMPT, **options) -> bytes | None:
    parts = stitch.split_write(table, column, {**OPTIONS, **options})
    return None if parts is None else b"".join(bytes(p) for p in parts)


def _plan_table(rng: np.random.Generator, n: int, text: str) -> pa.Table:
    words = np.array(["a", "bb", "ccc", "dddd", "é", "日本", "", " "], dtype=object)
    if text == "distinct":  # no dictionary: the prompt column falls back to plain pages
        prompts = [f"prompt {i} " + " ".join(rng.choice(words[:6], 30)) for i in range(n)]
    elif text == "repeated":  # a dictionary that holds
        prompts = [str(x) for x in rng.choice(words, n)]
    else:
        prompts = ["x" * int(k) for k in rng.integers(0, 3000, n)]  # long values, few per page
    cols = {
        S.PROMPT_ID: pa.array([f"p{i:07d}" for i in rng.permutation(n)]),
        S.SOURCE_ROW: pa.array(rng.permutation(n).astype(np.int64)),
        S.PROMPT: pa.array(prompts, pa.string()),
        S.PROMPT_TOKENS: pa.array(rng.integers(1, 500, n).astype(np.int64)),
        S.N_SAMPLES: pa.array(np.full(n, 4, np.int32)),
        S.PREDICTED_LEN: pa.array(rng.lognormal(5, 1, n)),
        S.PREDICTED_Q10: pa.array(rng.lognormal(4, 1, n)),
        S.PREDICTED_Q50: pa.array(np.round(rng.lognormal(5, 1, n))),
        S.PREDICTED_Q90: pa.array(rng.lognormal(6, 1, n)),
        S.MINIBATCH: pa.array((np.arange(n) // 16).astype(np.int32)),
        S.GROUP: pa.array((np.arange(n) // 128).astype(np.int32)),
        S.DISPATCH_RANK: pa.array(np.arange(n, dtype=np.int64)),
    }
    table = pa.Table.from_arrays([cols[f.name] for f in S.PLAN_SCHEMA], schema=S.PLAN_SCHEMA)
    return table.replace_schema_metadata({b"aspc.k": b"v" * int(rng.integers(0, 200))})


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 3000),
    text=st.sampled_from(["distinct", "repeated", "long"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_same_bytes_as_write_table(n, text, seed):
    table = _plan_table(np.random.default_rng(seed), n, text)
    assert _split(table) == _plain(table)


@pytest.mark.parametrize("column", [S.PROMPT_ID, S.PROMPT, S.DISPATCH_RANK, S.PREDICTED_LEN])
def test_any_column_may_be_the_big_one(column):
    # First, middle and last positions shift the other chunks differently.
    table = _plan_table(np.random.default_rng(1), 2000, "distinct")
    assert _split(table, column) == _plain(table)


@pytest.mark.parametrize("text", ["distinct", "repeated", "long"])
def test_same_bytes_at_many_pages(text):
    # Hundreds of pages, dictionary fallback, long varint offsets in the footer.
    table = _plan_table(np.random.default_rng(2), 150_000, text)
    assert _split(table) == _plain(table)


def test_what_it_does_not_handle_falls_back():
    table = _plan_table(np.random.default_rng(3), 500, "distinct")
    assert _split(table, row_group_size=100) is None  # five row groups
    assert _split(table, write_page_index=True) is None  # page index offsets in the chunks' metadata
    assert _split(table.slice(0, 0)) is None
    assert _split(table, "no such column") is None


def test_footer_codec_round_trips_and_refuses_the_unknown():
    data = memoryview(_plain(_plan_table(np.random.default_rng(4), 50, "repeated")))
    fields, start = stitch._footer(data)
    assert stitch._encode(fields) == bytes(data[start:-8])
    broken = bytearray(data)
    broken[-9] = 0x7F  # the footer's last byte (its end-of-struct) replaced
    with pytest.raises((stitch._Unexpected, IndexError)):
        stitch._footer(memoryview(bytes(broken)))


def test_write_plan_uses_it_and_reads_back(tmp_path, monkeypatch):
    from aspc.emit import read_plan, write_plan
    from aspc.emit.plan import Plan

    table = _plan_table(np.random.default_rng(5), 3000, "distinct").replace_schema_metadata(None)
    used = []
    split = stitch.split_write
    monkeypatch.setattr(stitch, "split_write", lambda *a: used.append(split(*a) is not None) or split(*a))
    plain = tmp_path / "plain.parquet"
    write_plan(Plan(table=table, config={"a": 1}), plain)
    assert used == []  # under SPLIT_WRITE_ROWS: plain write
    monkeypatch.setattr(plan_module, "SPLIT_WRITE_ROWS", 1)
    stitched = tmp_path / "stitched.parquet"
    write_plan(Plan(table=table, config={"a": 1}), stitched)
    assert used and all(used)
    assert stitched.read_bytes() == plain.read_bytes()
    assert read_plan(stitched, verify=False).table.equals(table)


@pytest.mark.parametrize("failure", ["allocate", "overflow"])
def test_sized_buffer_falls_back_to_a_growing_stream(monkeypatch, failure):
    # No address space for the sized buffer (strict overcommit), or output past its bound:
    # the same bytes through a growing stream.
    table = _plan_table(np.random.default_rng(6), 2000, "distinct")
    if failure == "allocate":
        def refuse(size):
            raise MemoryError(f"cannot allocate {size} bytes")

        monkeypatch.setattr(stitch.pa, "allocate_buffer", refuse)
    else:
        monkeypatch.setattr(stitch.pa, "allocate_buffer", lambda size: pa.py_buffer(bytearray(64)))
    assert _split(table) == _plain(table)
