"""``aspc export``: verl Parquet and JSONL in dispatch order, and the round trip through compile."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.emit import read_plan
from aspc.emit import schema as S
from aspc.errors import ConfigError
from aspc.export import chat_messages, export_plan
from aspc.io import read_prompts
from tests.conftest import lognormal_records, write_jsonl

COMPILE = ["--length-field", "lengths", "--batch-size", "8", "--slack", "2", "--group-size", "4"]
ASPC_INFO = ("prompt_id", "minibatch", "group", "dispatch_rank", "n_samples", "predicted_len")


def _cli(args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _compile(src, out, *extra):
    r = _cli(["compile", src, *COMPILE, *extra, "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    return read_plan(out)


@pytest.fixture
def text_data(tmp_path):
    recs = lognormal_records(120, seed=1)
    for i, rec in enumerate(recs):
        rec["reward_model"] = {"style": "rule", "ground_truth": str(i)}
        rec["ability"] = "math"
    return write_jsonl(tmp_path / "text.jsonl", recs)


@pytest.fixture
def chat_data(tmp_path):
    recs = lognormal_records(60, seed=2)
    for rec in recs:
        rec["prompt"] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": rec["prompt"]}]
    return write_jsonl(tmp_path / "chat.jsonl", recs)


def test_verl_contract(tmp_path, text_data):
    plan = _compile(text_data, tmp_path / "plan.parquet", "-n", "4")
    out = tmp_path / "train.parquet"
    r = _cli(["export", tmp_path / "plan.parquet", "--format", "verl", "-o", out, "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["rows"] == plan.n_rows and got["n_samples"] == 4
    assert "data.shuffle=False" in got["verl_overrides"]
    assert "actor_rollout_ref.rollout.n=4" in got["verl_overrides"]

    table = pq.read_table(out)
    assert table.num_rows == plan.n_rows
    assert table.schema.field("prompt").type == pa.list_(
        pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])
    )
    rows = table.to_pylist()
    ids = plan.column(S.PROMPT_ID).tolist()
    texts = plan.column(S.PROMPT).tolist()
    assert [row["id"] for row in rows] == ids  # one row per plan row, in dispatch order
    for i, row in enumerate(rows):
        assert row["prompt"] == [{"role": "user", "content": texts[i]}]
        assert row["data_source"] == "aspc"
        info = row["extra_info"]
        assert info["index"] == info["dispatch_rank"] == i and info["split"] == "train"
        for key in ASPC_INFO:
            assert info[key] == pytest.approx(plan.column(key)[i]), key


def test_chat_prompts_round_trip_exactly(tmp_path, chat_data):
    plan = _compile(chat_data, tmp_path / "plan.parquet")
    res = export_plan(tmp_path / "plan.parquet", tmp_path / "train.parquet")
    rows = pq.read_table(res.path).to_pylist()
    for row, stored in zip(rows, plan.column(S.PROMPT).tolist(), strict=True):
        assert row["prompt"][0] == {"role": "system", "content": "Be brief."}
        assert json.dumps(row["prompt"], ensure_ascii=False, separators=(",", ":")) == stored
    # verl-style Parquet back through the reader: same ids, same stored prompts, dispatch order.
    back = read_prompts(res.path)
    assert back.ids == plan.column(S.PROMPT_ID).tolist()
    assert back.prompts == plan.column(S.PROMPT).tolist()


def test_chat_detection_is_exact():
    assert chat_messages('[{"role":"user","content":"hi"}]') == [{"role": "user", "content": "hi"}]
    assert chat_messages("plain text") is None
    assert chat_messages('[{"role": "user", "content": "hi"}]') is None  # not aspc's compact form: text
    assert chat_messages('[{"role":"robot","content":"hi"}]') is None
    assert chat_messages('[{"role":"user","content":"hi","x":1}]') is None
    assert chat_messages('[{"role":"user","content":"hi"}') is None


def test_round_trip_through_compile_keeps_order_and_ids(tmp_path, text_data):
    """Sorted plan → verl export (with --source lengths) → compile --strategy sorted: same order, same ids."""
    plan = _compile(text_data, tmp_path / "plan.parquet", "--strategy", "sorted")
    out = tmp_path / "train.parquet"
    r = _cli(["export", tmp_path / "plan.parquet", "-o", out, "--source", text_data, "-q"])
    assert r.exit_code == 0 and r.stdout == ""
    rows = pq.read_table(out).to_pylist()
    assert rows[0]["reward_model"]["style"] == "rule" and rows[0]["ability"] == "math"
    again = _compile(out, tmp_path / "again.parquet", "--strategy", "sorted")
    assert again.column(S.PROMPT_ID).tolist() == plan.column(S.PROMPT_ID).tolist()
    assert again.column(S.MINIBATCH).tolist() == plan.column(S.MINIBATCH).tolist()
    # asp plans too: the exported rows are read back in dispatch order with the same ids.
    _compile(text_data, tmp_path / "asp.parquet")
    res = export_plan(tmp_path / "asp.parquet", tmp_path / "asp_train.parquet", source=text_data)
    asp = read_plan(tmp_path / "asp.parquet")
    back = _compile(res.path, tmp_path / "asp_again.parquet")
    assert sorted(back.column(S.PROMPT_ID).tolist()) == sorted(asp.column(S.PROMPT_ID).tolist())
    assert read_prompts(res.path).ids == asp.column(S.PROMPT_ID).tolist()


def test_jsonl_export(tmp_path, chat_data, text_data):
    plan = _compile(text_data, tmp_path / "plan.parquet")
    out = tmp_path / "train.jsonl"
    r = _cli(["export", tmp_path / "plan.parquet", "--format", "jsonl", "-o", out, "--data-source", "gsm8k"])
    assert r.exit_code == 0, r.output
    recs = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [x["id"] for x in recs] == plan.column(S.PROMPT_ID).tolist()
    assert [x["prompt"] for x in recs] == plan.column(S.PROMPT).tolist()  # text stays text
    assert all(x["data_source"] == "gsm8k" for x in recs)
    assert [x["extra_info"]["group"] for x in recs] == plan.column(S.GROUP).tolist()
    # Chat prompts stay chat lists; compile reads the JSONL back to the same stored prompts.
    chat = _compile(chat_data, tmp_path / "chat.parquet")
    res = export_plan(tmp_path / "chat.parquet", tmp_path / "chat.jsonl", "jsonl", source=chat_data)
    back = read_prompts(res.path)
    assert back.prompts == chat.column(S.PROMPT).tolist() and back.ids == chat.column(S.PROMPT_ID).tolist()


def test_train_batch_size_matches_equal_groups(tmp_path, text_data):
    # 120 prompts, minibatches of exactly 10, 3 per group: four groups of 30 prompts.
    args = ["--length-field", "lengths", "--batch-size", "10", "--slack", "0", "--group-size", "3", "-q"]
    assert _cli(["compile", text_data, *args, "-o", tmp_path / "eq.parquet"]).exit_code == 0
    res = export_plan(tmp_path / "eq.parquet", tmp_path / "eq_train.parquet")
    assert res.group_prompts == [30, 30, 30, 30] and res.train_batch_size == 30
    assert "data.train_batch_size=30" in res.verl_overrides()
    # Unequal groups: no batch size is suggested, and the command says how to get equal ones.
    plan = _compile(text_data, tmp_path / "uneq.parquet")
    counts = pa.table({"g": plan.column(S.GROUP)}).group_by("g").aggregate([("g", "count")]).column(1).to_pylist()
    assert len(set(counts)) > 1
    r = _cli(["export", tmp_path / "uneq.parquet", "-o", tmp_path / "uneq_train.parquet"])
    assert r.exit_code == 0 and "--slack 0" in r.stderr
    assert "data.train_batch_size" not in r.stdout and "data.shuffle=False" in r.stdout


def test_export_errors(tmp_path, text_data, chat_data):
    _compile(text_data, tmp_path / "plan.parquet")
    with pytest.raises(ConfigError):
        export_plan(tmp_path / "plan.parquet", tmp_path / "x.csv", "csv")
    assert not (tmp_path / "x.csv").exists()
    # --source must be the dataset the plan came from.
    r = _cli(["export", tmp_path / "plan.parquet", "-o", tmp_path / "t.parquet", "--source", chat_data])
    assert r.exit_code == 2 and "--source" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "t.parquet").exists()
    r = _cli(["export", tmp_path / "missing.parquet", "-o", tmp_path / "t.parquet"])
    assert r.exit_code == 2
