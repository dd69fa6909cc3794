"""``aspc export``: source columns kept unchanged, aspc keys under extra_info.aspc, verl overrides, round trips."""

from __future__ import annotations

import datetime
import decimal
import importlib.util
import json
import shlex
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.emit import read_plan
from aspc.emit import schema as S
from aspc.errors import ConfigError, InputError
from aspc.export import ASPC_FIELDS, _json_line, chat_messages, export_plan
from aspc.io import read_prompts
from tests.conftest import lognormal_records, write_jsonl
from tests.verl_data import write_gsm8k

COMPILE = ["--length-field", "lengths", "--batch-size", "8", "--slack", "2", "--group-size", "4"]
ASPC_INFO = tuple(f.name for f in ASPC_FIELDS)
VERL_KEYS = (
    "data.train_files",
    "data.shuffle",
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.filter_overlong_prompts",
    "data.train_max_samples",
    "actor_rollout_ref.rollout.n",
    "data.max_response_length",
)


def _cli(args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _compile(src, out, *extra, lengths=True):
    args = COMPILE if lengths else []
    r = _cli(["compile", src, *args, *extra, "-o", out, "-q"])
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


@pytest.fixture
def gsm8k(tmp_path):
    return write_gsm8k(tmp_path / "gsm8k.parquet", 256)


def test_verl_contract_keeps_every_source_column(tmp_path, gsm8k):
    """The issue's contract: compile --for verl, export --json; the five verl columns keep the user's values."""
    plan = _compile(
        gsm8k, tmp_path / "plan.parquet", "--for", "verl", "--max-response-length", "1024",
        "--max-prompt-length", "512", lengths=False,
    )
    out = tmp_path / "train.parquet"
    r = _cli(["export", tmp_path / "plan.parquet", "--format", "verl", "-o", out, "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    ov = got["overrides"]
    assert set(VERL_KEYS) <= set(ov)
    assert ov["data.shuffle"] is False and ov["data.filter_overlong_prompts"] is False
    assert ov["data.train_batch_size"] == 128 and ov["data.max_response_length"] == 1024
    assert ov["data.max_prompt_length"] == 512 and ov["actor_rollout_ref.rollout.n"] == 1
    assert any("gen_batch_size" in w for w in got["warnings"])
    assert any("val_files" in w for w in got["warnings"])
    assert got["rows"] == plan.n_rows == 256 and got["source"].endswith("gsm8k.parquet")

    src = pq.read_table(gsm8k)
    table = pq.read_table(out)
    assert table.column_names == src.column_names  # ids come from extra_info.index: no column added
    for col in ("data_source", "prompt", "ability", "reward_model"):
        assert table.schema.field(col).type == src.schema.field(col).type, col
    src_rows = src.to_pylist()
    rows = table.to_pylist()
    order = plan.column(S.SOURCE_ROW).tolist()
    for i, (row, r0) in enumerate(zip(rows, order, strict=True)):
        want = src_rows[r0]
        for col in ("data_source", "prompt", "ability", "reward_model"):
            assert row[col] == want[col], col
        info = dict(row["extra_info"])
        aspc = info.pop("aspc")
        assert info == want["extra_info"]  # index and split untouched
        assert aspc["dispatch_rank"] == i and aspc["prompt_id"] == plan.column(S.PROMPT_ID)[i]
        for key in ASPC_INFO:
            assert aspc[key] == pytest.approx(plan.column(key)[i]), key


def test_text_source_to_verl(tmp_path, text_data):
    plan = _compile(text_data, tmp_path / "plan.parquet", "-n", "4")
    r = _cli(["export", tmp_path / "plan.parquet", "-o", tmp_path / "train.parquet", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["overrides"]["actor_rollout_ref.rollout.n"] == 4
    assert any("NotImplementedError" in w for w in got["warnings"])  # no data_source of its own
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    texts = plan.column(S.PROMPT).tolist()
    assert [row["id"] for row in rows] == plan.column(S.PROMPT_ID).tolist()  # the source's own ids, dispatch order
    for i, row in enumerate(rows):
        assert row["prompt"] == [{"role": "user", "content": texts[i]}]
        assert row["data_source"] == "aspc"
        assert row["reward_model"]["style"] == "rule" and row["ability"] == "math"
        assert row["extra_info"]["index"] == plan.column(S.SOURCE_ROW)[i]
        assert row["extra_info"]["aspc"]["n_samples"] == 4


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_text_that_reads_as_chat_json_stays_text(tmp_path, suffix):
    # The plan stores a chat as compact JSON; a text prompt that is exactly such JSON was exported
    # as the chat it spells. The source says it is text.
    recs = lognormal_records(40, seed=5)
    look = [json.dumps([{"role": "user", "content": "Summarise this JSON"}], separators=(",", ":")),
            json.dumps([{"role": "system", "content": "a"}, {"role": "user", "content": "b"}], separators=(",", ":"))]
    recs[0]["prompt"], recs[1]["prompt"] = look  # fmt: skip
    src = write_jsonl(tmp_path / "src.jsonl", recs)
    if suffix == "parquet":
        pq.write_table(pa.Table.from_pylist(recs), tmp_path / "src.parquet")
        src = tmp_path / "src.parquet"
    _compile(src, tmp_path / "plan.parquet")
    assert _cli(["export", tmp_path / "plan.parquet", "-o", tmp_path / "t.parquet", "-q"]).exit_code == 0
    got = {row["id"]: row["prompt"] for row in pq.read_table(tmp_path / "t.parquet").to_pylist()}
    for rec in recs:
        assert got[rec["id"]] == [{"role": "user", "content": rec["prompt"]}]


def test_chat_prompts_round_trip_exactly(tmp_path, chat_data):
    plan = _compile(chat_data, tmp_path / "plan.parquet")
    res = export_plan(tmp_path / "plan.parquet", tmp_path / "train.parquet")
    rows = pq.read_table(res.path).to_pylist()
    for row, stored in zip(rows, plan.column(S.PROMPT).tolist(), strict=True):
        assert row["prompt"][0] == {"role": "system", "content": "Be brief."}
        assert json.dumps(row["prompt"], ensure_ascii=False, separators=(",", ":")) == stored
    back = read_prompts(res.path)
    assert back.ids == plan.column(S.PROMPT_ID).tolist()
    assert back.prompts == plan.column(S.PROMPT).tolist()


def test_chat_detection_is_exact():
    assert chat_messages('[{"role":"user","content":"hi"}]') == [{"role": "user", "content": "hi"}]
    assert chat_messages("plain text") is None
    assert chat_messages('[{"role": "user", "content": "hi"}]') is None  # not aspc's compact form: text
    assert chat_messages('[{"role":"robot","content":"hi"}]') is None
    # Keys beside role and content are kept (name, tool_calls): compile stores them since it reads them.
    assert chat_messages('[{"role":"user","content":"hi","x":1}]') == [{"role": "user", "content": "hi", "x": 1}]
    assert chat_messages('[{"role":"user","content":"hi"}') is None


def test_round_trip_through_compile_keeps_order_and_ids(tmp_path, text_data):
    """Sorted plan → verl export → compile --strategy sorted: same order, same ids."""
    plan = _compile(text_data, tmp_path / "plan.parquet", "--strategy", "sorted")
    out = tmp_path / "train.parquet"
    r = _cli(["export", tmp_path / "plan.parquet", "-o", out, "-q"])
    assert r.exit_code == 0 and r.stdout == ""
    again = _compile(out, tmp_path / "again.parquet", "--strategy", "sorted")
    assert again.column(S.PROMPT_ID).tolist() == plan.column(S.PROMPT_ID).tolist()
    assert again.column(S.MINIBATCH).tolist() == plan.column(S.MINIBATCH).tolist()
    asp = _compile(text_data, tmp_path / "asp.parquet")
    res = export_plan(tmp_path / "asp.parquet", tmp_path / "asp_train.parquet")
    assert read_prompts(res.path).ids == asp.column(S.PROMPT_ID).tolist()


def test_jsonl_export_keeps_records(tmp_path, chat_data, text_data):
    plan = _compile(text_data, tmp_path / "plan.parquet")
    out = tmp_path / "train.jsonl"
    r = _cli(["export", tmp_path / "plan.parquet", "--format", "jsonl", "-o", out, "--data-source", "gsm8k"])
    assert r.exit_code == 0, r.output
    recs = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    src = [json.loads(line) for line in text_data.read_text(encoding="utf-8").splitlines()]
    for rec, r0 in zip(recs, plan.column(S.SOURCE_ROW).tolist(), strict=True):
        aspc = rec["extra_info"].pop("aspc")
        assert rec.pop("data_source") == "gsm8k"
        assert rec.pop("extra_info") == {}
        assert rec == src[r0]  # every source field as it was
        assert aspc["prompt_id"] == src[r0]["id"]
    chat = _compile(chat_data, tmp_path / "chat.parquet")
    # Not chat.jsonl: that is the source dataset, and an export may not replace its input.
    res = export_plan(tmp_path / "chat.parquet", tmp_path / "chat-export.jsonl", "jsonl")
    back = read_prompts(res.path)
    assert back.prompts == chat.column(S.PROMPT).tolist() and back.ids == chat.column(S.PROMPT_ID).tolist()


def test_train_batch_size_matches_equal_groups(tmp_path, text_data):
    args = ["--length-field", "lengths", "--batch-size", "10", "--slack", "0", "--group-size", "3", "-q"]
    assert _cli(["compile", text_data, *args, "-o", tmp_path / "eq.parquet"]).exit_code == 0
    res = export_plan(tmp_path / "eq.parquet", tmp_path / "eq_train.parquet")
    assert res.group_prompts == [30, 30, 30, 30] and res.train_batch_size == 30
    assert "data.train_batch_size=30" in res.verl_overrides()
    plan = _compile(text_data, tmp_path / "uneq.parquet")
    counts = pa.table({"g": plan.column(S.GROUP)}).group_by("g").aggregate([("g", "count")]).column(1).to_pylist()
    assert len(set(counts)) > 1
    r = _cli(["export", tmp_path / "uneq.parquet", "-o", tmp_path / "uneq_train.parquet"])
    assert r.exit_code == 0 and "--for verl" in r.stderr
    assert "data.train_batch_size" not in r.stdout and "data.shuffle=False" in r.stdout


def test_source_is_found_by_hash_or_asked_for(tmp_path, gsm8k, monkeypatch):
    _compile(gsm8k, tmp_path / "plan.parquet", "--for", "verl", lengths=False)
    elsewhere = tmp_path / "plans"
    elsewhere.mkdir()
    shutil.move(tmp_path / "plan.parquet", elsewhere / "plan.parquet")
    # Not next to the plan: found in the working directory.
    monkeypatch.chdir(tmp_path)
    assert export_plan(elsewhere / "plan.parquet", tmp_path / "a.parquet").source.name == "gsm8k.parquet"
    # Renamed: found by its hash.
    gsm8k.rename(tmp_path / "renamed.parquet")
    assert export_plan(elsewhere / "plan.parquet", tmp_path / "b.parquet").source.name == "renamed.parquet"
    # Gone: one-line error asking for --source, nothing written.
    (tmp_path / "renamed.parquet").unlink()
    r = _cli(["export", elsewhere / "plan.parquet", "-o", tmp_path / "c.parquet"])
    assert r.exit_code == 2 and "--source" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "c.parquet").exists()
    # --no-source: aspc's columns only.
    r = _cli(["export", elsewhere / "plan.parquet", "-o", tmp_path / "d.parquet", "--no-source", "--data-source", "x"])
    assert r.exit_code == 0, r.output
    t = pq.read_table(tmp_path / "d.parquet")
    assert set(t.column_names) == {"prompt", "data_source", "extra_info", "id"}


def test_export_errors(tmp_path, text_data, chat_data):
    _compile(text_data, tmp_path / "plan.parquet")
    with pytest.raises(ConfigError):
        export_plan(tmp_path / "plan.parquet", tmp_path / "x.csv", "csv")
    assert not (tmp_path / "x.csv").exists()
    r = _cli(["export", tmp_path / "plan.parquet", "-o", tmp_path / "t.parquet", "--source", chat_data])
    assert r.exit_code == 2 and "--source" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "t.parquet").exists()
    r = _cli(["export", tmp_path / "missing.parquet", "-o", tmp_path / "t.parquet"])
    assert r.exit_code == 2
    # A source extra_info that already has an "aspc" key is never overwritten.
    recs = lognormal_records(40, seed=3)
    for rec in recs:
        rec["extra_info"] = {"aspc": "mine"}
    src = write_jsonl(tmp_path / "clash.jsonl", recs)
    _compile(src, tmp_path / "clash.parquet")
    with pytest.raises(InputError, match="aspc"):
        export_plan(tmp_path / "clash.parquet", tmp_path / "clash_train.parquet")
    assert not (tmp_path / "clash_train.parquet").exists()


@pytest.mark.parametrize("fmt", ["verl", "jsonl"])
def test_an_export_of_an_export_replaces_its_schedule(tmp_path, fmt):
    # Before: the second export refused the 'aspc' key its own first export had written ("rename it").
    src = write_jsonl(tmp_path / "in.jsonl", lognormal_records(40, seed=5))
    first_plan = _compile(src, tmp_path / "p1.parquet")
    first = tmp_path / f"e1.{'parquet' if fmt == 'verl' else 'jsonl'}"
    assert _cli(["export", tmp_path / "p1.parquet", "--format", fmt, "-o", first, "-q"]).exit_code == 0
    second_plan = _compile(first, tmp_path / "p2.parquet", "--strategy", "random")
    second = tmp_path / f"e2.{'parquet' if fmt == 'verl' else 'jsonl'}"
    r = _cli(["export", tmp_path / "p2.parquet", "--format", fmt, "-o", second, "-q"])
    assert r.exit_code == 0, r.output
    assert second_plan.column(S.PROMPT_ID).tolist() != first_plan.column(S.PROMPT_ID).tolist()  # another order
    if fmt == "verl":
        rows = pq.read_table(second).column("extra_info").to_pylist()
    else:
        rows = [json.loads(line)["extra_info"] for line in second.read_text().splitlines()]
    assert [r["aspc"]["prompt_id"] for r in rows] == second_plan.column(S.PROMPT_ID).tolist()
    assert [r["aspc"]["dispatch_rank"] for r in rows] == list(range(40))


@pytest.mark.parametrize(("field", "value", "where"), [
    ("big", 2**70, "'big'"), ("big", -(2**63) - 1, "'big'"), ("extra_info", {"n": [1, 2**64]}, "'extra_info.n[1]'"),
])  # fmt: skip
def test_a_jsonl_integer_beyond_int64_is_one_line_for_verl(tmp_path, field, value, where):
    # Before: OverflowError traceback from Arrow (JSON integers have no size limit; compile and jsonl take them).
    recs = lognormal_records(40, seed=6)
    for i, rec in enumerate(recs):
        rec[field] = value if i == 5 else ({"n": [1, 1]} if field == "extra_info" else 1)
    src = write_jsonl(tmp_path / "big.jsonl", recs)
    _compile(src, tmp_path / "plan.parquet")
    r = _cli(["export", tmp_path / "plan.parquet", "-o", tmp_path / "t.parquet"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "line 6" in r.output and where in r.output and "--format jsonl" in r.output and "string" in r.output
    assert not (tmp_path / "t.parquet").exists()
    assert _cli(["export", tmp_path / "plan.parquet", "--format", "jsonl", "-o", tmp_path / "t.jsonl", "-q"]).exit_code == 0


_UTC = datetime.timezone.utc


@pytest.mark.parametrize(("arrow", "value", "want"), [
    (pa.date32(), datetime.date(2024, 2, 29), "2024-02-29"),
    (pa.timestamp("us"), datetime.datetime(2024, 1, 2, 3, 4, 5, 6), "2024-01-02T03:04:05.000006"),
    (pa.timestamp("ms", tz="UTC"), datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=_UTC), "2024-01-02T03:04:05+00:00"),
    (pa.time64("us"), datetime.time(1, 2, 3, 4), "01:02:03.000004"),
    (pa.decimal128(20, 2), decimal.Decimal("12345678901234567.10"), "12345678901234567.10"),
    (pa.duration("us"), datetime.timedelta(seconds=-1, microseconds=500000), -0.5),
    (pa.duration("s"), datetime.timedelta(days=2), 172800),
])  # fmt: skip
def test_jsonl_export_writes_parquet_dates_decimals_and_durations(tmp_path, arrow, value, want):
    # Before: TypeError traceback ("not JSON serialisable: date") for any such column of a Parquet source.
    recs = lognormal_records(30, seed=7)
    t = pa.Table.from_pylist(recs).append_column("when", pa.array([value] * len(recs), arrow))
    pq.write_table(t, tmp_path / "src.parquet")
    _compile(tmp_path / "src.parquet", tmp_path / "plan.parquet")
    out = tmp_path / "t.jsonl"
    r = _cli(["export", tmp_path / "plan.parquet", "--format", "jsonl", "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    got = [json.loads(line)["when"] for line in out.read_text(encoding="utf-8").splitlines()]
    assert got == [want] * len(recs) and all(type(g) is type(want) for g in got)


def test_jsonl_export_of_nanoseconds_is_the_same_with_or_without_pandas(tmp_path):
    # Arrow hands a nanosecond value to pandas when it is installed and fails without it: the
    # export wrote the rows on one machine and refused them on another.
    recs = lognormal_records(30, seed=7)
    t = pa.Table.from_pylist(recs)
    t = t.append_column("ns", pa.array([1700000000123456789, None] * 15, pa.timestamp("ns")))
    t = t.append_column("tz", pa.array([1700000000123456789] * 30, pa.timestamp("ns", tz="Europe/Paris")))
    t = t.append_column("d", pa.array([1_500_000_001, 2_000_000_000] * 15, pa.duration("ns")))
    pq.write_table(t, tmp_path / "src.parquet")
    _compile(tmp_path / "src.parquet", tmp_path / "plan.parquet")
    out = tmp_path / "t.jsonl"
    r = _cli(["export", tmp_path / "plan.parquet", "--format", "jsonl", "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert {row["ns"] for row in rows} == {"2023-11-14T22:13:20.123456789", None}
    assert {row["tz"] for row in rows} == {"2023-11-14T23:13:20.123456789+01:00"}
    assert {(row["d"], type(row["d"])) for row in rows} == {(1.500000001, float), (2, int)}
    keys = list(rows[0])
    assert keys.index("ns") < keys.index("tz") < keys.index("d")  # the source's column order


def test_a_nested_nanosecond_python_cannot_hold_is_one_line_without_pandas(tmp_path):
    if importlib.util.find_spec("pandas") is not None:
        pytest.skip("pandas holds nanoseconds: nothing to refuse")
    recs = lognormal_records(30, seed=7)
    inner = pa.array([{"at": 1700000000123456789}] * 30, pa.struct([("at", pa.timestamp("ns"))]))
    top = pa.array([1700000000123456789] * 30, pa.timestamp("ns"))  # converted: not the culprit
    t = pa.Table.from_pylist(recs).append_column("ts", top).append_column("ns", inner)
    pq.write_table(t, tmp_path / "src.parquet")
    _compile(tmp_path / "src.parquet", tmp_path / "plan.parquet")
    r = _cli(["export", tmp_path / "plan.parquet", "--format", "jsonl", "-o", tmp_path / "t.jsonl"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "'ns'" in r.output and "'ts'" not in r.output and "--format verl" in r.output
    assert not (tmp_path / "t.jsonl").exists()


def test_jsonl_export_keeps_binary_text_and_refuses_image_bytes(tmp_path):
    # Image bytes became text with a replacement character per bad byte: silently lost, exit 0.
    recs = lognormal_records(30, seed=7)
    t = pa.Table.from_pylist(recs).append_column("note", pa.array([b"caf\xc3\xa9"] * 30, pa.binary()))
    pq.write_table(t, tmp_path / "text.parquet")
    _compile(tmp_path / "text.parquet", tmp_path / "plan.parquet")
    out = tmp_path / "t.jsonl"
    r = _cli(["export", tmp_path / "plan.parquet", "--format", "jsonl", "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    assert {json.loads(line)["note"] for line in out.read_text(encoding="utf-8").splitlines()} == {"café"}
    image = pa.array([[{"bytes": b"\x89PNG\r\n\x1a\n\x00", "path": None}]] * 30)
    pq.write_table(pa.Table.from_pylist(recs).append_column("images", image), tmp_path / "img.parquet")
    _compile(tmp_path / "img.parquet", tmp_path / "plan2.parquet")
    r = _cli(["export", tmp_path / "plan2.parquet", "--format", "jsonl", "-o", tmp_path / "i.jsonl"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "not UTF-8 text, such as image bytes" in r.output and "--format verl" in r.output
    assert not (tmp_path / "i.jsonl").exists()


def test_a_large_list_chat_prompt_column_passes_to_verl_unchanged(tmp_path):
    # A large_list prompt column was rebuilt from the plan, keeping only role and content of each message.
    recs = lognormal_records(40, seed=3)
    for rec in recs:
        rec["prompt"] = [{"role": "system", "content": "Be brief.", "name": "sys"},
                         {"role": "user", "content": rec["prompt"], "name": "u"}]  # fmt: skip
    t = pa.Table.from_pylist(recs)
    t = t.set_column(t.column_names.index("prompt"), "prompt", t.column("prompt").cast(
        pa.large_list(t.schema.field("prompt").type.value_type)))
    pq.write_table(t, tmp_path / "chat.parquet")
    _compile(tmp_path / "chat.parquet", tmp_path / "plan.parquet")
    out = tmp_path / "train.parquet"
    assert _cli(["export", tmp_path / "plan.parquet", "--format", "verl", "-o", out, "-q"]).exit_code == 0
    got = pq.read_table(out)
    assert got.schema.field("prompt").type == t.schema.field("prompt").type
    assert all(m["name"] in ("sys", "u") for row in got.column("prompt").to_pylist() for m in row)


def test_a_value_json_has_no_form_for_is_an_input_error():
    with pytest.raises(InputError, match="no form for .*object"):
        _json_line({"x": object()})


@pytest.mark.parametrize("name", [
    "my dir/tr ain.parquet", "a=b,c.parquet", "it's $HOME:smile:.parquet", "null", "1e3", "x\\'y\\.parquet",
    "${oc.env:HOME}.parquet", "ü [b]x[/b].parquet", "plain-name_1.parquet",
])  # fmt: skip
def test_printed_overrides_are_shell_and_hydra_quoted(tmp_path, monkeypatch, name):
    # Before: "data.train_files=my dir/tr ain.parquet" (the shell splits it) and "=a=b,c.parquet" (Hydra: a list).
    _compile(write_jsonl(tmp_path / "src.jsonl", lognormal_records(40, seed=8)), tmp_path / "plan.parquet")
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    r = _cli(["export", "plan.parquet", "-o", name])
    assert r.exit_code == 0, r.output
    printed = r.stdout.split("verl overrides for this plan:\n", 1)[1]
    argv = shlex.split(printed.replace("\\\n", " "))  # a shell joins the lines at each backslash-newline
    r = _cli(["export", "plan.parquet", "-o", name, "--json"])
    got = json.loads(r.stdout)
    assert argv == got["verl_overrides"] and len(argv) == len(got["overrides"])
    assert argv[0].startswith("data.train_files=") and got["overrides"]["data.train_files"] == name
    # Checked without hydra-core too: a plain path stays unquoted; Hydra would read the others as a list,
    # null, a float and an interpolation.
    hydra_form = {"plain-name_1.parquet": "plain-name_1.parquet", "a=b,c.parquet": "'a=b,c.parquet'",
                  "null": "'null'", "1e3": "'1e3'", "${oc.env:HOME}.parquet": "'\\${oc.env:HOME}.parquet'"}  # fmt: skip
    if name in hydra_form:
        assert argv[0] == f"data.train_files={hydra_form[name]}"
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from omegaconf import OmegaConf
    except ImportError:
        return  # hydra-core is not a dependency of aspc; the shell part above stands alone
    parser = OverridesParser.create()
    for arg in argv:
        parsed = parser.parse_override(arg)
        # verl reads the value through OmegaConf, which resolves ${...} and its escapes.
        assert OmegaConf.create({"v": parsed.value()}).v == got["overrides"][parsed.key_or_group], arg


def test_a_source_prompt_column_replaced_by_the_prompt_field_chat_is_said(tmp_path, text_data):
    # Before: the source's own 'prompt' column was silently dropped for the chat built from --prompt-field text.
    recs = lognormal_records(40, seed=9)
    for i, rec in enumerate(recs):
        rec["text"], rec["prompt"] = rec["prompt"], i
    src = write_jsonl(tmp_path / "src.jsonl", recs)
    plan = _compile(src, tmp_path / "plan.parquet", "--prompt-field", "text")
    r = _cli(["export", tmp_path / "plan.parquet", "-o", tmp_path / "t.parquet"])
    assert r.exit_code == 0, r.output
    notes = [line for line in r.stderr.splitlines() if "'prompt' column" in line]
    assert len(notes) == 1 and "'text'" in notes[0] and "data.prompt_key" in notes[0], r.stderr
    rows = pq.read_table(tmp_path / "t.parquet").to_pylist()
    texts = {rec["id"]: rec["text"] for rec in recs}
    assert [row["prompt"] for row in rows] == [[{"role": "user", "content": texts[p]}] for p in plan.column(S.PROMPT_ID)]
    got = json.loads(_cli(["export", tmp_path / "plan.parquet", "-o", tmp_path / "t.parquet", "--json"]).stdout)
    assert any("'prompt' column" in w for w in got["warnings"])
    # The usual case, a prompt field named 'prompt' (a text column made a chat in place), has no such note.
    _compile(text_data, tmp_path / "plain.parquet")
    r = _cli(["export", tmp_path / "plain.parquet", "-o", tmp_path / "p.parquet"])
    assert r.exit_code == 0 and "'prompt' column" not in r.stderr


def test_verl_export_keeps_a_field_the_first_dispatched_row_lacks(tmp_path):
    """Columns are every record's fields: Arrow's from_pylist took the first record's keys and dropped the rest."""
    recs = [{"id": "a", "prompt": "one", "len": 10, "reward_model": {"ground_truth": "1"}},
            {"id": "b", "prompt": "two", "len": 20, "reward_model": {"ground_truth": "2"}, "meta": 7},
            {"id": "c", "prompt": "three", "len": 900}]  # fmt: skip
    src = write_jsonl(tmp_path / "rm.jsonl", recs)
    r = _cli(["compile", src, "--length-field", "len", "-b", "1", "-o", tmp_path / "plan.parquet", "-q"])
    assert r.exit_code == 0, r.output
    export_plan(tmp_path / "plan.parquet", tmp_path / "train.parquet")
    t = pq.read_table(tmp_path / "train.parquet")
    got = dict(zip(t.column("id").to_pylist(), t.column("reward_model").to_pylist(), strict=True))
    assert t.column("id").to_pylist()[0] == "c"  # longest first: the row without the field leads
    assert got == {"a": {"ground_truth": "1"}, "b": {"ground_truth": "2"}, "c": None}
    assert dict(zip(t.column("id").to_pylist(), t.column("meta").to_pylist(), strict=True)) == {"a": None, "b": 7,
                                                                                                 "c": None}


@pytest.mark.parametrize(("fmt", "name"), [("verl", "x.jsonl"), ("verl", "x.json"), ("jsonl", "x.parquet"), ("jsonl", "x.json")])
def test_an_output_named_for_the_other_format_is_refused(tmp_path, text_data, fmt, name):
    _compile(text_data, tmp_path / "plan.parquet")
    r = _cli(["export", tmp_path / "plan.parquet", "--format", fmt, "-o", tmp_path / name])
    assert r.exit_code == 2 and f"--format {fmt} writes" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / name).exists()
    r = _cli(["export", tmp_path / "plan.parquet", "--format", fmt, "-o", tmp_path / "x.data", "-q"])
    assert r.exit_code == 0, r.output  # a suffix of no format is the user's choice


def test_a_tool_call_chat_keeps_its_message_keys_through_compile_and_verl_export(tmp_path):
    """Message keys beside role and content were dropped, changing what the model is prompted with."""
    chat = [{"role": "user", "content": "hi", "name": "bob"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "t1", "type": "function",
                                                                  "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "content": "42", "tool_call_id": "t1"}]  # fmt: skip
    src = write_jsonl(tmp_path / "tc.jsonl", [{"id": "a", "messages": chat, "len": 5},
                                              {"id": "b", "messages": [{"role": "user", "content": "x"}], "len": 9}])
    r = _cli(["compile", src, "--length-field", "len", "-o", tmp_path / "plan.parquet", "-q"])
    assert r.exit_code == 0, r.output
    export_plan(tmp_path / "plan.parquet", tmp_path / "train.parquet")
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    got = {row["extra_info"]["aspc"]["prompt_id"]: row["prompt"] for row in rows}
    assert [{k: v for k, v in m.items() if v is not None} for m in got["a"]] == chat
    assert [{k: v for k, v in m.items() if v is not None} for m in got["b"]] == [{"role": "user", "content": "x"}]
