"""Readers: formats, chat prompts, ids, lengths, and one-line errors on bad input."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

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
        (None, "missing length field"),
    ],
)
def test_bad_lengths(tmp_path, value, fragment):
    p = write_jsonl(tmp_path / "bad.jsonl", [{"id": "a", "prompt": "x", "len": value}])
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
    with pytest.raises(InputError, match="unsupported file type"):
        read_prompts(tmp_path / "data.txt")
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
