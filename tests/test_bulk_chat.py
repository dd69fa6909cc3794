"""Chats built by Arrow kernels equal, byte for byte, what the row reader stores; what they do not cover is left."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.io.bulk_chat import chat_columns
from aspc.io.rows import CHAT_ROLES, parse_prompt_value

# Every byte JSON escapes, quotes and backslashes, multi-byte and astral characters, separators JSON leaves alone.
_CHARS = st.characters(blacklist_categories=("Cs",))
_TRICKY = st.sampled_from(['"', "\\", "\n", "\r\n", "\t", "\x00", "\x1f", "\x7f", "\u2028", "é", "漢", "😀", " ", "{}"])
_TEXT = st.lists(st.one_of(st.text(_CHARS, max_size=6), _TRICKY), max_size=8).map("".join)
_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(sorted(CHAT_ROLES)), "content": _TEXT})
# The row reader refuses a chat with nothing but blanks; the caller checks that on the texts.
_CHAT = st.lists(_MESSAGE, min_size=1, max_size=4).filter(lambda ms: any(m["content"].strip() for m in ms))
_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def _rows(chats):
    return [parse_prompt_value(c) for c in chats]


@settings(max_examples=200, deadline=None)
@given(st.lists(_CHAT, min_size=1, max_size=12), st.data())
def test_same_bytes_as_the_row_reader(chats, data):
    arr = pa.array(chats, _TYPE)
    lo = data.draw(st.integers(0, len(chats) - 1))
    hi = data.draw(st.integers(lo + 1, len(chats)))
    for a, expect in ((arr, chats), (arr.slice(lo, hi - lo), chats[lo:hi])):  # a slice's offsets start late
        got = chat_columns(a, CHAT_ROLES)
        assert got is not None
        stored, texts = got
        assert list(zip(stored.to_pylist(), texts.to_pylist(), strict=True)) == _rows(expect)


def test_large_lists_and_null_extra_fields_are_read():
    typ = pa.large_list(pa.struct([("content", pa.string()), ("name", pa.string()), ("role", pa.string())]))
    chats = [[{"content": 'say "hi"\n', "name": None, "role": "user"}], [{"content": "x", "name": None, "role": "system"},
             {"content": "y", "name": None, "role": "user"}]]  # fmt: skip
    stored, texts = chat_columns(pa.array(chats, typ), CHAT_ROLES)
    assert list(zip(stored.to_pylist(), texts.to_pylist(), strict=True)) == _rows(chats)


def test_what_the_kernels_do_not_cover_is_left_to_the_row_reader():
    named = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("name", pa.string())]))
    parts = pa.list_(pa.struct([("role", pa.string()),
                                ("content", pa.list_(pa.struct([("type", pa.string()), ("text", pa.string())])))]))  # fmt: skip
    cases = [
        pa.array([[{"role": "user", "content": "a", "name": "bob"}]], named),  # a name the stored chat keeps
        pa.array([[]], _TYPE),  # no messages
        pa.array([[None]], _TYPE),  # a null message
        pa.array([[{"role": "user", "content": None}]], _TYPE),
        pa.array([[{"role": "robot", "content": "a"}]], _TYPE),
        pa.array([[{"role": "user", "content": [{"type": "text", "text": "a"}]}]], parts),
        pa.array(["text"]),
        pa.array([[1, 2]]),
    ]
    for arr in cases:
        assert chat_columns(arr, CHAT_ROLES) is None, arr.type


def test_a_chat_parquet_compiles_to_the_plan_its_jsonl_does(tmp_path, monkeypatch):
    import json

    import pyarrow.parquet as pq

    from aspc.io import bulk
    from tests.conftest import invoke_cli

    built = []
    monkeypatch.setattr(bulk, "chat_columns", lambda *a: built.append(chat_columns(*a)) or built[-1])

    chats = [[{"role": "system", "content": 'be "brief"\\'}, {"role": "user", "content": f"q{i}\n\t\x01 é 😀"}]
             for i in range(40)]  # fmt: skip
    rows = [{"id": f"p{i}", "prompt": c, "length": 100 + 37 * i} for i, c in enumerate(chats)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plans = []
    for src in ("c.parquet", "c.jsonl"):
        out = tmp_path / f"{src}.plan"
        res = invoke_cli("compile", tmp_path / src, "--length-field", "length", "-o", out, "-q")
        assert res.exit_code == 0, res.output
        plans.append(pq.read_table(out).to_pylist())
    assert plans[0] == plans[1]
    assert len(built) == 2 and all(b is not None for b in built)  # Parquet and JSONL chats both took the kernels


def test_compiling_chats_imports_no_pandas(tmp_path):
    # A Python value handed to a pyarrow kernel makes pyarrow import pandas (~0.3 s of a compile) to ask about it.
    import subprocess
    import sys

    import pyarrow.parquet as pq

    rows = [{"id": f"p{i}", "prompt": [{"role": "user", "content": f'q "{i}"\n'}], "length": 10 + i} for i in range(50)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    code = (
        "import sys\n"
        "from aspc.cli import main\n"
        f"main(['compile', {str(tmp_path / 'c.parquet')!r}, '--length-field', 'length', '-o', "
        f"{str(tmp_path / 'p.parquet')!r}, '-q'], standalone_mode=False)\n"
        "assert 'pandas' not in sys.modules, 'pandas was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "p.parquet").is_file()


_EXTRA = st.sampled_from([None, ("name", "bob"), ("name", None), ("tool_calls", []), ("weight", 1)])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.tuples(_MESSAGE, _EXTRA, st.booleans()), min_size=1, max_size=3), min_size=1, max_size=6),
       st.booleans(), st.sampled_from([(",", ":"), (", ", ": ")]), st.booleans())  # fmt: skip
def test_jsonl_chats_read_in_bulk_are_what_the_row_reader_reads(tmp_path_factory, chats, ascii_, seps, nested_name):
    # pyarrow drops message keys its struct type does not name; the scan sends such files to the row reader.
    import json
    from unittest import mock

    from aspc.errors import InputError
    from aspc.io import bulk
    from aspc.io.rows import read_rows

    recs, extra = [], False
    for i, chat in enumerate(chats):
        messages = []
        for message, more, reverse in chat:
            m = dict(reversed(message.items())) if reverse else dict(message)
            if more is not None:
                m[more[0]] = more[1]
                extra = True
            messages.append(m)
        rec = {"id": f"p{i}", "prompt": messages, "length": 10 + i}
        if nested_name:
            rec["extra_info"] = {"name": "not a message key", "index": i}
        recs.append(rec)
    path = tmp_path_factory.mktemp("c") / "c.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=ascii_, separators=seps) + "\n" for r in recs), encoding="utf-8")
    fields = {"prompt_field": "prompt", "id_field": "id", "length_field": "length"}
    data = path.read_bytes()
    # Types come from the first line only, as from the first MiB of a large file: the rest is left to the scan.
    with mock.patch.object(bulk, "_JSON_PREFIX", data.index(b"\n") + 1):
        got = bulk.read_jsonl_bulk(data, **fields)
    try:
        ref = read_rows(path, on_bad_line="error", fmt="jsonl", **fields)
    except InputError:
        ref = None
    if extra:
        assert got is None  # a key pyarrow would drop
    elif ref is not None:
        assert got is not None
    if got is not None:
        assert ref is not None
        assert (got.ids, got.prompts, got.texts, got.prompt_tokens.tolist()) == (
            ref.ids, ref.prompts, ref.texts, ref.prompt_tokens.tolist())
