"""One data set as JSONL, JSON, CSV and Parquet compiles to one plan; an exported plan recompiles to itself.

Compared: every plan row (ids, prompts, source_row, prompt_tokens, predictions and quantiles, minibatch,
group, dispatch order) and every metadata key but ``aspc.input_hash`` (the file's own bytes). The
differences that follow from a format (CSV cells are text: a chat there is a string, though an
``extra_info`` cell holding a JSON object is read as that object) are pinned as such; the divergences
found are the ``xfail(strict=True)`` tests below.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspc.cli import main as cli
from aspc.io.rows import chat_messages, content_id

SETTINGS = settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, max_examples=40)
KNOWN = ["--length-field", "len"]
SKIP = ["--on-bad-line", "skip"]

# Quotes, separators, line breaks (CSV quotes them), Unicode spaces str.strip() drops, text that reads as
# JSON or numbers, a compact chat, NUL, a BOM inside the text.
PIECES = ["a", "Zz", " ", "  ", ",", '"', "'", "\n", "\r\n", "\r", "\t", "é", "😀", "中", "123", "true", "null",
          "[]", "{}", "\u00a0", "\u2028", "\x85", "\ufeff", "\\", "\x00", "-", "0", "007", "1e3", "NaN",
          '[{"role":"user","content":"x"}]', "\x1f", "\x0b"]  # fmt: skip
text_st = st.lists(st.sampled_from(PIECES), max_size=5).map("".join)
# Not blank to str.strip(): a valid prompt (the bad rows have their own strategy below).
prompt_st = st.tuples(text_st, st.sampled_from(["a", "é", "0", '"', ",", "null"]), text_st).map("".join)
message_st = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]), "content": text_st})
chat_st = st.lists(message_st, min_size=1, max_size=3)
valid_chat_st = st.tuples(message_st, st.fixed_dictionaries({"role": st.just("user"), "content": prompt_st})).map(list)
int_id_st = st.integers(-3, 30)
str_id_st = st.one_of(st.sampled_from(["007", "7", " 7", "x", "a,b", "1.0", "true", "-0", "+1", "٣"]), prompt_st)
LENGTHS = {
    "int": st.integers(0, 500),
    "float": st.floats(0, 500, allow_nan=False).map(lambda x: round(x, 2)),
    "list": st.lists(st.integers(0, 500), min_size=1, max_size=3),
}


# ---------------------------------------------------------------------------------------------------------
# Writing one data set in each format, compiling it, reading the plan


def _columns(recs: list[dict]) -> list[str]:
    return list(dict.fromkeys(k for r in recs for k in r))


def _csv_cell(v: object) -> str:
    if v is None:
        return ""
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def write(directory: Path, fmt: str, recs: list[dict], name: str = "in") -> Path:
    """``recs`` as a ``fmt`` file: a field some record lacks is absent (JSON), null (Parquet) or empty (CSV)."""
    path = directory / f"{name}.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    elif fmt == "json":
        path.write_text(json.dumps(recs, ensure_ascii=False), encoding="utf-8")
    elif fmt == "csv":
        cols = _columns(recs)
        buf = io.StringIO(newline="")
        writer = csv.writer(buf)
        writer.writerow(cols)
        writer.writerows([_csv_cell(r.get(c)) for c in cols] for r in recs)
        path.write_text(buf.getvalue(), encoding="utf-8", newline="")
    else:
        pq.write_table(pa.table({c: [r.get(c) for r in recs] for c in _columns(recs)}), path)
    return path


def _cli(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def compiled(src: Path, *args: str) -> tuple[str, object, object]:
    """("ok", rows, metadata without input_hash) or ("error", exit code, last line of the output)."""
    out = src.with_name(src.name + ".plan.parquet")
    res = _cli("compile", src, "-o", out, "-q", *args)
    if res.exit_code != 0:
        assert res.exit_code in (1, 2), res.output  # a message, never a traceback
        return "error", res.exit_code, res.output.strip().splitlines()[-1:]
    table = pq.read_table(out)
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert meta.pop("aspc.input_hash")
    return "ok", table.to_pylist(), meta


def rows_of(src: Path, *args: str) -> list[dict]:
    kind, rows, meta = compiled(src, *args)
    assert kind == "ok", meta
    return rows


def assert_formats_agree(tmp: Path, recs: list[dict], fmts: list[str], args: list[str]) -> None:
    results = {f: compiled(write(tmp, f, recs), *args) for f in fmts}
    base = results[fmts[0]]
    for fmt in fmts[1:]:
        got = results[fmt]
        if base[0] == "error":  # refused by both; the wording names the file and its line
            assert got[:2] == base[:2], (fmt, base, got)
        else:
            assert got == base, (fmt, base, got)


@pytest.fixture
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fmt")


def _fresh(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ex")  # one directory per example: hypothesis reuses a function's tmp_path


# ---------------------------------------------------------------------------------------------------------
# What holds: the same valid data gives the same plan in every format


@st.composite
def datasets(draw, *, csv_ok: bool = False):
    """Records of one shape: ids of one kind (or none, or verl's extra_info.index), text or chat prompts."""
    n = draw(st.integers(1, 5))
    ids = draw(st.sampled_from(["none", "int", "str", "index", "str-index"]))  # a CSV extra_info cell is JSON
    chats = not csv_ok and draw(st.booleans())
    lengths = LENGTHS[draw(st.sampled_from(sorted(LENGTHS)))]
    id_values = draw(st.lists(int_id_st if ids in ("int", "index") else str_id_st, min_size=n, max_size=n, unique=True))
    recs = []
    for i in range(n):
        rec: dict = {}
        if ids in ("int", "str"):
            rec["id"] = id_values[i]
        rec["messages" if chats else "prompt"] = draw(valid_chat_st if chats else prompt_st)
        rec["len"] = draw(lengths)
        if ids.endswith("index"):
            rec["extra_info"] = {"index": id_values[i]}
        recs.append(rec)
    return recs


@SETTINGS
@given(recs=datasets(), known=st.booleans())
def test_jsonl_json_parquet_compile_to_one_plan(tmp_path_factory, recs, known):
    assert_formats_agree(_fresh(tmp_path_factory), recs, ["jsonl", "json", "parquet"], KNOWN if known else [])


@SETTINGS
@given(recs=datasets(csv_ok=True), known=st.booleans())
def test_csv_text_prompts_compile_as_jsonl_does(tmp_path_factory, recs, known):
    # An int id 7 is the CSV cell "7", the id "7" in both; lengths "412" and "[412, 388]" are read as JSON.
    assert_formats_agree(_fresh(tmp_path_factory), recs, ["jsonl", "csv"], KNOWN if known else [])


@st.composite
def bad_datasets(draw, *, csv_ok: bool = False):
    """Rows with nulls, blank prompts, negative or empty lengths, repeated ids, ids on some rows only."""
    n = draw(st.integers(1, 6))
    ids = draw(st.sampled_from(["none", "int", "str", "index"]))
    chats = not csv_ok and draw(st.booleans())
    kind = draw(st.sampled_from(sorted(LENGTHS)))
    lengths = {
        "int": st.integers(-1, 500),
        "float": st.floats(-1, 500, allow_nan=False).map(lambda x: round(x, 2)),
        "list": st.lists(st.integers(-1, 500), max_size=3),
    }[kind]
    recs = []
    for _ in range(n):
        rec: dict = {}
        # CSV cannot hold a missing id (an empty cell is an empty id): see the xfail below.
        if ids in ("int", "str") and (csv_ok or draw(st.integers(0, 5))):
            rec["id"] = draw(st.sampled_from(["1", "2", "x"]) if ids == "str" else st.integers(0, 3))
        if chats:
            rec["messages"] = draw(st.one_of(st.none(), chat_st))
        else:
            rec["prompt"] = draw(st.one_of(st.none(), st.sampled_from(["", " ", "a", "b", "a "]), text_st))
        rec["len"] = draw(st.one_of(st.none(), lengths))
        if ids == "index" and draw(st.integers(0, 5)):
            rec["extra_info"] = {"index": draw(st.integers(0, 3))}
        recs.append(rec)
    return recs


@SETTINGS
@given(recs=bad_datasets())
def test_skipping_bad_rows_keeps_the_same_rows_in_every_format(tmp_path_factory, recs):
    assert_formats_agree(_fresh(tmp_path_factory), recs, ["jsonl", "json", "parquet"], [*KNOWN, *SKIP])


@SETTINGS
@given(recs=bad_datasets(csv_ok=True))
def test_skipping_bad_csv_rows_keeps_the_rows_jsonl_keeps(tmp_path_factory, recs):
    assert_formats_agree(_fresh(tmp_path_factory), recs, ["jsonl", "csv"], [*KNOWN, *SKIP])


def test_parquet_string_and_list_layouts_read_as_jsonl(tmp):
    prompts = ["a", "b b", " c", "é"]
    write(tmp, "jsonl", [{"id": i, "prompt": p, "len": [i, i + 1]} for i, p in enumerate(prompts)])
    base = compiled(tmp / "in.jsonl", *KNOWN)
    layouts = {
        "large": {"id": pa.array(range(4), pa.uint8()), "prompt": pa.array(prompts, pa.large_string()),
                  "len": pa.array([[i, i + 1] for i in range(4)], pa.large_list(pa.int32()))},
        "dict": {"id": pa.array([str(i) for i in range(4)]).dictionary_encode(),
                 "prompt": pa.array(prompts).dictionary_encode(),
                 "len": pa.array([[i, i + 1] for i in range(4)], pa.list_(pa.float32(), 2))},
    }  # fmt: skip
    for name, cols in layouts.items():
        pq.write_table(pa.table(cols), tmp / f"{name}.parquet")
        assert compiled(tmp / f"{name}.parquet", *KNOWN) == base, name


# ---------------------------------------------------------------------------------------------------------
# Expected differences: CSV cells are text (README "Inputs": a string that looks like a chat stays text)


def test_csv_chat_json_stays_text(tmp):
    chat = [{"role": "user", "content": "hi there"}]
    (row,) = rows_of(write(tmp, "jsonl", [{"messages": chat, "len": 3}]), *KNOWN)
    cell = json.dumps(chat)  # as a CSV writer stores a list: spaced, so not aspc's compact form
    (text,) = rows_of(write(tmp, "csv", [{"messages": cell, "len": 3}]), *KNOWN)
    assert row["prompt"] == json.dumps(chat, separators=(",", ":")) and row["prompt_tokens"] == 2
    assert text["prompt"] == cell and text["prompt_tokens"] == 11 and chat_messages(text["prompt"]) is None
    assert text["prompt_id"] == content_id(cell) != row["prompt_id"]


def test_csv_ids_and_lengths_are_read_from_text(tmp):
    src = tmp / "in.csv"
    src.write_text('id,prompt,len\n007,a, 4 \n7.0,b,"[1, 2.5]"\n', encoding="utf-8")
    got = {r["prompt_id"]: r["predicted_len"] for r in rows_of(src, *KNOWN)}
    assert got == {"007": 4.0, "7.0": 1.75}  # JSON refuses a float id 7.0; a CSV cell is the text "7.0"


# ---------------------------------------------------------------------------------------------------------
# Round trip: export --format jsonl, compile the export with the same options


def _round_trip(tmp: Path, src: Path, args: list[str]) -> tuple[list[dict], list[dict]]:
    plan = tmp / "plan.parquet"
    assert _cli("compile", src, "-o", plan, "-q", *args).exit_code == 0
    res = _cli("export", plan, "--format", "jsonl", "-o", tmp / "x.jsonl", "-q")
    assert res.exit_code == 0, res.output
    rows = pq.read_table(plan).to_pylist()
    for r in rows:  # the export is in dispatch order: its row k is the plan's dispatch rank k
        r["source_row"] = r["dispatch_rank"]
    return rows, rows_of(tmp / "x.jsonl", *args)


@SETTINGS
@given(recs=datasets(), fmt=st.sampled_from(["jsonl", "json", "parquet"]), known=st.booleans(),
       samples=st.sampled_from(["1", "3"]))  # fmt: skip
def test_an_exported_sorted_plan_recompiles_to_itself(tmp_path_factory, recs, fmt, known, samples):
    tmp = _fresh(tmp_path_factory)
    args = [*(KNOWN if known else []), "--strategy", "sorted", "-n", samples]
    if compiled(write(tmp, fmt, recs), *args)[0] != "ok":
        return
    before, after = _round_trip(tmp, tmp / f"in.{fmt}", args)
    assert after == before


# ---------------------------------------------------------------------------------------------------------
# Divergences (undocumented): each a minimal input


# Was: an extra_info cell holding JSON ({"index": 0}) was text, never read for verl's index (rows._verl_index
# wants a dict), so ids silently became content hashes
def test_csv_extra_info_index_gives_the_ids_jsonl_gets(tmp):
    recs = [{"prompt": "a", "len": 0, "extra_info": {"index": 0}}]
    assert [r["prompt_id"] for r in rows_of(write(tmp, "jsonl", recs), *KNOWN)] == ["0"]
    assert [r["prompt_id"] for r in rows_of(write(tmp, "csv", recs), *KNOWN)] == ["0"]  # got content_id("a")


@pytest.mark.xfail(strict=True, reason="CSV: an empty id cell is the id '' (refused as empty, the row skipped) "
                   "where Parquet's null and JSON's absent id are no id (content ids decided by that row): under "
                   "--on-bad-line skip the same table keeps other rows; rows.nulls_absent says CSV's missing "
                   "value is a null, but readers._iter_csv_text yields '' for an empty cell")  # fmt: skip
def test_csv_empty_id_cell_is_read_as_parquets_null(tmp):
    recs = [{"id": None, "prompt": "a"}, {"id": 1, "prompt": "b"}]
    parquet = [(r["prompt_id"], r["prompt"]) for r in rows_of(write(tmp, "parquet", recs), *SKIP)]
    assert parquet == [(content_id("a"), "a")]  # row 2 skipped: "has id field 'id' but earlier rows do not"
    csv_rows = [(r["prompt_id"], r["prompt"]) for r in rows_of(write(tmp, "csv", recs), *SKIP)]
    assert csv_rows == parquet  # got [("1", "b")]: row 1 skipped as "id field 'id' is empty"


@pytest.mark.xfail(strict=True, reason="Parquet: a struct gives every tool call every field, null where it has "
                   "none; rows._other_keys drops a message's null keys but keeps the nested ones, so the stored "
                   "chat (and its content id) gains \"type\":null / \"function\":null that JSON's does not have")  # fmt: skip
def test_parquet_tool_calls_store_the_chat_jsonl_stores(tmp):
    recs = [{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "a", "function": {"name": "f"}}]},
                          {"role": "user", "content": "q"}], "len": 1},
            {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "b", "type": "function"}]},
                          {"role": "user", "content": "r"}], "len": 2}]  # fmt: skip
    jsonl = rows_of(write(tmp, "jsonl", recs), *KNOWN)
    assert '"tool_calls":[{"id":"a","function":{"name":"f"}}]' in jsonl[1]["prompt"]
    assert rows_of(write(tmp, "parquet", recs), *KNOWN) == jsonl  # got "function":null / "type":null in the prompts


@pytest.mark.xfail(strict=True, reason="a message's keys besides role and content are stored in the order the "
                   "record writes them (rows._other_keys); a Parquet struct has one order for every message, so "
                   "{name, tool_call_id} in JSON and the same message in Parquet store different chats and ids")  # fmt: skip
def test_message_key_order_does_not_change_the_chat(tmp):
    recs = [{"messages": [{"role": "tool", "content": "x", "tool_call_id": "1", "name": "f"}], "len": 1},
            {"messages": [{"role": "tool", "content": "y", "name": "g", "tool_call_id": "2"}], "len": 2}]  # fmt: skip
    jsonl = rows_of(write(tmp, "jsonl", recs), *KNOWN)
    assert rows_of(write(tmp, "parquet", recs), *KNOWN) == jsonl  # got row 2 as ..."tool_call_id":"2","name":"g"


# Was: export --format jsonl of a CSV source passed the cells through as strings ("len": "5"), and compile
# --length-field reads a JSON string as no number (parse_length parses text for CSV only)
def test_an_exported_csv_plan_recompiles_with_its_lengths(tmp):
    src = write(tmp, "csv", [{"prompt": "a", "len": 5}, {"prompt": "b", "len": 3}])
    args = [*KNOWN, "--strategy", "sorted"]
    before, after = _round_trip(tmp, src, args)  # after: "x.jsonl: line 1: length field 'len' must be a number"
    assert after == before


# Was: export --format verl of a data set whose rows hold a text 'prompt' or a 'messages' chat: export._verl_table
# builds every chat from the string 'prompt' column, so a chat row's prompt is [{role: user, content: null}] and
# compile refuses the export
def test_verl_export_of_mixed_text_and_chat_rows_keeps_the_chats(tmp):
    src = write(tmp, "jsonl", [{"messages": [{"role": "user", "content": "q"}], "len": 1}, {"prompt": "p", "len": 3}])
    plan = tmp / "plan.parquet"
    assert _cli("compile", src, "-o", plan, "-q", *KNOWN, "--strategy", "sorted").exit_code == 0
    res = _cli("export", plan, "--format", "verl", "-o", tmp / "v.parquet", "-q")
    assert res.exit_code == 0, res.output
    prompts = pq.read_table(tmp / "v.parquet").column("prompt").to_pylist()
    assert prompts == [[{"role": "user", "content": "q"}], [{"role": "user", "content": "p"}]]  # got content None


@pytest.mark.xfail(strict=True, reason="a text prompt that is exactly aspc's compact chat JSON (a CSV cell, or a "
                   "JSON string) compiles as text (prompt_tokens, predictions and content id of the string) into "
                   "a plan cell equal to the chat's, which chat_messages (run backends, export without its source) "
                   "then reads as that chat: README says such a string stays text")  # fmt: skip
def test_csv_cell_in_compact_chat_form_stays_text_in_the_plan(tmp):
    cell = '[{"role":"user","content":"x"}]'
    (text,) = rows_of(write(tmp, "csv", [{"prompt": cell, "len": 5}]), *KNOWN)
    (chat,) = rows_of(write(tmp, "jsonl", [{"messages": json.loads(cell), "len": 5}]), *KNOWN)
    assert (text["prompt_tokens"], chat["prompt_tokens"]) == (8, 1)  # compile: text, then chat
    assert text["prompt_id"] != chat["prompt_id"]  # got both content_id(cell): one prompt to the plan
    assert chat_messages(text["prompt"]) is None
