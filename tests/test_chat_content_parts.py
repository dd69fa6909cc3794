"""Chat content given as OpenAI-style parts (verl, OpenRLHF and OpenAI-format datasets): text parts are one string.

A message whose content is a list of ``{"type": "text", "text": ...}`` parts is the same prompt as one whose
content is the parts' texts joined by a newline (as vLLM's OpenAI server renders them for a text model's
template): the same stored chat, the same content id, the
same plan. Any other part (an image, audio) or a malformed one is refused in one line that names it.
"""

from __future__ import annotations

import csv
import json
from itertools import pairwise
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.emit import schema as S
from aspc.errors import InputError
from aspc.io import read_prompts
from aspc.io.bulk import read_parquet_bulk
from aspc.io.rows import chat_messages, content_id, parse_prompt_value, read_rows
from tests.conftest import invoke_cli, one_line_error, write_jsonl


def _text(*texts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": t} for t in texts]


def _records(as_parts: bool) -> list[dict]:
    """Chats with a system and a user message; as_parts: each content split into text parts."""
    out = []
    for i in range(24):
        system, user = "Be brief.", f"Solve\n{i} + {i * 7}\n, then say why."
        if as_parts:
            system_c, user_c = _text(system), _text("Solve", f"{i} + {i * 7}", ", then say why.")
        else:
            system_c, user_c = system, user
        chat = [{"role": "system", "content": system_c}, {"role": "user", "content": user_c}]
        out.append({"prompt": chat, "len": [10 + i, 30 + 2 * i]})
    return out


def _compile(src: Path, out: Path) -> pa.Table:
    r = invoke_cli("compile", src, "--length-field", "len", "--batch-size", "4", "-o", out, "-q")
    assert r.exit_code == 0, r.output
    return pq.read_table(out)


def _refused(src: Path) -> str:
    out = src.with_name("out.parquet")
    msg = one_line_error(invoke_cli("compile", src, "-o", out))
    assert not out.exists()
    return msg


def test_text_parts_are_joined_into_one_string():
    stored, text = parse_prompt_value([{"role": "user", "content": _text("Solve", "2+2")}])
    assert stored == '[{"role":"user","content":"Solve\\n2+2"}]' and text == "Solve\n2+2"
    # What a plan's consumers read: the stored chat form, with string content.
    assert chat_messages(stored) == [{"role": "user", "content": "Solve\n2+2"}]
    assert (stored, text) == parse_prompt_value([{"role": "user", "content": "Solve\n2+2"}])


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet"])
def test_a_dataset_of_text_parts_compiles_to_the_plan_of_its_string_form(tmp_path, fmt):
    def write(name: str, recs: list[dict]) -> Path:
        path = tmp_path / f"{name}.{fmt}"
        if fmt == "jsonl":
            write_jsonl(path, recs)
        elif fmt == "json":
            path.write_text(json.dumps(recs), encoding="utf-8")
        else:
            pq.write_table(pa.Table.from_pylist(recs), path)
        return path

    parts = _compile(write("parts", _records(True)), tmp_path / "parts_plan.parquet")
    strings = _compile(write("strings", _records(False)), tmp_path / "strings_plan.parquet")
    assert parts.column(S.PROMPT).to_pylist()[0].startswith('[{"role":"system","content":"Be brief."}')
    assert parts.equals(strings)  # every column: the same prompts, ids (content hashes) and schedule


def test_parquet_text_parts_read_the_same_in_bulk_and_row_by_row(tmp_path):
    # The part struct carries a field text parts leave null (as a dataset with some image parts has): allowed.
    part = pa.struct([("type", pa.string()), ("text", pa.string()), ("image_url", pa.struct([("url", pa.string())]))])
    message = pa.struct([("role", pa.string()), ("content", pa.list_(part))])
    recs = [
        {"id": "a", "prompt": [{"role": "user", "content": [{"type": "text", "text": "Solve"},
                                                             {"type": "text", "text": "2+2"}]}]},
        {"id": "b", "prompt": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                               {"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
    ]  # fmt: skip
    src = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "prompt": pa.array([r["prompt"] for r in recs], pa.list_(message))}), src)
    want = ['[{"role":"user","content":"Solve\\n2+2"}]', '[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}]']
    bulk = read_parquet_bulk(src, prompt_field="prompt", id_field="id", length_field=None)
    rows = read_rows(src, prompt_field="prompt", id_field="id", length_field=None, on_bad_line="error", fmt="parquet")
    assert bulk is not None and list(bulk.prompts) == want and list(bulk.texts) == ["Solve\n2+2", "Be brief.\n\nhi"]
    assert list(rows.prompts) == want and list(rows.texts) == list(bulk.texts)
    assert list(read_prompts(src).prompts) == want


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ([{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
         "chat message 0 content part 1 is 'image_url'; aspc plans text prompts only, drop non-text parts"),
        ([{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
         "chat message 0 content part 0 is 'input_audio'; aspc plans text prompts only, drop non-text parts"),
        (["look"], "chat message 0 content part 0 is not an object with type and text"),
        ([{"text": "look"}],
         """chat message 0 content part 0 has no string 'type'; write text parts as {"type": "text", "text": "..."}"""),
        ([{"type": "text", "text": 5}],
         """chat message 0 content part 0 has no string 'text'; write text parts as {"type": "text", "text": "..."}"""),
        ([{"type": "text"}],
         """chat message 0 content part 0 has no string 'text'; write text parts as {"type": "text", "text": "..."}"""),
        ([{"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}}],
         "chat message 0 content part 0 has field 'cache_control' besides type and text; drop it"),
        ([], "chat prompt is empty"),  # empty content, as "" is
        (_text("", " "), "chat prompt is empty"),
    ],
)  # fmt: skip
def test_a_non_text_or_malformed_part_is_refused_in_one_line(tmp_path, content, reason):
    src = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prompt": "fine"},
                                             {"id": "b", "prompt": [{"role": "user", "content": content}]}])  # fmt: skip
    assert _refused(src) == f"Error: p.jsonl: line 2: {reason}"
    assert read_prompts(src, on_bad_line="skip").ids == ["a"]


def test_a_parquet_image_part_is_refused_naming_its_row(tmp_path):
    recs = [{"id": "a", "prompt": [{"role": "user", "content": [{"type": "text", "text": "hi", "image": None}]}]},
            {"id": "b", "prompt": [{"role": "user", "content": [{"type": "image", "text": None, "image": "x.png"}]}]}]
    src = tmp_path / "m.parquet"
    pq.write_table(pa.Table.from_pylist(recs), src)
    reason = "chat message 0 content part 0 is 'image'; aspc plans text prompts only, drop non-text parts"
    assert _refused(src) == f"Error: m.parquet: line 2: {reason}"
    with pytest.raises(InputError, match="line 2: chat message 0 content part 0 is 'image'"):
        read_prompts(src)
    assert list(read_prompts(src, on_bad_line="skip").prompts) == ['[{"role":"user","content":"hi"}]']


def test_an_empty_parts_list_is_empty_content_beside_other_messages():
    stored, _ = parse_prompt_value([{"role": "system", "content": []}, {"role": "user", "content": _text("hi")}])
    assert stored == '[{"role":"system","content":""},{"role":"user","content":"hi"}]'


def test_a_csv_cell_holding_parts_json_stays_text(tmp_path):
    # CSV cells are text: a prompt that looks like a chat is a prompt, as before.
    cell = json.dumps([{"role": "user", "content": _text("hi")}])
    src = tmp_path / "c.csv"
    with open(src, "w", encoding="utf-8", newline="") as fh:
        csv.writer(fh).writerows([["id", "prompt"], ["a", cell]])
    assert list(read_prompts(src).prompts) == [cell]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(st.characters(exclude_categories=("Cs",))), min_size=1, max_size=6).map("\n".join)
       .filter(str.strip), st.data())
def test_any_split_of_a_prompt_into_text_parts_keeps_its_content_id(text, data):
    # The prompt's lines as parts: the same prompt as the string.
    lines = text.split("\n")
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(lines) - 1), max_size=6)))) if len(lines) > 1 else []
    bounds = [0, *cuts, len(lines)]
    parts = _text(*("\n".join(lines[a:b]) for a, b in pairwise(bounds)))
    system = data.draw(st.booleans())
    head = [{"role": "system", "content": _text("Be brief.") if data.draw(st.booleans()) else "Be brief."}]
    as_parts = parse_prompt_value([*head[:system], {"role": "user", "content": parts}])
    as_string = parse_prompt_value([*head[:system], {"role": "user", "content": text}])
    assert as_parts == as_string and content_id(as_parts[0]) == content_id(as_string[0])
