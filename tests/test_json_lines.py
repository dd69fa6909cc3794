"""The byte scan that says whether pyarrow.json reads JSON lines as json.loads does (aspc.io.json_lines)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.json as pj
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.io.json_lines import MAX_DEPTH, read_alike

_FLOATS = st.floats(allow_nan=True, allow_infinity=True)
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), _FLOATS, st.text(max_size=8))
_VALUES = st.recursive(
    _SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=12,
)
_OBJECTS = st.dictionaries(st.text(max_size=6), _VALUES, max_size=4)
_PIECES = st.sampled_from(
    ['{"a": 1}', "{}", "null", "[1]", "1", '"s"', "Inf", "-Inf", "NaN", "-NaN", "Infinity", "-Infinity", "{", "}",
     "[", "]", ",", ":", " ", "\t", "\r", "\n", '"', "\\", "\0", '{"b": ', '"x\\"y"', "\u00e9", "-", "0", "In", "Na"]
)


def _json_loads_reads_alike(data: bytes) -> bool:
    """The oracle: every line that is not JSON whitespace is one object json.loads reads, nested at most MAX_DEPTH."""
    for line in data.split(b"\n"):
        if not line.strip(b" \t\r"):
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            return False
        if not isinstance(rec, dict) or _depth(rec) > MAX_DEPTH:
            return False
    return True


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(st.lists(_OBJECTS, min_size=1, max_size=6), st.lists(st.sampled_from(["\n", "\r\n", "\n\n", "\n  \n"]),
                                                            min_size=6, max_size=6))  # fmt: skip
def test_lines_json_dumps_writes_are_read_alike(objs, ends):
    # No false alarm on clean files, NaN and Infinity included (json.dumps writes them; json.loads reads them):
    # each would send a whole file row by row.
    data = "".join(json.dumps(o, ensure_ascii=bool(i % 2)) + ends[i] for i, o in enumerate(objs)).encode()
    assert read_alike(data)


@settings(max_examples=2000, deadline=None)
@given(st.lists(_PIECES, max_size=24))
def test_whatever_pyarrow_then_parses_json_loads_reads_alike(pieces):
    # Soundness: where the scan says yes and pyarrow parses the file, json.loads reads every line as one object.
    data = "".join(pieces).encode()
    if not read_alike(data):
        return
    try:
        tab = pj.read_json(pa.BufferReader(data))
    except (pa.ArrowInvalid, ValueError):
        return
    assert _json_loads_reads_alike(data)
    assert len(tab) == sum(1 for line in data.split(b"\n") if line.strip(b" \t\r"))


def test_each_leniency_of_pyarrow_is_caught():
    for bad in [b'{"a": Inf}', b'{"a": -Inf}', b'{"a": -NaN}', b'{"a": - NaN}', b'{"a": 1}{"b": 2}', b'{"a":\n1}',
                b"null", b"[1]", b'{"a": "\0"}', b'{"a": 1} x', b'{"a": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}"]:  # fmt: skip
        assert not read_alike(bad + b"\n"), bad
    for good in [b'{"a": NaN, "b": -Infinity, "c": Infinity}', b'{"a": "Inf -NaN [[[["}', b"{}", b" {} \r",
                 b'{"a": ' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}"]:  # fmt: skip
        assert read_alike(good + b"\n"), good
        assert _json_loads_reads_alike(good + b"\n"), good
