"""verl export: struct fields in the data's key order, whatever pyarrow's inference would pick.

pyarrow before 24 infers a struct's fields in sorted key order (``struct<content, role>`` for a chat
message), later ones in first-seen order, so the same export wrote different Parquet by pyarrow version.
The export gives every struct type itself (first-seen key order), so inference never picks the order.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.cli import main
from aspc.errors import InputError
from aspc.export import export_plan
from aspc.export.source import ordered_type
from tests.conftest import write_jsonl


def _compile(src, plan):
    r = CliRunner().invoke(main, ["compile", str(src), "--length-field", "len", "-o", str(plan), "-q"],
                           catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 0, r.output


def _names(t: pa.DataType) -> list[str]:
    return [f.name for f in t]


def test_ordered_type_keeps_first_seen_key_order_not_sorted():
    values = [{"content": "a", "role": "user"}, {"role": "tool", "zeta": 1, "alpha": {"y": 1.5, "b": None}}]
    t = ordered_type(values)
    assert t is not None  # given explicitly: pa.array does not infer the struct
    assert _names(t) == ["content", "role", "zeta", "alpha"]
    assert _names(t.field("alpha").type) == ["y", "b"]
    arr = pa.array(values, t)
    assert arr.type == t and arr.to_pylist()[1]["alpha"] == {"y": 1.5, "b": None}
    # Lists of dicts, nested: each struct in the order its keys were first seen.
    t = ordered_type([[{"type": "function", "id": "t1", "function": {"name": "f", "arguments": "{}"}}], None, []])
    assert pa.types.is_list(t)
    assert _names(t.value_type) == ["type", "id", "function"]
    assert _names(t.value_type.field("function").type) == ["name", "arguments"]


def test_ordered_type_leaves_dictless_and_unholdable_values_to_pyarrow():
    assert ordered_type(["a", None, "b"]) is None
    assert ordered_type([[1, 2], [3.5]]) is None
    # No one type holds these: pa.array infers, and raises its own error (the messages quote it).
    assert ordered_type([{"w": 1}, {"w": "s"}]) is None
    assert ordered_type([{"w": 1}, {"w": True}]) is None
    assert ordered_type([{"w": 1}, "text"]) is None
    assert ordered_type([{"w": [1]}, {"w": {"x": 1}}]) is None


_KEYS = st.sampled_from(["role", "content", "name", "b", "a", "zz"])
_LEAF = st.one_of(st.none(), st.integers(-5, 5), st.floats(allow_nan=False, width=32), st.text(max_size=3),
                  st.booleans())  # fmt: skip
_JSON = st.recursive(_LEAF, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(_KEYS, c, max_size=4)),
                     max_leaves=12)  # fmt: skip


@pytest.mark.skipif(int(pa.__version__.split(".")[0]) < 24, reason="pyarrow < 24 infers struct fields sorted")
@settings(max_examples=300, deadline=None)
@given(st.lists(_JSON, max_size=5))
def test_ordered_type_is_what_first_seen_inference_gives(values):
    """Where pyarrow infers in first-seen order (>= 24), the given type is exactly the inferred one."""
    try:
        inferred = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        assert ordered_type(values) is None
        return
    got = pa.array(values, ordered_type(values))
    assert got.type == inferred.type
    assert got.equals(inferred)


def test_tool_call_chat_export_writes_message_fields_in_key_order(tmp_path):
    chat = [{"role": "user", "content": "hi", "name": "bob"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "t1",
                                                                  "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "content": "42", "tool_call_id": "t1"}]  # fmt: skip
    src = write_jsonl(tmp_path / "tc.jsonl", [{"id": "a", "messages": chat, "len": 9},
                                              {"id": "b", "messages": [{"role": "user", "content": "x"}], "len": 5}])
    _compile(src, tmp_path / "plan.parquet")
    export_plan(tmp_path / "plan.parquet", tmp_path / "train.parquet")
    message = pq.read_schema(tmp_path / "train.parquet").field("prompt").type.value_type
    assert _names(message) == ["role", "content", "name", "tool_calls", "tool_call_id"]
    call = message.field("tool_calls").type.value_type
    assert _names(call) == ["type", "id", "function"]
    assert _names(call.field("function").type) == ["name", "arguments"]


def test_a_jsonl_source_in_verl_layout_keeps_its_key_order(tmp_path):
    """The source's own chat column (kept) and struct columns: role before content, as verl writes them."""
    recs = [{"data_source": "d", "prompt": [{"role": "user", "content": f"q{i}"}], "len": 3 + i,
             "reward_model": {"style": "rule", "ground_truth": str(i)}, "extra_info": {"split": "train", "index": i}}
            for i in range(6)]  # fmt: skip
    src = write_jsonl(tmp_path / "verl.jsonl", recs)
    _compile(src, tmp_path / "plan.parquet")
    export_plan(tmp_path / "plan.parquet", tmp_path / "train.parquet", source=src)
    schema = pq.read_schema(tmp_path / "train.parquet")
    assert _names(schema.field("prompt").type.value_type) == ["role", "content"]
    assert _names(schema.field("reward_model").type) == ["style", "ground_truth"]
    assert _names(schema.field("extra_info").type) == ["split", "index", "aspc"]
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert sorted(r["prompt"][0]["content"] for r in rows) == sorted(r["prompt"][0]["content"] for r in recs)


def test_chat_keys_of_mixed_types_still_get_the_same_message(tmp_path):
    src = write_jsonl(tmp_path / "bad.jsonl", [{"id": "a", "messages": [{"role": "user", "content": "x", "w": 1}], "len": 5},
                                               {"id": "b", "messages": [{"role": "user", "content": "y", "w": "s"}], "len": 6}])  # fmt: skip
    _compile(src, tmp_path / "plan.parquet")
    with pytest.raises(InputError) as err:
        export_plan(tmp_path / "plan.parquet", tmp_path / "train.parquet", use_source=False)
    assert str(err.value).startswith("the chats' message keys hold values of different types across messages (")
    assert str(err.value).endswith("); export --format jsonl, which keeps each message as it is")
    assert not (tmp_path / "train.parquet").exists()
