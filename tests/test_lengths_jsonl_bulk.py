"""JSON-lines lengths read by column (aspc.io.bulk_lengths) equal the row reader's, or leave the file to it."""

from __future__ import annotations

import json
import re
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspc.errors import InputError
from aspc.io import lengths as L
from aspc.io.rows import MAX_LENGTH


def _outcome(path, **kw):
    try:
        return L.read_lengths(path, **kw)
    except InputError as exc:
        return str(exc)


def _same(got, ref) -> None:
    assert type(got) is type(ref), (got, ref)
    if isinstance(ref, str):
        assert got == ref
        return
    assert list(got) == list(ref)  # same ids, in the same order
    for k, want in ref.items():
        have = got[k]
        assert have.dtype == want.dtype == np.float64 and have.shape == want.shape, k
        assert np.array_equal(have.view(np.int64), want.view(np.int64)), (k, have, want)  # bit for bit: -0.0 too
        assert have.flags.writeable == want.flags.writeable, k


def _check(path, **kw) -> bool:
    """Assert read_lengths gives what the row reader alone gives; return whether the fast path answered."""
    answered = []
    real = L._jsonl_lengths

    def spy(*args):
        got = real(*args)
        answered.append(got is not None)
        return got

    with mock.patch.object(L, "_jsonl_lengths", spy):
        got = _outcome(path, **kw)
    with mock.patch.object(L, "_jsonl_lengths", lambda *args: None):
        ref = _outcome(path, **kw)
    _same(got, ref)
    return bool(answered and answered[0])


def _write(tmp_path, data: bytes, name: str = "l.jsonl"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _rows(*lines: str, end: str = "\n") -> bytes:
    return "".join(line + end for line in lines).encode("utf-8", "surrogatepass")


A = '{"id": "a", "lengths": [3, 4]}'
B = '{"id": "b", "lengths": [5]}'


# -- the differential test ------------------------------------------------------------------------------------

_NUM = st.one_of(
    st.integers(0, MAX_LENGTH),
    st.floats(0, MAX_LENGTH, allow_nan=False).filter(lambda x: not np.signbit(x)),
    st.sampled_from([0.1, 5.0, 1e2, 2.5e-3, 0.30000000000000004, 1e-320]),
)
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)  # "Inf" in a string is text, not a value
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats(allow_nan=False, allow_infinity=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["id", "lengths", "k", "é"]), inner),
    max_leaves=6,
)
_STR_IDS = ["a", "b", "p1", "", " ", "é", "😀", "\u2028", 'x"y', "a\\b", "\x00", "1"]
_INT_IDS = [0, 1, -1, 7, 2**63 - 1, -(2**63)]

# Rows the row reader refuses, or reads where the fast path must not, each with one flaw: @ID and @LEN stand for an
# id and lengths of the file's kinds, @L(v) for v as those lengths hold it (v or [v]).
_BAD = [
    # ids
    '{"id": 1.5, "lengths": @LEN}', '{"id": true, "lengths": @LEN}', '{"id": null, "lengths": @LEN}',
    '{"lengths": @LEN}', '{"id": {}, "lengths": @LEN}', '{"id": ' + "9" * 30 + ', "lengths": @LEN}',
    '{"id": ' + "9" * 5000 + ', "lengths": @LEN}', '{"id": "\\ud800", "lengths": @LEN}', '{"id": "z\\udc00", "lengths": @LEN}',
    '{"id": "\\ud83d\\ude00", "lengths": @LEN}', '{"id": 5, "lengths": @LEN}', '{"id": "5", "lengths": @LEN}',
    '{"id": @ID, "id": @ID, "lengths": @LEN}', '{"\\u0069d": @ID, "lengths": @LEN}',
    # lengths
    '{"id": @ID}', '{"id": @ID, "lengths": null}', '{"id": @ID, "lengths": []}', '{"id": @ID, "lengths": "3"}',
    '{"id": @ID, "lengths": [[1]]}', '{"id": @ID, "lengths": 3}', '{"id": @ID, "lengths": [3]}',
    '{"id": @ID, "lengths": @L(true)}', '{"id": @ID, "lengths": [1, null]}', '{"id": @ID, "lengths": @L(NaN)}',
    '{"id": @ID, "lengths": @L(Infinity)}', '{"id": @ID, "lengths": @L(-Infinity)}', '{"id": @ID, "lengths": @L(' + "9" * 5000 + ")}",
    '{"id": @ID, "lengths": @L(-1)}', '{"id": @ID, "lengths": @L(10000001)}', '{"id": @ID, "lengths": @L(1e400)}',
    '{"id": @ID, "lengths": @L(-0)}', '{"id": @ID, "lengths": @L(-0.0)}', '{"id": @ID, "lengths": @L(-1e-400)}',
    '{"id": @ID, "lengths": @L(0.1)}', '{"id": @ID, "lengths": @L(1E2)}', '{"id": @ID, "lengths": @L(5.0)}',
    '{"id": @ID, "lengths": @LEN, "lengths": @LEN}', '{"id": @ID, "l\\u0065ngths": @LEN}',
    '{"id": @ID, "lengths": @LEN, "l\\u0065ngths": @LEN}',
    # other fields (hypothesis raises the recursion limit to 2048: json.loads fails short of 5000 levels still)
    '{"id": @ID, "lengths": @LEN, "x": NaN}', '{"id": @ID, "lengths": @LEN, "x": -NaN}', '{"id": @ID, "lengths": @LEN, "x": Inf}',
    '{"id": @ID, "lengths": @LEN, "x": [-Inf]}', '{"id": @ID, "lengths": @LEN, "x": -Infinity}',
    '{"id": @ID, "lengths": @LEN, "x": ' + "[" * 5000 + "]" * 5000 + "}",
    '{"id": @ID, "lengths": @LEN, "x": ' + "[" * 150 + "]" * 150 + "}", '{"id": @ID, "lengths": @LEN,}',
    '{"id": @ID, "lengths": @LEN, "x": "a\\u0000b"}', '{"id": @ID, "lengths": @LEN, "x": "a, Inf"}',
    '{"id": @ID, "lengths": @LEN, "x": "\t"}', '{"id": @ID, "lengths": @LEN, "x": 01}', '{"id": @ID, "lengths": @LEN, "x": [1,]}',
    '{"id": @ID, "lengths": @LEN} // note', "{'id': @ID, 'lengths': @LEN}", '{"id": @ID, "lengths": @LEN, "x": {"k": 1, "k": 2}}',
    # lines
    '{"id": @ID, "lengths": @LEN}{"id": @ID, "lengths": @LEN}', '{"id": @ID,\n"lengths": @LEN}',
    '{"id": @ID,\n"lengths": @LEN}{"id": @ID, "lengths": @LEN}', '{"id": @ID, "lengths": @LEN}\r{"id": @ID, "lengths": @LEN}',
    "  ", "\t", "", "\x0c", "\u3000", '\ufeff{"id": @ID, "lengths": @LEN}', "garbage", '{"id": @ID, "lengths": @LEN} ',
    ' {"id": @ID, "lengths": @LEN}', '{"id": @ID, "lengths": @LEN}\x00', "null", "3", "[1, 2]", '"z"',
]  # fmt: skip


@st.composite
def _files(draw, flaw: str | None = None) -> tuple[bytes, bool]:
    """A JSON-lines file, and whether every row is one the fast path must read itself (``flaw``: one row so)."""
    ids = st.sampled_from(_STR_IDS if draw(st.booleans()) else _INT_IDS)
    listed = draw(st.booleans())
    lens = st.lists(_NUM, min_size=1, max_size=4) if listed else _NUM
    ascii_only, spaced = draw(st.booleans()), draw(st.booleans())

    def clean() -> bytes:
        extra = draw(st.dictionaries(st.sampled_from(["prompt", "x", "ID", "lengths_"]), _JSON, max_size=2))
        fields = [("id", draw(ids)), ("lengths", draw(lens)), *extra.items()]
        order = draw(st.permutations(fields))
        seps = (", ", ": ") if spaced else (",", ":")
        return json.dumps(dict(order), ensure_ascii=ascii_only, separators=seps).encode()

    def flawed() -> bytes:
        text = flaw if flaw is not None else draw(st.sampled_from(_BAD))
        text = re.sub(r"@L\((.*?)\)", lambda m: f"[{m[1]}]" if listed else m[1], text)
        text = re.sub("@ID", lambda _: json.dumps(draw(ids)), text)
        return re.sub("@LEN", lambda _: json.dumps(draw(lens)), text).encode("utf-8", "surrogatepass")

    lines = [clean() for _ in range(draw(st.integers(1, 8)))]
    tidy = flaw is None
    if flaw is not None:
        lines.insert(draw(st.integers(0, len(lines))), flawed())
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(lines)))
        kind = draw(st.sampled_from(["blank", "flawed", "flawed", "bytes"]))
        if kind == "blank":
            lines.insert(at, draw(st.sampled_from([b"", b"  ", b"\r", b"\t "])))
        else:
            tidy = False
            bad = flawed()
            lines.insert(at, bad if kind == "flawed" else bad + draw(st.sampled_from([b"\xff", b"\xed\xa0\x80", b"\xc0\x80"])))
    eol = draw(st.sampled_from([b"\n", b"\r\n"]))
    data = eol.join(lines) + (eol if draw(st.booleans()) else b"")
    if draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data
    return data, tidy


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_files())
def test_same_as_the_row_reader(tmp_path, file):
    data, tidy = file
    taken = _check(_write(tmp_path, data), length_field="lengths")
    if tidy:
        assert taken, data[:300]


# Drawn from the list above, each flaw came up a few times in hundreds of files: here each has its own.
@pytest.mark.parametrize("flaw", _BAD, ids=range(len(_BAD)))
def test_same_as_the_row_reader_with_each_flaw(tmp_path, flaw):
    @settings(max_examples=12, deadline=None, database=None)
    @given(_files(flaw))
    def check(file):
        _check(_write(tmp_path, file[0]), length_field="lengths")

    check()


# -- each tricky case on its own ------------------------------------------------------------------------------

# (rows, whether the fast path reads the file itself)
CASES = {
    "plain": ([A, B], True),
    "repeated ids accumulate in file order": ([A, B, '{"id": "a", "lengths": 9}'.replace("9", "[9, 1]")], True),
    "int ids as str": (['{"id": 7, "lengths": 1}', '{"id": -3, "lengths": 2}', '{"id": 7, "lengths": 3}'], True),
    "int64 bounds": ([f'{{"id": {2**63 - 1}, "lengths": 1}}', f'{{"id": {-(2**63)}, "lengths": 1}}'], True),
    "id past int64": ([f'{{"id": {2**63}, "lengths": 1}}'], False),
    "id of 5000 digits": (['{"id": ' + "9" * 5000 + ', "lengths": 1}'], False),
    "str and int ids mixed": (['{"id": "1", "lengths": 1}', '{"id": 1, "lengths": 2}'], False),
    "int and str ids mixed": (['{"id": 1, "lengths": 1}', '{"id": "1", "lengths": 2}'], False),
    "float id": (['{"id": 1.0, "lengths": 1}'], False),
    "bool id": (['{"id": true, "lengths": 1}'], False),
    "null id": ([A, '{"id": null, "lengths": 1}'], False),
    "missing id": ([A, '{"lengths": 1}'], False),
    "object id": (['{"id": {}, "lengths": 1}'], False),
    "empty and odd string ids": (['{"id": "", "lengths": 1}', '{"id": " \\u2028", "lengths": 2}', '{"id": "a\\u0000", "lengths": 3}'], True),
    "surrogate pair escaped": (['{"id": "\\ud83d\\ude00", "lengths": 1}', '{"id": "😀", "lengths": 2}'], True),
    "lone surrogate id": ([A, '{"id": "\\ud800", "lengths": 1}'], False),
    "numbers and lists": ([A, '{"id": "c", "lengths": 4}'], False),
    "numbers then lists": (['{"id": "c", "lengths": 4}', A], False),
    "ints and floats": (['{"id": "c", "lengths": 4}', '{"id": "d", "lengths": 4.5}'], True),
    "float texts": (['{"id": "c", "lengths": [1e2, 5.0, 0.1, 1E2, 2.5e-3, 0.30000000000000004, 1e-400, 123456.78901234567890123]}'], True),
    "minus zero integer": (['{"id": "c", "lengths": [1, -0]}'], False),
    "minus zero float": (['{"id": "c", "lengths": -0.0}'], False),
    "bool length": ([A, '{"id": "c", "lengths": [1, true]}'], False),
    "null length": ([A, '{"id": "c", "lengths": null}'], False),
    "null in list": ([A, '{"id": "c", "lengths": [1, null]}'], False),
    "string length": ([A, '{"id": "c", "lengths": ["3"]}'], False),
    "nested list": ([A, '{"id": "c", "lengths": [[3]]}'], False),
    "empty list": ([A, '{"id": "c", "lengths": []}'], False),
    "missing length": ([A, '{"id": "c"}'], False),
    "NaN length": ([A, '{"id": "c", "lengths": [NaN]}'], False),
    "Infinity length": ([A, '{"id": "c", "lengths": [Infinity]}'], False),
    "huge int length": ([A, '{"id": "c", "lengths": [' + "9" * 5000 + "]}"], False),
    "huge exponent length": ([A, '{"id": "c", "lengths": [1e400]}'], False),
    "negative length": ([A, '{"id": "c", "lengths": [-1]}'], False),
    "length past MAX_LENGTH": ([A, '{"id": "c", "lengths": [10000001]}'], False),
    "length at MAX_LENGTH": ([A, '{"id": "c", "lengths": [10000000, 0]}'], True),
    "NaN elsewhere (json.loads reads it)": ([A, '{"id": "c", "lengths": [1], "x": [NaN, Infinity, -Infinity]}'], True),
    "-NaN elsewhere": ([A, '{"id": "c", "lengths": [1], "x": -NaN}'], False),
    "Inf elsewhere": ([A, '{"id": "c", "lengths": [1], "x": Inf}'], False),
    "-Inf elsewhere": ([A, '{"id": "c", "lengths": [1], "x": {"y": [0, -Inf]}}'], False),
    "Inf spaced far": ([A, '{"id": "c", "lengths": [1], "x":' + " " * 100 + "Inf}"], False),
    "Inf in a string": ([A, '{"id": "c", "lengths": [1], "x": "Information: Infinity"}'], True),
    "key twice": (['{"id": "c", "lengths": [1], "lengths": [2, 3]}'], False),
    "id twice": (['{"id": "c", "id": "d", "lengths": [1]}'], False),
    "key escaped": (['{"\\u0069d": "c", "l\\u0065ngths": [1]}'], True),
    "key twice, once escaped": (['{"id": "c", "lengths": [1], "l\\u0065ngths": [2]}'], False),
    "other keys twice": (['{"id": "c", "lengths": [1], "x": 1, "x": {"y": 1, "y": 2}}'], True),
    "other fields of any type": (['{"prompt": [{"role": "user", "content": "hi"}], "id": "c", "lengths": [1], "n": null, "b": true, "f": 1.5, "big": ' + "9" * 5000 + ', "o": {"id": 5, "lengths": "x"}}'], True),
    "unparsable line later": ([A, B, '{"id": "c", "lengths": [1],}'], False),
    "comment": ([A, '{"id": "c", "lengths": [1]} // note'], False),
    "single quotes": ([A, "{'id': 'c', 'lengths': [1]}"], False),
    "leading zero elsewhere": ([A, '{"id": "c", "lengths": [1], "x": 01}'], False),
    "control character in a string": ([A, '{"id": "c", "lengths": [1], "x": "a\tb"}'], False),
    "two objects on one line": ([A, B + B.replace('"b"', '"c"')], False),
    "two objects and a blank line": ([A, B + B.replace('"b"', '"c"'), ""], False),
    "object over two lines": ([A, '{"id": "c",', '"lengths": [1]}'], False),
    "over two lines, two on one": ([A, '{"id": "c",', '"lengths": [1]}' + B], False),
    "non-object line": ([A, "[1, 2]"], False),
    "null line": ([A, "null"], False),
    "blank lines": (["", A, "  ", "\t", B, ""], True),
    "form feed line": ([A, "\x0c", B], False),
    "padded lines": ([" " + A + " ", "\t" + B], True),
    "CR before a brace": ([A + "\r" + B], False),
    "BOM on a later line": ([A, "\ufeff" + B], False),
    "deep elsewhere": ([A, '{"id": "c", "lengths": [1], "x": ' + "[" * 150 + "]" * 150 + "}"], False),
    "deep past json.loads": ([A, '{"id": "c", "lengths": [1], "x": ' + "[" * 5000 + "]" * 5000 + "}"], False),
    "many brackets, shallow": ([A, '{"id": "c", "lengths": [1], "x": [' + ", ".join(["[]"] * 300) + "], \"s\": \"" + "[" * 300 + '"}'], True),
    "brackets in a string": ([A, '{"id": "c", "lengths": [1], "x": "' + "[{" * 200 + '\\"' + '"}'], True),
}  # fmt: skip


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
@pytest.mark.parametrize("name", list(CASES))
def test_case(tmp_path, name, eol):
    lines, fast = CASES[name]
    taken = _check(_write(tmp_path, _rows(*lines, end=eol)), length_field="lengths")
    assert taken == fast


def _long(mib: int) -> bytes:
    return b'{"id": "c", "lengths": [1], "x": "' + b"y" * (mib << 20) + b'"}\n'


@pytest.mark.parametrize(
    ("data", "fast"),
    [
        pytest.param(b"", False, id="empty"),
        pytest.param(b"\n \n\r\n", False, id="blank lines only"),
        pytest.param(b"\xef\xbb\xbf", False, id="a BOM only"),
        pytest.param(_rows(A, B) + b'{"id": "c", "lengths": [1]}', True, id="no newline at the end"),
        pytest.param(b"\xef\xbb\xbf" + _rows(A, B), True, id="BOM"),
        pytest.param(b"\xef\xbb\xbf\xef\xbb\xbf" + _rows(A, B), False, id="two BOMs"),
        pytest.param(_rows(A) + b'{"id": "c\xff", "lengths": [1]}\n', False, id="invalid UTF-8"),
        pytest.param(_rows(A) + b'{"id": "c\xed\xa0\x80", "lengths": [1]}\n', False, id="an encoded surrogate"),
        pytest.param(_rows(A) + b'{"id": "c", "lengths": [1]}\x00\n', False, id="a NUL byte"),
        pytest.param(b"PAR1" + _rows(A), False, id="Parquet magic"),
        # pyarrow reads a line up to about twice its 8 MiB block, and fails past that: either way, the same lengths.
        pytest.param(_rows(A) + _long(9) + _rows(B), None, id="a line past 8 MiB"),
        pytest.param(_rows(A) + _long(20) + _rows(B), False, id="a line past 16 MiB"),
    ],
)
def test_file_shapes(tmp_path, data, fast):
    taken = _check(_write(tmp_path, data), length_field="lengths")
    assert fast is None or taken == fast


def test_ids_missing_from_the_first_mib(tmp_path):
    body = _rows(*['{"x": "' + "y" * 1000 + '", "lengths": [1]}'] * 1500) + _rows(A)
    assert not _check(_write(tmp_path, body), length_field="lengths")
    body = _rows(A) + _rows(*['{"x": "' + "y" * 1000 + '", "lengths": [1]}'] * 1500) + _rows(B)
    assert not _check(_write(tmp_path, body), length_field="lengths")


@pytest.mark.parametrize(
    "kw",
    [
        {"id_field": "n", "length_field": "n"},  # the id is its own length: the row reader alone
        {"id_field": "a/b", "length_field": "c.d"},
        {"id_field": "é", "length_field": "lengths"},
        {"id_field": "id", "length_field": "lengths", "own_id_field": False},
    ],
)
def test_field_names(tmp_path, kw):
    rows = [{"n": 3, "a/b": "x", "c.d": [1, 2], "é": 4, "id": "q", "lengths": 5}, {"n": 4, "a/b": "y", "c.d": 2,
            "é": 5, "id": "r", "lengths": 6}]  # fmt: skip
    path = _write(tmp_path, _rows(*map(json.dumps, rows)))
    taken = _check(path, **kw)
    assert taken == (kw["id_field"] != kw["length_field"] and kw["length_field"] != "c.d")


def test_large_file_values_by_row(tmp_path):
    rng = np.random.default_rng(0)
    ids = [f"p{i % 5000}" for i in range(20000)]
    lens = rng.integers(0, 5000, size=(20000, 3)).tolist()
    path = _write(tmp_path, _rows(*(json.dumps({"id": i, "prompt": "q", "lengths": v}) for i, v in zip(ids, lens, strict=True))))
    assert _check(path, length_field="lengths")
    got = L.read_lengths(path, length_field="lengths")
    assert list(got) == [f"p{i}" for i in range(5000)]
    want = np.array(lens, dtype=np.float64).reshape(4, 5000, 3).transpose(1, 0, 2).reshape(5000, 12)
    assert all(np.array_equal(got[f"p{i}"], want[i]) for i in range(5000))
