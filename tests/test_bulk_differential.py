"""Bulk reading changes speed, never results: read_prompts with the bulk readers against the row reader alone.

Generated adversarial JSONL and Parquet files are read twice through :func:`aspc.io.prompts.read_prompts`, with
the bulk readers (:mod:`aspc.io.bulk`) and with them switched off, under ``on_bad_line="error"`` and ``"skip"``;
both must give the same :class:`PromptTable`, every column of it, or the same error. JSONL is read with
``bulk._JSON_PREFIX`` cut short, so type inference sees only the first lines, as with a large file (unpatched,
the first MiB is checked with json.loads first and hides what the byte scans and pyarrow do on later lines).

The discrepancies found (Parquet: extra_info text that is not UTF-8, columns no field names that the row
reader could not convert, a chat struct naming a field twice) are pinned as small tests at the end; the
generators still leave out their classes (each is named where it is left out).
"""

from __future__ import annotations

import json
import tempfile
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from aspc.io import bulk
from aspc.io.prompts import MAX_PROMPT_BYTES, read_prompts
from aspc.io.table import PromptTable

_SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}


# ---------------------------------------------------------------- the harness


def _read(path: Path, fields: dict, on_bad_line: str, *, use_bulk: bool, prefix: int | None) -> tuple[object, bool]:
    """(the table, or the error as (type name, message); whether a bulk reader returned a table)."""
    taken = []

    def spy(real):
        def wrapped(*args, **kwargs):
            got = real(*args, **kwargs)
            taken.append(got is not None)
            return got

        return wrapped

    with ExitStack() as stack:
        for name in ("read_parquet_bulk", "read_jsonl_bulk"):
            real = getattr(bulk, name)
            stack.enter_context(mock.patch.object(bulk, name, spy(real) if use_bulk else (lambda *a, **k: None)))
        if prefix is not None:
            stack.enter_context(mock.patch.object(bulk, "_JSON_PREFIX", prefix))
        try:
            got: object = read_prompts(path, on_bad_line=on_bad_line, **fields)
        except Exception as exc:  # noqa: BLE001 - any exception must be the same on both paths
            got = (type(exc).__name__, str(exc))
    return got, any(taken)


def _arrays_equal(a, b) -> None:
    assert type(a) is type(b), (type(a), type(b))
    assert a.type == b.type, (a.type, b.type)
    assert a.to_pylist() == b.to_pylist()
    assert a.equals(b)


def assert_same_table(got: PromptTable, ref: PromptTable) -> None:
    """Every field of the two tables is the same (floats bit for bit)."""
    assert len(got) == len(ref)
    assert got.ids == ref.ids
    assert got.prompts == ref.prompts
    assert got.texts == ref.texts
    _arrays_equal(got.id_array, ref.id_array)
    _arrays_equal(got.prompt_array, ref.prompt_array)
    _arrays_equal(got.text_array, ref.text_array)
    assert (got.text_array is got.prompt_array) == (ref.text_array is ref.prompt_array)
    for name in ("source_rows", "prompt_tokens"):
        a, b = getattr(got, name), getattr(ref, name)
        assert a.dtype == b.dtype == np.int64, name
        assert a.tolist() == b.tolist(), name
        assert a.flags.writeable == b.flags.writeable, name
    if ref.lengths is None:
        assert got.lengths is None
    else:
        assert got.lengths is not None
        assert got.lengths.values.dtype == ref.lengths.values.dtype == np.float64
        assert got.lengths.values.view(np.int64).tolist() == ref.lengths.values.view(np.int64).tolist()
        assert got.lengths.offsets.dtype == ref.lengths.offsets.dtype == np.int64
        assert got.lengths.offsets.tolist() == ref.lengths.offsets.tolist()
        assert got.lengths.values.flags.writeable == ref.lengths.values.flags.writeable
    assert [(s.row, s.reason, s.line) for s in got.skipped] == [(s.row, s.reason, s.line) for s in ref.skipped]
    assert got.input_hash == ref.input_hash
    assert got.token_counter == ref.token_counter


def _same(got: object, ref: object) -> None:
    if isinstance(ref, PromptTable) and isinstance(got, PromptTable):
        assert_same_table(got, ref)
    else:
        assert got == ref, f"bulk: {_show(got)}\nrows: {_show(ref)}"


def _show(x: object) -> str:
    return f"table ids={x.ids} prompts={x.prompts}" if isinstance(x, PromptTable) else repr(x)


def check_both(path: Path, fields: dict, *, prefix: int | None = None, modes=("error", "skip")) -> dict:
    """Read ``path`` with and without the bulk readers in each mode; assert the results agree.

    Returns {mode: (row reader's result, whether bulk was taken)}.
    """
    out = {}
    for mode in modes:
        got, taken = _read(path, fields, mode, use_bulk=True, prefix=prefix)
        ref, _ = _read(path, fields, mode, use_bulk=False, prefix=prefix)
        _same(got, ref)
        out[mode] = (ref, taken)
        if currently_in_test_context():  # what the generators reach: --hypothesis-show-statistics
            event(f"{mode}: {'bulk' if taken else 'rows'}, {'table' if isinstance(ref, PromptTable) else 'error'}")
    return out


def _first_record_end(data: bytes) -> int:
    """Past the first line that holds a record (as tests/test_bulk_jsonl_lines.py cuts the prefix)."""
    body = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    start = len(body) - len(body.lstrip())
    end = body.find(b"\n", start)
    return len(body) if end < 0 else end + 1


class _Dir:
    """A temporary directory per example (hypothesis reuses function-scoped fixtures across examples)."""

    def __enter__(self) -> Path:
        self._tmp = tempfile.TemporaryDirectory()
        return Path(self._tmp.name)

    def __exit__(self, *exc) -> None:
        self._tmp.cleanup()


FIELDS = {"prompt_field": "prompt", "id_field": "id", "length_field": None}


# ---------------------------------------------------------------- JSON lines


class Raw(str):
    """JSON text written as is (a literal json.dumps would not write: -0, 5.0, NaN, a huge integer, an escaped key)."""


class Obj(list):
    """A JSON object as (key, value) pairs: keys may repeat, and a key may be a Raw spelling."""


def enc(v: object, ascii_only: bool) -> str:
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, Obj):
        return "{" + ", ".join(f"{enc(k, ascii_only)}: {enc(x, ascii_only)}" for k, x in v) + "}"
    if isinstance(v, dict):
        return enc(Obj(v.items()), ascii_only)
    if isinstance(v, list):
        return "[" + ", ".join(enc(x, ascii_only) for x in v) + "]"
    return json.dumps(v, ensure_ascii=ascii_only, allow_nan=True)


_SPACES = [" ", "\t", "\u3000", "\x85", "\xa0", "\u2028", "\u200b", "\x1c", "\x0b", "\u2003", "\ufeff"]
_TRICKY = st.sampled_from(
    ['"', "\\", "\n", "\r\n", "\t", "\x00", "\x1f", "\x7f", "\u2028", "\u2029", "\x85", "é", "漢", "😀", "\U0010ffff",
     "\ufffe", "{}", '{"role":', " ", "\u3000", "\ud800", "\udfff", "\ud83d\ude00", "Inf", "NaN", "/"]
)
_CHARS = st.characters(codec="utf-8") | st.sampled_from(_SPACES)
# Any text (lone surrogates included: JSON escapes them, raw they make the file invalid UTF-8), and text that
# UTF-8 holds and that is not blank.
_TEXT = st.lists(st.one_of(st.text(_CHARS, max_size=5), _TRICKY), min_size=1, max_size=5).map("".join)
_TEXT_OK = st.lists(st.one_of(st.text(_CHARS, max_size=5), _TRICKY.filter(lambda c: _encodable(c))), min_size=1,
                    max_size=5).map("".join).map(lambda s: s if s.strip() else "q" + s)  # fmt: skip


def _mostly(normal: st.SearchStrategy, odd: st.SearchStrategy, one_in: int = 8) -> st.SearchStrategy:
    """``odd`` one time in ``one_in``, else ``normal``: one odd value among valid ones is what the bulk path must catch."""
    return st.integers(0, one_in - 1).flatmap(lambda k: odd if k == one_in - 1 else normal)


def _encodable(s: str) -> bool:
    return not any("\ud800" <= c <= "\udfff" for c in s)


_WORDY = st.text("abcxyz 01", min_size=1, max_size=6).map(lambda s: "q" + s)
_PROMPT_TEXT = _mostly(st.one_of(_WORDY, _TEXT_OK, st.just("x" * 300)),
                       st.one_of(_TEXT, st.sampled_from(["", *_SPACES, " \u3000 ", "\u200b"])))  # fmt: skip
_ROLE = _mostly(st.sampled_from(["user", "system", "assistant", "tool", "developer"]), st.sampled_from(["robot", "User"]),
                30)  # fmt: skip
_MESSAGE = st.builds(lambda r, c: {"role": r, "content": c}, _ROLE, _PROMPT_TEXT)
_CHAT = st.lists(_MESSAGE, min_size=1, max_size=3)

# Values a field may hold on a row that breaks the pattern of the rows before it.
_ODD_SCALARS = st.sampled_from(
    [Raw("-0"), Raw("-0.0"), Raw("0"), Raw("5.0"), Raw("5"), Raw("1e2"), Raw("1E+2"), Raw("-1"), Raw("2.5"),
     Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e400"), Raw("-1e-400"), Raw("1e-400"), Raw("10000001"),
     Raw("9" * 25), Raw("-" + "9" * 25), Raw("9" * 4500), Raw("9223372036854775807"), Raw("9223372036854775808"),
     Raw("-9223372036854775808"), Raw("true"), Raw("false"), Raw("null"), "", " ", "\u3000", "5", "a\x00b",
     Raw('"\\ud800"'), Raw('"\\u0000"'), Raw('"\\u3000"'), {}, [], [Raw("null")], [1, Raw("-0")], [Raw("5.0"), 2],
     [[1]], {"index": 1}, Raw("0.1000000000000000055511151231257827")]
)


@st.composite
def _chat_odd(draw) -> object:
    """A chat some row holds that the first rows' chats do not: content parts, other keys, odd messages."""
    kind = draw(st.sampled_from(["parts", "name", "name_null", "swap", "no_content", "null_content", "num_content",
                                 "no_role", "empty", "not_obj", "dup_key", "esc_key", "text_parts_extra"]))  # fmt: skip
    text = draw(_WORDY)
    if kind == "parts":
        parts = draw(st.lists(st.sampled_from([{"type": "text", "text": text}, {"type": "text", "text": "b"},
                                               {"type": "image", "image": "x"}, {"text": "t"}]), min_size=1, max_size=2))  # fmt: skip
        return [{"role": "user", "content": parts}]
    return {
        "name": [{"role": "user", "content": text, "name": "bob"}],
        "name_null": [{"role": "user", "content": text, "name": Raw("null")}],
        "swap": [Obj([("content", text), ("role", "user")])],
        "no_content": [{"role": "user"}],
        "null_content": [{"role": "user", "content": Raw("null")}],
        "num_content": [{"role": "user", "content": Raw("5")}],
        "no_role": [{"content": text}],
        "empty": [],
        "not_obj": ["hi"],
        "dup_key": [Obj([("role", "user"), ("content", "a"), ("content", text)])],
        "esc_key": [Obj([("role", "user"), (Raw('"c\\u006fntent"'), text)])],
        "text_parts_extra": [{"role": "user", "content": [{"type": "text", "text": text, "x": Raw("null")}]}],
    }[kind]


@st.composite
def jsonl_files(draw) -> tuple[bytes, dict, str]:
    """(file bytes, read_prompts fields, prefix choice): rows of one pattern, then a few rows that break it."""
    n = draw(st.integers(1, 6))
    prompt_kind = draw(st.sampled_from(["text", "chat", "messages", "verl"]))
    id_kind = draw(st.sampled_from(["int", "str", "none", "named", "index_int", "index_str"]))
    len_kind = draw(st.sampled_from([None, "int", "float", "list"]))
    prompt_field = "prompt" if draw(st.booleans()) else "question"
    id_field = "uid" if id_kind == "named" else "id"
    fields = {"prompt_field": prompt_field, "id_field": id_field, "length_field": "len" if len_kind else None}

    rows = []
    for i in range(n):
        rec = Obj()
        if prompt_kind == "text":
            rec.append((prompt_field, draw(_PROMPT_TEXT)))
        elif prompt_kind == "chat" or prompt_kind == "verl":
            rec.append((prompt_field, draw(_CHAT)))
        else:
            rec.append(("messages", draw(_CHAT)))
        if id_kind in ("int", "named"):
            rec.append((id_field, draw(st.integers(-(2**63), 2**63 - 1)) if draw(st.booleans()) else i))
        elif id_kind == "str":
            rec.append((id_field, draw(_mostly(st.one_of(st.just(f"r{i}"), _TEXT_OK.map(lambda s, i=i: f"{s}{i}")),
                                               st.one_of(_TEXT, st.sampled_from(["", " ", "7", "r0"]))))))  # fmt: skip
        elif id_kind.startswith("index"):
            index = i if id_kind == "index_int" else draw(_mostly(st.just(f"i{i}"), _TEXT))
            rec.append(("extra_info", {"index": index, "split": "train"}))
        if len_kind == "int":
            rec.append(("len", draw(st.integers(0, 5000))))
        elif len_kind == "float":
            rec.append(("len", draw(st.floats(0, 1e7, allow_nan=False))))
        elif len_kind == "list":
            rec.append(("len", draw(st.lists(st.integers(0, 5000) | st.floats(0, 1e7), min_size=1, max_size=3))))
        if draw(st.booleans()):
            rec.append(("x", draw(st.sampled_from([Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e300"),
                                                   [Raw("NaN"), {"a": None}], "Inf -NaN", Raw("9" * 30)]))))  # fmt: skip
        order = draw(st.permutations(range(len(rec))))
        rows.append(Obj(rec[j] for j in order))

    # Rows that break the pattern (at any row: past the prefix they reach pyarrow unchecked).
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        rec = rows[draw(st.integers(0, n - 1))]
        what = draw(st.sampled_from(["set_prompt", "set_messages", "set_id", "set_uid", "set_len", "drop",
                                     "dup", "esc_key", "index", "info", "junk", "dup_id"]))  # fmt: skip
        if what in ("set_prompt", "set_messages"):
            key = prompt_field if what == "set_prompt" else "messages"
            value = draw(st.one_of(_PROMPT_TEXT, _CHAT, _chat_odd(), _ODD_SCALARS))
            _put(rec, key, value)
        elif what in ("set_id", "set_uid", "set_len"):
            key = {"set_id": id_field, "set_uid": "uid", "set_len": "len"}[what]
            _put(rec, key, draw(_ODD_SCALARS))
        elif what == "drop" and rec:
            del rec[draw(st.integers(0, len(rec) - 1))]
        elif what == "dup" and rec:
            k, v = rec[draw(st.integers(0, len(rec) - 1))]
            rec.append((k, draw(st.sampled_from([v, "other", Raw("1")]))))
        elif what == "esc_key" and rec:
            j = draw(st.integers(0, len(rec) - 1))
            k, v = rec[j]
            if isinstance(k, str) and not isinstance(k, Raw):
                rec[j] = (Raw('"' + "".join(f"\\u{ord(c):04x}" if c in "ode" else c for c in k) + '"'), v)
        elif what == "index":
            _put(rec, "extra_info", {"index": draw(st.one_of(st.integers(-3, 3), _ODD_SCALARS, st.just("i9")))})
        elif what == "info":
            _put(rec, "extra_info", draw(st.sampled_from(["text", Raw("null"), {}, {"split": "x"}, [1],
                                                          {"index": 1, "index2": Raw("NaN")}])))  # fmt: skip
        elif what == "junk":
            rec.append(("x", draw(st.sampled_from([Raw("[" * 150 + "]" * 150), Raw('"\\udc00"'), Raw("1e999"),
                                                   Raw("9" * 5000), "\x00"]))))  # fmt: skip
        elif what == "dup_id" and n > 1:
            other = rows[0] if rec is not rows[0] else rows[-1]
            for k, v in other:
                if k in (id_field, "extra_info"):
                    _put(rec, k, v)

    ascii_only = draw(st.booleans())
    lines = [enc(r, ascii_only) for r in rows]
    # Line-level noise: blank lines, CRLF, trailing spaces, a long line.
    noise = draw(_mostly(st.just([]), st.lists(st.tuples(st.integers(0, len(lines)), st.sampled_from(["", " ", "\t", "\r", " \r", "\u3000",
                                                                                 "\x0c", "\ufeff"])), max_size=2), 3))  # fmt: skip
    for at, blank in sorted(noise, reverse=True):
        lines.insert(at, blank)
    if draw(st.integers(0, 9)) == 0:
        j = draw(st.integers(0, len(lines) - 1))
        if lines[j].endswith("}"):
            lines[j] = lines[j][:-1] + ', "pad": "' + "p" * draw(st.sampled_from([1000, 70_000])) + '"}'
    if draw(_mostly(st.just(False), st.just(True), 12)):  # a BOM before some line's record: json.loads refuses it
        j = draw(st.integers(0, len(lines) - 1))
        lines[j] = "\ufeff" + lines[j]
    newline = draw(st.sampled_from(["\n", "\n", "\r\n"]))
    text = newline.join(lines) + draw(st.sampled_from([newline, "", "  ", newline + newline]))
    data = text.encode("utf-8", errors="surrogatepass")  # a lone surrogate written raw: the file is not UTF-8
    if draw(st.integers(0, 5)) == 0:
        data = b"\xef\xbb\xbf" + data
    if draw(st.integers(0, 15)) == 0:
        j = draw(st.integers(0, len(data)))
        data = data[:j] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf"])) + data[j:]
    prefix = draw(st.sampled_from(["first", "first", "line", "default"]))
    if prefix == "line":
        ends = [i + 1 for i, b in enumerate(data) if b == 0x0A] or [len(data)]
        prefix = str(draw(st.sampled_from(ends)))
    return data, fields, prefix


def _put(rec: Obj, key: str, value: object) -> None:
    for j, (k, _) in enumerate(rec):
        if k == key:
            rec[j] = (key, value)
            return
    rec.append((key, value))


def _prefix(data: bytes, choice: str) -> int | None:
    if choice == "default":
        return None
    if choice == "first":
        return _first_record_end(data)
    return int(choice)


@settings(max_examples=600, **_SETTINGS)
@given(jsonl_files())
def test_jsonl_bulk_and_row_reader_agree(case):
    data, fields, prefix = case
    assume(data.strip())
    with _Dir() as d:
        path = d / "t.jsonl"
        path.write_bytes(data)
        check_both(path, fields, prefix=_prefix(data, prefix))


@st.composite
def clean_jsonl(draw) -> tuple[bytes, dict]:
    """Files the bulk reader must take: one pattern on every row, valid values."""
    n = draw(st.integers(1, 8))
    chat = draw(st.booleans())
    ids = draw(st.sampled_from(["int", "str", "none", "index"]))
    lens = draw(st.sampled_from([None, "one", "list"]))
    recs = []
    for i in range(n):
        rec: dict = {}
        words = draw(_TEXT_OK)
        rec["prompt"] = [{"role": "user", "content": words}] if chat else words
        if ids == "int":
            rec["id"] = i - 3
        elif ids == "str":
            rec["id"] = f"{words[:3]!r}-{i}"
        elif ids == "index":
            rec["extra_info"] = {"index": i}
        if lens == "one":
            rec["len"] = draw(st.integers(0, 5000) | st.floats(0, 1e7))
        elif lens == "list":
            rec["len"] = draw(st.lists(st.integers(0, 5000), min_size=1, max_size=3))
        recs.append(rec)
    if ids == "none":
        assume(len({json.dumps(r["prompt"]) for r in recs}) == n)
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    text = newline.join(json.dumps(r, ensure_ascii=draw(st.booleans())) for r in recs) + newline
    return text.encode(), {**FIELDS, "length_field": "len" if lens else None}


@settings(max_examples=80, **_SETTINGS)
@given(clean_jsonl())
def test_clean_jsonl_takes_the_bulk_path(case):
    data, fields = case
    with _Dir() as d:
        path = d / "t.jsonl"
        path.write_bytes(data)
        out = check_both(path, fields, prefix=_first_record_end(data), modes=("error",))
    ref, taken = out["error"]
    assert isinstance(ref, PromptTable) and taken


# ---------------------------------------------------------------- Parquet

_CHAT_T = pa.struct([("role", pa.string()), ("content", pa.string())])
_CHAT_NAME_T = pa.struct([("role", pa.string()), ("content", pa.string()), ("name", pa.string())])
_PART_T = pa.struct([("type", pa.string()), ("text", pa.string()), ("image", pa.string())])
_CHAT_PARTS_T = pa.struct([("role", pa.string()), ("content", pa.list_(_PART_T))])


def _bad_utf8(values: list[bytes | None], typ: pa.DataType = pa.string()) -> pa.Array:
    """A string array holding these bytes unchecked (pyarrow writes it to Parquet as is)."""
    offsets = np.zeros(len(values) + 1, dtype=np.int32 if typ == pa.string() else np.int64)
    offsets[1:] = np.cumsum([len(v or b"") for v in values])
    valid = None
    if any(v is None for v in values):
        valid = pa.py_buffer(np.packbits([v is not None for v in values], bitorder="little"))
    nulls = sum(v is None for v in values)
    return pa.Array.from_buffers(typ, len(values), [valid, pa.py_buffer(offsets), pa.py_buffer(b"".join(v or b"" for v in values))],
                                 null_count=nulls)  # fmt: skip


def _text_column(draw, texts: list[str | None]) -> pa.Array:
    kind = draw(_mostly(st.sampled_from(["string", "large_string", "dictionary", "string_view"]),
                        st.sampled_from(["binary", "large_binary", "bad_utf8"]), 6))
    if kind == "bad_utf8":
        raw = [None if t is None else t.encode() for t in texts]
        if raw and raw[-1] is not None:
            raw[-1] = raw[-1] + b"\xff"
        return _bad_utf8(raw)
    if kind in ("binary", "large_binary"):
        return pa.array([None if t is None else t.encode() for t in texts], getattr(pa, kind)())
    if kind == "dictionary":
        return pa.array(texts, pa.string()).dictionary_encode()
    return pa.array(texts, getattr(pa, kind)())


_PQ_TEXT = _mostly(st.one_of(_WORDY, _TEXT_OK, st.just("😀")), st.sampled_from(["", " ", "\u3000", "\x85 ", "\u200b"]))


@st.composite
def parquet_tables(draw) -> tuple[pa.Table, dict, int]:
    n = draw(_mostly(st.integers(1, 6), st.just(0), 20))
    prompt_field = "prompt"
    cols: dict[str, pa.Array] = {}
    nulls = {draw(st.integers(0, n - 1))} if n and draw(_mostly(st.just(False), st.just(True), 12)) else set()

    pkind = draw(_mostly(st.sampled_from(["text", "text", "chat", "large_chat", "chat_name", "chat_parts", "messages",
                                          "verl", "null_prompt_messages"]), st.sampled_from(["list_of_str", "struct"]), 15))  # fmt: skip
    texts = [draw(_PQ_TEXT) for _ in range(n)]
    chats = [[{"role": draw(_ROLE), "content": t}] + ([{"role": "assistant", "content": draw(_PQ_TEXT)}]
             if draw(st.booleans()) else []) for t in texts]  # fmt: skip
    if pkind == "text":
        cols[prompt_field] = _text_column(draw, [None if i in nulls else t for i, t in enumerate(texts)])
    elif pkind in ("chat", "verl", "messages", "large_chat"):
        typ = pa.large_list(_CHAT_T) if pkind == "large_chat" else pa.list_(_CHAT_T)
        col = pa.array([None if i in nulls else c for i, c in enumerate(chats)], typ)
        cols["messages" if pkind == "messages" else prompt_field] = col
    elif pkind == "null_prompt_messages":
        cols[prompt_field] = pa.nulls(n, pa.string())
        cols["messages"] = pa.array(chats, pa.list_(_CHAT_T))
    elif pkind == "chat_name":
        names = [draw(st.sampled_from([None, None, "bob", ""])) for _ in range(n)]
        cols[prompt_field] = pa.array([[{**c[0], "name": nm}] + c[1:] for c, nm in zip(chats, names, strict=True)],
                                      pa.list_(_CHAT_NAME_T))  # fmt: skip
    elif pkind == "chat_parts":
        def parts(t):
            return [{"type": draw(_mostly(st.just("text"), st.just("image"), 10)), "text": t,
                     "image": draw(_mostly(st.none(), st.just("u"), 10))}]  # fmt: skip

        cols[prompt_field] = pa.array([[{"role": "user", "content": parts(t)}] for t in texts], pa.list_(_CHAT_PARTS_T))
    elif pkind == "list_of_str":
        cols[prompt_field] = pa.array([[t] for t in texts], pa.list_(pa.string()))
    else:
        cols[prompt_field] = pa.array([{"role": "user", "content": t} for t in texts], _CHAT_T)

    ikind = draw(_mostly(st.sampled_from(["none", "int64", "int32", "uint64", "int8", "string", "large_string",
                                          "dictionary", "all_null", "index", "index_str"]),
                         st.sampled_from(["float64", "bool", "binary", "index_float"]), 6))  # fmt: skip
    id_field = "id" if ikind in ("none", "all_null") or ikind.startswith("index") else draw(st.sampled_from(["id", "uid"]))
    id_field = draw(_mostly(st.just(id_field), st.just("uid"), 12))
    ints = draw(st.lists(st.integers(-100, 100), min_size=n, max_size=n, unique=draw(st.integers(0, 5)) > 0))
    id_nulls = {draw(st.integers(0, n - 1))} if n and draw(_mostly(st.just(False), st.just(True), 12)) else set()
    ids = [None if i in id_nulls else v for i, v in enumerate(ints)]
    if ikind in ("int64", "int32", "int8"):
        cols[id_field] = pa.array([None if v is None else max(-128, min(127, v)) for v in ids], getattr(pa, ikind)())
    elif ikind == "uint64":
        cols[id_field] = pa.array([None if v is None else abs(v) + 2**63 for v in ids], pa.uint64())
    elif ikind in ("string", "large_string", "dictionary", "binary"):
        strs = [None if v is None else draw(_mostly(st.sampled_from([f"s{v}", f"😀{v}", f" {v} "]),
                                                    st.sampled_from([" ", "", "a\x00", "\u3000"])))
                for v in ids]  # fmt: skip
        cols[id_field] = (pa.array(strs, pa.string()).dictionary_encode() if ikind == "dictionary"
                          else pa.array([s.encode() if s is not None and ikind == "binary" else s for s in strs],
                                        getattr(pa, ikind)()))  # fmt: skip
    elif ikind == "float64":
        cols[id_field] = pa.array([None if v is None else float(v) for v in ids], pa.float64())
    elif ikind == "bool":
        cols[id_field] = pa.array([None if v is None else v > 0 for v in ids], pa.bool_())
    elif ikind == "all_null":
        cols[id_field] = pa.nulls(n, pa.int64())
    if ikind.startswith("index"):
        itype = {"index": pa.int64(), "index_str": pa.string(), "index_float": pa.float64()}[ikind]
        vals = [None if v is None else (f"i{v}" if ikind == "index_str" else v) for v in ids]
        idx = pa.array([None if v is None else (v + 0.5 * draw(st.integers(0, 1)) if ikind == "index_float" else v)
                        for v in vals], itype)  # fmt: skip
        cols["extra_info"] = pa.StructArray.from_arrays([idx, pa.array(["train"] * n)], names=["index", "split"])

    lkind = draw(_mostly(st.sampled_from([None, "int64", "int32", "float32", "float64", "uint64", "list", "large_list",
                                          "fixed", "list_float32"]), st.sampled_from(["bool", "decimal", "string"]), 6))  # fmt: skip
    length_field = None
    if lkind is not None:
        length_field = draw(_mostly(st.just("len"), st.just("missing")))
        vals = [draw(_mostly(st.integers(0, 5000), st.sampled_from([0, 10_000_000, 10_000_001, -1]))) for _ in range(n)]
        fl = [draw(_mostly(st.floats(0, 1e7, width=32), st.sampled_from([-0.0, float("nan"), float("inf"), 2.5, 1e8])))
              for _ in range(n)]  # fmt: skip
        if lkind in ("int64", "int32"):
            col = pa.array(vals, getattr(pa, lkind)())
        elif lkind == "uint64":
            col = pa.array([abs(v) + draw(_mostly(st.just(0), st.just(2**64 - 10**8))) for v in vals], pa.uint64())
        elif lkind in ("float32", "float64"):
            col = pa.array(fl, getattr(pa, lkind)())
        elif lkind in ("list", "large_list", "list_float32"):
            lists = [draw(st.lists(_mostly(st.integers(0, 5000), st.sampled_from([None, -1, 2.5]), 12),
                                   min_size=draw(_mostly(st.just(1), st.just(0))), max_size=3)) for _ in range(n)]  # fmt: skip
            typ = {"list": pa.list_(pa.int64()), "large_list": pa.large_list(pa.float64()),
                   "list_float32": pa.list_(pa.float32())}[lkind]  # fmt: skip
            col = pa.array(lists, typ)
        elif lkind == "fixed":
            col = pa.array([[v, abs(v)] for v in vals], pa.list_(pa.int32(), 2))
        elif lkind == "bool":
            col = pa.array([v > 0 for v in vals])
        elif lkind == "decimal":
            import decimal

            col = pa.array([decimal.Decimal(v) for v in vals], pa.decimal128(12, 2))
        else:
            col = pa.array([str(v) for v in vals])
        if draw(_mostly(st.just(False), st.just(True), 12)) and n:
            mask = np.zeros(n, dtype=bool)
            mask[draw(st.integers(0, n - 1))] = True
            col = pa.array(col.to_pylist(), col.type, mask=mask)
        cols["len"] = col

    if draw(st.booleans()):  # columns no field names: read by the row reader, not by the bulk reader
        cols["other"] = pa.array([draw(st.sampled_from([1.5, float("nan"), None])) for _ in range(n)], pa.float64())
    if draw(st.integers(0, 3)) == 0:
        cols["blob"] = _bad_utf8([b"ok", b"\xff"] * n)[:n]  # not UTF-8, where nothing reads it

    names = list(cols)
    order = draw(st.permutations(names))
    tab = pa.table({k: cols[k] for k in order})
    fields = {"prompt_field": prompt_field, "id_field": id_field, "length_field": length_field}
    return tab, fields, draw(st.integers(1, max(n, 1)))


@settings(max_examples=500, **_SETTINGS)
@given(parquet_tables())
def test_parquet_bulk_and_row_reader_agree(case):
    tab, fields, row_group = case
    with _Dir() as d:
        path = d / "t.parquet"
        pq.write_table(tab, path, row_group_size=row_group)
        check_both(path, fields)


@st.composite
def clean_parquet(draw) -> tuple[pa.Table, dict, int]:
    n = draw(st.integers(1, 8))
    texts = draw(st.lists(_WORDY, min_size=n, max_size=n, unique=True))
    kind = draw(st.sampled_from(["string", "large_string", "dictionary", "chat", "large_chat"]))
    if kind in ("chat", "large_chat"):
        typ = pa.list_(_CHAT_T) if kind == "chat" else pa.large_list(_CHAT_T)
        prompt = pa.array([[{"role": "user", "content": t}] for t in texts], typ)
    elif kind == "dictionary":
        prompt = pa.array(texts).dictionary_encode()
    else:
        prompt = pa.array(texts, getattr(pa, kind)())
    cols = {"prompt": prompt}
    ids = draw(st.sampled_from(["none", "int32", "uint64", "string", "index"]))
    if ids == "int32":
        cols["id"] = pa.array(range(n), pa.int32())
    elif ids == "uint64":
        cols["id"] = pa.array([2**64 - 1 - i for i in range(n)], pa.uint64())
    elif ids == "string":
        cols["id"] = pa.array([f"p{i}" for i in range(n)], pa.large_string())
    elif ids == "index":
        cols["extra_info"] = pa.StructArray.from_arrays([pa.array(range(n))], names=["index"])
    lens = draw(st.sampled_from([None, "float32", "list", "fixed"]))
    if lens == "float32":
        cols["len"] = pa.array(draw(st.lists(st.floats(0, 1e7, width=32), min_size=n, max_size=n)), pa.float32())
    elif lens == "list":
        cols["len"] = pa.array([[i, i + 1] for i in range(n)], pa.large_list(pa.int16()))
    elif lens == "fixed":
        cols["len"] = pa.array([[i, 7, 0] for i in range(n)], pa.list_(pa.float64(), 3))
    return pa.table(cols), {**FIELDS, "length_field": "len" if lens else None}, draw(st.integers(1, n))


@settings(max_examples=60, **_SETTINGS)
@given(clean_parquet())
def test_clean_parquet_takes_the_bulk_path(case):
    tab, fields, row_group = case
    with _Dir() as d:
        path = d / "t.parquet"
        pq.write_table(tab, path, row_group_size=row_group)
        out = check_both(path, fields, modes=("error",))
    ref, taken = out["error"]
    assert isinstance(ref, PromptTable) and taken


# ---------------------------------------------------------------- explicit cases


def _jsonl(tmp_path: Path, text: str | bytes, fields: dict = FIELDS, prefix: str = "first") -> dict:
    path = tmp_path / "t.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", errors="surrogatepass"))
    return check_both(path, fields, prefix=_prefix(path.read_bytes(), prefix))


def _parquet(tmp_path: Path, tab: pa.Table, fields: dict = FIELDS, **write) -> dict:
    path = tmp_path / "t.parquet"
    pq.write_table(tab, path, **write)
    return check_both(path, fields)


def test_prompts_at_and_over_the_size_cap(tmp_path):
    at = "a" * MAX_PROMPT_BYTES
    over = "é" * (MAX_PROMPT_BYTES // 2) + "a"  # one byte over, in two-byte characters
    out = _jsonl(tmp_path, json.dumps({"id": 1, "prompt": at}) + "\n")
    assert out["error"][1]
    out = _jsonl(tmp_path, json.dumps({"id": 1, "prompt": "q"}) + "\n" + json.dumps({"id": 2, "prompt": over}) + "\n")
    assert isinstance(out["error"][0], tuple) and not out["skip"][1]
    frame = len(json.dumps([{"role": "user", "content": ""}], separators=(",", ":")))
    for size in (MAX_PROMPT_BYTES - frame, MAX_PROMPT_BYTES - frame + 1):  # the stored JSON at the cap, one over
        chat = [{"role": "user", "content": "a" * size}]
        _parquet(tmp_path, pa.table({"prompt": pa.array([chat], pa.list_(_CHAT_T))}))
        _jsonl(tmp_path, json.dumps({"prompt": chat}) + "\n")
    _parquet(tmp_path, pa.table({"prompt": pa.array([at, over], pa.large_string()), "id": [1, 2]}))


def test_very_long_lines_and_zero_rows(tmp_path):
    long = "x" * (9 << 20)  # past a pyarrow.json block: a line straddling blocks goes row by row
    _jsonl(tmp_path, json.dumps({"id": 1, "prompt": "q", "pad": long}) + "\n" + json.dumps({"id": 2, "prompt": "r"}))
    _parquet(tmp_path, pa.table({"prompt": pa.array([], pa.string()), "id": pa.array([], pa.int64())}))
    _jsonl(tmp_path, "\n \n\r\n")


@pytest.mark.parametrize(
    "lines",
    [
        ['{"id": 1, "prompt": "a"}', '{"id": 2, "pr\\u006fmpt": "b"}'],  # an escaped key
        ['{"id": 1, "prompt": "a"}', '{"id": 2, "prompt": "b", "pr\\u006fmpt": "c"}'],  # twice, once escaped
        ['{"id": 1, "prompt": "a"}', '{"id": 2, "prompt": "b", "id": 3}'],
        ['{"id": 1, "prompt": "a", "x": NaN}', '{"id": 2, "prompt": "b", "x": [Infinity, -Infinity]}'],
        ['{"id": 1, "prompt": "a"}', '{"id": true, "prompt": "b"}'],
        ['{"id": "1", "prompt": "a"}', '{"id": 1, "prompt": "b"}'],
        ['{"id": 1, "prompt": "a"}', '{"id": 1.0, "prompt": "b"}'],
        ['{"id": 1, "prompt": "a"}', '{"id": 99999999999999999999, "prompt": "b"}'],
        ['{"id": 1, "prompt": "a", "len": 5}', '{"id": 2, "prompt": "b", "len": 5.0}', '{"id": 3, "prompt": "c", "len": -0}'],
        ['{"id": 1, "prompt": "a", "len": 5}', '{"id": 2, "prompt": "b", "len": -0.0}'],
        ['{"id": 1, "prompt": "a", "len": [5]}', '{"id": 2, "prompt": "b", "len": 5}'],
        ['{"prompt": "a"}', '{"prompt": "b", "extra_info": {"index": 1}}'],
        ['{"prompt": "a", "extra_info": {"index": 1}}', '{"prompt": "b", "extra_info": {"index": 2.0}}'],
        ['{"prompt": [{"role": "user", "content": "a"}]}',
         '{"prompt": [{"role": "user", "content": [{"type": "text", "text": "b"}]}]}'],
        ['{"prompt": [{"role": "user", "content": "a"}]}', '{"prompt": [{"role": "user", "content": "b", "name": "x"}]}'],
        ['{"prompt": [{"role": "user", "content": "a"}]}', '{"prompt": [{"role": "user", "content": "b", "name": null}]}'],
        ['{"prompt": "a\\u0000b", "id": 1}', '{"prompt": "\\u3000", "id": 2}'],
        ['{"prompt": "a", "id": 1}', '{"prompt": "\\ud83d\\ude00", "id": 2}', '{"prompt": "\\udc00", "id": 3}'],
    ],
)
def test_jsonl_cases(tmp_path, lines):
    for newline in ("\n", "\r\n"):
        _jsonl(tmp_path, newline.join(lines) + newline, {**FIELDS, "length_field": "len" if "len" in lines[0] else None})
        _jsonl(tmp_path, "\ufeff" + "\n\n".join(lines))


@pytest.mark.parametrize(
    "text",
    [
        '{"prompt":"a"}\n\ufeff{"prompt":"b"}\n',  # a BOM inside the file: json.loads refuses, the prefix check not
        '\ufeff\ufeff{"prompt":"a"}\n{"prompt":"b"}\n',
        '{"prompt":"a"}\n{"prompt":"b"}\ufeff\n',
        '{"prompt":"a"}\n\u2028\n{"prompt":"b"}\n',  # a line blank to str.strip, not to JSON
        '{"prompt":"a"}\n\x0c\n',
        '{"prompt":"a"}\n\x00\n',
        '{"prompt":"a"}\r{"prompt":"b"}\n',  # pyarrow ends a row at a lone CR, the row reader does not
        '{"prompt":"a",\r"id":1}\n',
        '{"prompt":"a"}\n\r\n{"prompt":"b"}\r',
        '{"prompt":"a", "x": 1e999}\n',  # json.loads: inf; pyarrow: too big
        '{"prompt":"a", "x": "\\ud800"}\n',  # a lone surrogate in a field nothing reads
    ],
)
def test_jsonl_texts(tmp_path, text):
    for prefix in ("first", "default"):
        _jsonl(tmp_path, text, FIELDS, prefix)


def test_verl_parquet_and_odd_types(tmp_path):
    n = 5
    chats = pa.array([[{"role": "system", "content": "s"}, {"role": "user", "content": f"q{i} 😀"}] for i in range(n)],
                     pa.list_(_CHAT_T))  # fmt: skip
    info = pa.StructArray.from_arrays([pa.array(range(n)), pa.array(["train"] * n)], names=["index", "split"])
    out = _parquet(tmp_path, pa.table({"prompt": chats, "extra_info": info, "reward_model": pa.array([{"a": 1}] * n)}),
                   row_group_size=2)  # fmt: skip
    assert out["error"][1] and out["error"][0].ids == [str(i) for i in range(n)]
    lens = pa.array([[1.5, 2.0], [0.0, 3.0], [7.0, 1e7], [4.0, 4.0], [5.0, 5.0]], pa.list_(pa.float32(), 2))
    ids = pa.array([2**64 - 1, 0, 5, 6, 7], pa.uint64())
    out = _parquet(tmp_path, pa.table({"prompt": chats, "id": ids, "lengths": lens}),
                   {**FIELDS, "length_field": "lengths"})  # fmt: skip
    assert out["error"][1]


@pytest.mark.parametrize(
    "fields",
    [
        {"prompt_field": "prompt", "id_field": "prompt", "length_field": None},  # one field for two roles
        {"prompt_field": "prompt", "id_field": "id", "length_field": "id"},
        {"prompt_field": "id", "id_field": "prompt", "length_field": None},
        {"prompt_field": "messages", "id_field": "id", "length_field": None},
        {"prompt_field": "prompt", "id_field": "messages", "length_field": None},
        {"prompt_field": "prompt", "id_field": "extra_info", "length_field": None},
        {"prompt_field": "extra_info", "id_field": "id", "length_field": None},
        {"prompt_field": "prompt", "id_field": "id", "length_field": "extra_info"},
        {"prompt_field": "pr\u006fmpt", "id_field": "i\"d", "length_field": "l/n"},
    ],
)
def test_field_names_that_collide(tmp_path, fields):
    chat = [{"role": "user", "content": "c"}]
    recs = [{"prompt": f"q{i}", "id": i, "messages": chat, "extra_info": {"index": i}, "i\"d": i, "l/n": 3}
            for i in range(3)]  # fmt: skip
    _jsonl(tmp_path, "".join(json.dumps(r) + "\n" for r in recs), fields)
    _parquet(tmp_path, pa.table({k: [r[k] for r in recs] for k in recs[0]}), fields)


# ---------------------------------------------------------------- discrepancies found, now agreeing

_BAD = _bad_utf8([b"ok", b"\xff"])


# Was: bulk._ids ignores an extra_info column that is not a struct; the row reader's _verl_index refuses its text when it is not UTF-8
def test_extra_info_text_not_utf8_without_ids(tmp_path):
    _parquet(tmp_path, pa.table({"prompt": ["a", "b"], "extra_info": _BAD}))


# Was: bulk._ids reads extra_info.index only; the row reader refuses the whole extra_info cell when any of its text
# (here 'split') is not UTF-8
def test_extra_info_struct_with_other_text_not_utf8(tmp_path):
    info = pa.StructArray.from_arrays([pa.array([1, 2]), _BAD], names=["index", "split"])
    _parquet(tmp_path, pa.table({"prompt": ["a", "b"], "extra_info": info}))


# Was: the row reader converts every column to Python (iter_parquet); a struct with two fields of one name refuses
# the file, where read_parquet_bulk never reads the column
def test_unread_struct_column_with_a_repeated_field_name(tmp_path):
    twice = pa.StructArray.from_arrays([pa.array([1, 2]), pa.array([3, 4])], names=["a", "a"])
    _parquet(tmp_path, pa.table({"prompt": ["a", "b"], "id": [1, 2], "meta": twice}))


# Was: the row reader converts every column to Python: a date or timestamp past Python's range raises a bare
# OverflowError (not even an InputError), where read_parquet_bulk never reads the column
def test_unread_column_past_pythons_date_range(tmp_path):
    _parquet(tmp_path, pa.table({"prompt": ["a", "b"], "id": [1, 2], "when": pa.array([0, 2**31 - 1], pa.date32())}))


# Was: the row reader reads every column (pq.read_table): a damaged column chunk no field names refuses the file,
# where read_parquet_bulk reads only the columns it needs
def test_unread_column_chunk_that_does_not_decompress(tmp_path):
    path = tmp_path / "t.parquet"
    tab = pa.table({"prompt": ["a", "b"], "id": [1, 2], "junk": ["Z" * 5000, "Y" * 5000]})
    pq.write_table(tab, path, compression="snappy", use_dictionary=False)
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(2)
    data = bytearray(path.read_bytes())
    at = chunk.data_page_offset + chunk.total_compressed_size // 2  # inside the page's compressed bytes
    data[at : at + 16] = bytes(b ^ 0xFF for b in data[at : at + 16])
    path.write_bytes(bytes(data))
    check_both(path, FIELDS)


# Was: bulk._prompts converts chats it cannot build with kernels by arr.to_pylist() and catches only
# _RowError/UnicodeDecodeError: a message struct with a repeated field name escapes as a bare ValueError
def test_chat_struct_with_a_repeated_field_name(tmp_path):
    typ = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("role", pa.string())]))
    _parquet(tmp_path, pa.table({"prompt": pa.array([[("user", "a", "user")], [("user", "b", "user")]], typ)}))


def test_extra_info_past_pythons_date_range_beside_complete_ids(tmp_path):
    # Every row has an id, so nothing reads extra_info: the row reader converted it all the same, and a date
    # there past Python's range refused the file (even with --on-bad-line skip) where the bulk reader took it.
    when = pa.array([0, 2**62, 0], pa.timestamp("us"))
    info = pa.StructArray.from_arrays([pa.array([1, 2, 3]), when], names=["index", "when"])
    _parquet(tmp_path, pa.table({"id": ["x", "y", "z"], "prompt": ["a", "b", "c"], "extra_info": info}))
    _parquet(tmp_path, pa.table({"id": ["x", "y", "z"], "prompt": ["a", "b", " "], "extra_info": info}))
