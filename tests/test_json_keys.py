"""The chat-key scan against json.loads: every key inside the named top-level fields, at any depth."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.io.json_keys import only_keys_in

FIELDS, KEYS = ["prompt", "messages"], ["role", "content"]
# Names that collide with the fields and keys, nearly collide, or need escapes in JSON.
_NAME = st.sampled_from(["role", "content", "prompt", "messages", "name", "rolex", "rol", "", "é", 'a"b', "a\\b",
                         "a:b", "{", "]", "\n", "😀"])  # fmt: skip
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=4), _NAME)
_VALUE = st.recursive(_SCALAR, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                      st.dictionaries(_NAME, kids, max_size=3)), max_leaves=12)  # fmt: skip


def _keys_within(value, out):
    if isinstance(value, dict):
        for k, v in value.items():
            out.append(k)
            _keys_within(v, out)
    elif isinstance(value, list):
        for v in value:
            _keys_within(v, out)


def _expected(records, ensure_ascii):
    for rec in records:
        for k, v in rec.items():
            if "\\" in json.dumps(k, ensure_ascii=ensure_ascii):
                return False  # a top-level key with an escape could spell a field's name
            if k in FIELDS:
                inner = []
                _keys_within(v, inner)
                if any(x not in KEYS for x in inner):
                    return False
    return True


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(_NAME, _VALUE, max_size=4), min_size=1, max_size=5), st.booleans(),
       st.sampled_from([(",", ":"), (", ", ": "), (" ,", " :")]))  # fmt: skip
def test_the_scan_answers_as_json_loads_does(records, ensure_ascii, separators):
    data = "".join(json.dumps(r, ensure_ascii=ensure_ascii, separators=separators) + "\n" for r in records)
    assert only_keys_in(data.encode(), FIELDS, KEYS) == _expected(records, ensure_ascii)


def test_what_a_chat_message_may_hold():
    def ok(line):
        return only_keys_in(line.encode() + b"\n", FIELDS, KEYS)

    assert ok('{"prompt": [{"role": "user", "content": "a \\"name\\": b, {c}"}], "x": {"name": 1}}')
    assert not ok('{"prompt": [{"role": "user", "content": "a", "name": "bob"}]}')
    assert not ok('{"id": 1, "messages": [{"role": "user", "content": "a"}, {"role": "x", "tool_calls": []}]}')
    assert not ok('{"pr\\u006fmpt": [{"role": "user", "content": "a", "name": "b"}]}')
    assert not ok('{"prompt": [{"r\\u006fle": "user", "content": "a"}]}')
    # Lines are independent: an unterminated line does not carry its state into the next.
    assert ok('{"x": "open\n{"prompt": [{"role": "user", "content": "a"}]}')


def test_names_json_would_escape_are_never_vouched_for():
    assert not only_keys_in(b'{"a\\"b": [{"role": 1}]}\n', ['a"b'], KEYS)
