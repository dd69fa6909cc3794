"""Inputs a bug hunt on the dataset readers broke: each case failed on the code before its fix (an id run and
export then refused, a valid CSV prompt refused, the wrong row named, text silently changed or dropped, a
message with wrong or missing advice).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aspc.errors import InputError
from aspc.io import read_prompts
from aspc.io.rows import MAX_PROMPT_BYTES, chat_messages
from tests.conftest import invoke_cli as _run
from tests.conftest import one_line_error as _one_line_error


def _refused(path: Path, *args: object) -> str:
    out = path.with_name("out.parquet")
    msg = _one_line_error(_run("compile", path, "-o", out, *args))
    assert not out.exists()
    return msg


def _prompts(path: Path, **options) -> list[str]:
    return list(read_prompts(path, **options).prompts)


def _utf8_string_column(values: list[bytes]) -> pa.Array:
    """A string column holding ``values`` as they are, valid UTF-8 or not (binary data written as strings)."""
    raw = pa.array(values, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(values), raw.buffers())


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_an_id_holding_a_nul_is_refused_naming_its_row(tmp_path, fmt):
    # "\x00scout" ends aspc's own rolling-scout ids: compile took it, then run and export refused the plan.
    recs = [{"id": "a", "prompt": "x"}, {"id": "b\x00scout", "prompt": "y"}]
    src = tmp_path / f"n.{fmt}"
    if fmt == "jsonl":
        src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(recs), src)  # the bulk reader
    else:
        src.write_text("id,prompt\na,x\nb\x00scout,y\n")
    msg = _refused(src)
    assert f"n.{fmt}: line {3 if fmt == 'csv' else 2}: id field 'id' holds a NUL character" in msg
    assert _prompts(src, on_bad_line="skip") == ["x"]


def test_a_verl_index_holding_a_nul_is_refused(tmp_path):
    src = tmp_path / "v.jsonl"
    src.write_text('{"prompt":"x","extra_info":{"index":"a\\u0000"}}\n')
    assert "extra_info.index holds a NUL character" in _refused(src)


def test_a_csv_prompt_over_the_csv_modules_field_limit_is_read(tmp_path):
    # Python's csv refused any field over 131,072 characters; JSONL takes prompts up to 2 MiB.
    src = tmp_path / "big.csv"
    src.write_text("id,prompt\na," + "x" * 200_000 + "\n")
    assert _prompts(src) == ["x" * 200_000]
    src.write_text("id,prompt\na," + "x" * (MAX_PROMPT_BYTES + 10) + "\n")
    assert "big.csv: line 2: prompt is 2.1 MB, over the 2 MiB limit" in _refused(src)


def test_a_parquet_cell_that_is_not_utf8_names_its_row_and_can_be_skipped(tmp_path):
    values = [b"prompt %d" % i for i in range(100)]
    values[57] = b"bad \xff\xfe here"
    src = tmp_path / "bad8.parquet"
    pq.write_table(pa.table({"id": [f"i{i}" for i in range(100)], "prompt": _utf8_string_column(values)}), src)
    assert "bad8.parquet: line 58: field 'prompt' is not valid UTF-8 text" in _refused(src)
    t = read_prompts(src, on_bad_line="skip")
    assert len(t.ids) == 99 and [s.row for s in t.skipped] == [57]


def test_a_bad_parquet_cell_in_a_column_aspc_does_not_read_refuses_nothing(tmp_path):
    src = tmp_path / "other.parquet"
    note = _utf8_string_column([b"ok", b"\xff"])
    # The empty prompt sends the file to the row reader, which read the whole batch and failed at row 1.
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": ["x", " "], "note": note}), src)
    t = read_prompts(src, on_bad_line="skip")
    assert list(t.ids) == ["a"] and t.skipped[0].reason == "prompt is empty"


def test_chat_messages_keep_their_other_keys(tmp_path):
    # name, tool_calls and tool_call_id were dropped: the model was prompted with another conversation.
    msgs = [
        {"role": "user", "content": "weather?"},
        {"content": "", "role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny", "name": "w"},
    ]
    want = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": msgs[1]["tool_calls"]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "w"},
    ]
    src = tmp_path / "tc.jsonl"
    src.write_text(json.dumps({"id": "a", "prompt": msgs}) + "\n" + json.dumps({"id": "b", "prompt": msgs[:1]}) + "\n")
    stored = _prompts(src)
    assert json.loads(stored[0]) == want and list(json.loads(stored[0])[1]) == ["role", "content", "tool_calls"]
    assert chat_messages(stored[0]) == want
    assert stored[1] == '[{"role":"user","content":"weather?"}]'  # role and content only: as before


def test_parquet_chat_messages_keep_their_other_keys_in_both_readers(tmp_path):
    recs = [
        {"id": "a", "prompt": [{"role": "system", "content": "Be brief.", "name": "sys"}, {"role": "user", "content": "hi"}]},
        {"id": "b", "prompt": [{"role": "user", "content": "x", "name": "u"}]},
    ]
    src = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(recs), src)
    # A struct gives every message every field: a null one is no key of that message.
    want = ['[{"role":"system","content":"Be brief.","name":"sys"},{"role":"user","content":"hi"}]',
            '[{"role":"user","content":"x","name":"u"}]']  # fmt: skip
    assert _prompts(src) == want
    pq.write_table(pa.Table.from_pylist([*recs, {"id": "c", "prompt": []}]), src)  # the row reader's turn
    assert _prompts(src, on_bad_line="skip") == want


def test_chat_content_given_as_parts_is_read_or_says_how_to_fix_it(tmp_path):
    # Text parts are joined (tests/test_chat_content_parts.py); a part of another kind is refused with the fix.
    src = tmp_path / "p.jsonl"
    src.write_text('{"id":"a","prompt":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}\n')
    assert _prompts(src) == ['[{"role":"user","content":"hi"}]']
    src.write_text('{"id":"a","prompt":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}\n')
    assert "content part 0 is 'image_url'; aspc plans text prompts only, drop non-text parts" in _refused(src)


def test_a_csv_field_with_text_after_its_closing_quote_is_refused(tmp_path):
    # Read as "hi there": the quotes vanished and the prompt changed, exit 0.
    src = tmp_path / "q.csv"
    src.write_text('id,prompt,len\na,"hi" there,5\nb,x,6\n')
    msg = _refused(src, "--length-field", "len")
    assert "q.csv: line 2: a quoted field has text after its closing quote; quote the whole field" in msg
    assert _prompts(src, length_field="len", on_bad_line="skip") == ["x"]


def test_valid_csv_quoting_is_still_read(tmp_path):
    src = tmp_path / "ok.csv"
    src.write_bytes(b'\xef\xbb\xbfid,prompt\r\na,"multi\r\nline ""quoted"" text"\r\nb,"plain, comma"\r\nc,say "hi"\r\n')
    assert _prompts(src) == ['multi\r\nline "quoted" text', "plain, comma", 'say "hi"']


def test_blank_lines_above_a_csv_header_are_skipped(tmp_path):
    src = tmp_path / "b.csv"
    src.write_text("\n\nid,prompt\na,x\n")
    assert _prompts(src) == ["x"]
    assert read_prompts(src).source_rows.tolist() == [0]


def test_a_short_csv_row_says_it_is_short(tmp_path):
    src = tmp_path / "s.csv"
    src.write_text("id,prompt,len\nb,x,3\na\n")
    msg = _refused(src, "--length-field", "len")
    assert "s.csv: line 3: row has 1 of the header's 3 fields, so 'prompt' is missing; complete the row" in msg
    src.write_text("id,prompt,len\nb,x,3\na,y\n")  # lengths not asked for: the short row is fine
    assert _prompts(src) == ["x", "y"]


def test_an_unterminated_json_string_reads_once_at(tmp_path):
    src = tmp_path / "u.jsonl"
    src.write_text('{"id":"a","prompt":"hi\n')
    assert "malformed JSON (Unterminated string starting at column 20)" in _refused(src)


def test_json_lines_in_a_json_file_say_to_rename_it(tmp_path):
    src = tmp_path / "l.json"
    src.write_text('{"id":"a","prompt":"hi"}\n{"id":"b","prompt":"x"}\n')
    assert "l.json: malformed JSON at line 2: Extra data; it holds one record per line: rename the file to .jsonl" in (
        _refused(src)
    )


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("d.jsonl", '{"id":"a","prompt":"hi","prompt":"bye"}\n'),
        ("e.jsonl", '{"id":"a","prompt":"hi","\\u0070rompt":"bye"}\n'),  # the same key, escaped
        ("d.json", '[{"id":"a","prompt":"hi","prompt":"bye"}]'),
    ],
)
def test_a_json_object_repeating_a_field_aspc_reads_is_refused(tmp_path, name, text):
    # The last value was kept silently; CSV and Parquet refuse a repeated column.
    src = tmp_path / name
    src.write_text(text)
    assert f"{name}: line 1: field 'prompt' appears twice in the object; keep one" in _refused(src)


def test_a_json_object_repeating_a_field_aspc_does_not_read_is_fine(tmp_path):
    src = tmp_path / "x.jsonl"
    src.write_text('{"id":"a","prompt":"hi","x":1,"x":2}\n{"id":"b","prompt":"p","prompt":"q"}\n')
    t = read_prompts(src, on_bad_line="skip")
    assert list(t.ids) == ["a"] and "appears twice" in t.skipped[0].reason


def test_read_prompts_raises_input_error_for_each_case(tmp_path):
    # The library raises the typed error the CLI turns into its one line.
    src = tmp_path / "d.jsonl"
    src.write_text('{"id":"a\\u0000","prompt":"hi"}\n')
    with pytest.raises(InputError, match="NUL"):
        read_prompts(src)


def test_a_null_inside_a_parquet_list_of_lengths_says_so(tmp_path):
    # It read "must be a number, got NoneType 'None'".
    src = tmp_path / "l.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": ["x", "y"], "lengths": [[3, 4], [5, None]]}), src)
    msg = _refused(src, "--length-field", "lengths")
    assert "l.parquet: line 2: length field 'lengths' holds a null in its list; fill it in" in msg


def test_a_quote_opening_after_a_bad_quote_is_unterminated_not_one_skipped_row(tmp_path):
    # The strict pass dropped the line after '"a"b', never saw '"c' open, and skip mode then lost every row
    # after it as one bad row ("no prompts found (1 bad rows skipped)").
    src = tmp_path / "swallow.csv"
    src.write_text('prompt,id\n"a"b,"c\ngood,2\ngood2,3\n')
    for options in ({}, {"on_bad_line": "skip"}):
        with pytest.raises(InputError, match=r"^swallow.csv: line 2: unterminated quote"):
            read_prompts(src, **options)


def test_the_csv_field_limit_holds_for_interleaved_readers(tmp_path):
    """The limit is process-wide: one reader putting it back lowered it under another one mid-file."""
    import csv

    from aspc.io.readers import iter_csv

    src = tmp_path / "big.csv"
    src.write_text("id,prompt\n" + "".join(f"r{i},{'w' * 200_000}\n" for i in range(3)))
    a, b = iter_csv(src), iter_csv(src)
    next(a), next(b)
    assert len(list(a)) == 2
    assert [len(rec["prompt"]) for _, _, rec in b] == [200_000, 200_000]
    assert csv.field_size_limit() >= 200_000
