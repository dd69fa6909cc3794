"""Ordinary content in unusual physical layouts: Arrow types, row groups, chunks, line endings, key order.

The same content must give the same plan (every column and metadata field but ``aspc.input_hash``, the
sha256 of the file's bytes), and a file aspc cannot take must give a one-line error, not a traceback.
Each case runs the CLI in a subprocess, as a user does.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent
N = 200
IDS = [f"p{i}" for i in range(N)]
PROMPTS = [f"question {i}: {'why ' * (i % 7)}is the sky blue?" for i in range(N)]
LENGTHS = [[(i * 37) % 500 + 1, (i * 11) % 300 + 5, (i * 53) % 700 + 2] for i in range(N)]
CHATS = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": p}] for p in PROMPTS]
MSG = pa.struct([("role", pa.string()), ("content", pa.string())])


def _aspc(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aspc.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def _ok(args: list[str], cwd: Path) -> str:
    res = _aspc(args, cwd)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    return res.stdout


def _plan(src: Path, field: str = "lengths") -> tuple[pa.Table, dict]:
    out = src.with_name(src.name + ".plan.parquet")
    _ok(["compile", src.name, "--length-field", field, "-o", out.name, "-q"], src.parent)
    t = pq.read_table(out)
    meta = {k: v for k, v in t.schema.metadata.items() if k != b"aspc.input_hash"}
    return t.replace_schema_metadata(None), meta


def _same_plan(a: Path, b: Path, field: str = "lengths") -> None:
    (ta, ma), (tb, mb) = _plan(a, field), _plan(b, field)
    assert ma == mb
    assert ta.equals(tb)


def _table(prompt=None, lengths=None, ids=None) -> pa.Table:
    return pa.table({"id": pa.array(IDS) if ids is None else ids,
                     "prompt": pa.array(PROMPTS) if prompt is None else prompt,
                     "lengths": pa.array(LENGTHS) if lengths is None else lengths})  # fmt: skip


# --- layouts that already give the same plan (passing) ---


@pytest.mark.parametrize(
    "lengths",
    [pa.array(LENGTHS, pa.list_view(pa.int64())), pa.array(LENGTHS, pa.large_list_view(pa.int32())),
     pa.array(LENGTHS, pa.list_(pa.int16(), 3)), pa.array(LENGTHS, pa.large_list(pa.uint64())),
     pa.array(LENGTHS, pa.list_(pa.float16()))],
    ids=["list_view", "large_list_view", "fixed_size_list", "large_list_uint64", "list_float16"],
)  # fmt: skip
def test_lengths_list_types_give_the_same_plan(tmp_path: Path, lengths: pa.Array) -> None:
    pq.write_table(_table(), tmp_path / "a.parquet")
    pq.write_table(_table(lengths=lengths), tmp_path / "b.parquet")
    _same_plan(tmp_path / "a.parquet", tmp_path / "b.parquet")


@pytest.mark.parametrize(
    "write",
    [lambda t, p: pq.write_table(t, p, row_group_size=1),
     lambda t, p: pq.write_table(t, p, data_page_size=64, write_batch_size=1),
     lambda t, p: pq.write_table(pa.Table.from_batches(t.to_batches(max_chunksize=3)), p),
     lambda t, p: pq.write_table(t.select(["lengths", "prompt", "id"]), p),
     lambda t, p: pq.write_table(t.set_column(1, "prompt", t["prompt"].dictionary_encode()), p, row_group_size=7),
     lambda t, p: pq.write_table(t.set_column(0, "id", pa.array(IDS, pa.string_view())), p),
     lambda t, p: pq.write_table(t.append_column("blob", pa.array(["x" * 20000] * N)), p)],
    ids=["row_group_per_row", "tiny_pages", "chunks_of_3", "columns_reordered", "dictionary_prompt",
         "string_view_ids", "huge_unused_column"],
)  # fmt: skip
def test_parquet_physical_layouts_give_the_same_plan(tmp_path: Path, write) -> None:
    pq.write_table(_table(), tmp_path / "a.parquet")
    write(_table(), tmp_path / "b.parquet")
    _same_plan(tmp_path / "a.parquet", tmp_path / "b.parquet")


def test_empty_row_groups_give_the_same_plan(tmp_path: Path) -> None:
    t = _table()
    pq.write_table(t, tmp_path / "a.parquet")
    with pq.ParquetWriter(tmp_path / "b.parquet", t.schema) as w:
        for part in (t.slice(0, 0), t.slice(0, 90), t.slice(0, 0), t.slice(90), t.slice(0, 0)):
            w.write_table(part)
    _same_plan(tmp_path / "a.parquet", tmp_path / "b.parquet")


@pytest.mark.parametrize(
    "chat",
    [pa.array(CHATS, pa.list_view(MSG)), pa.array(CHATS, pa.list_(MSG, 2)),
     pa.array([[{"content": m["content"], "role": m["role"]} for m in c] for c in CHATS]),
     pa.ListArray.from_arrays(pa.array(range(0, 2 * N + 1, 2), pa.int32()), pa.StructArray.from_arrays(
         [pa.array([m["role"] for c in CHATS for m in c]).dictionary_encode(),
          pa.array([m["content"] for c in CHATS for m in c])], names=["role", "content"]))],
    ids=["list_view", "fixed_size_list", "content_first", "dictionary_roles"],
)  # fmt: skip
def test_chat_prompt_layouts_give_the_same_plan_and_export(tmp_path: Path, chat: pa.Array) -> None:
    pq.write_table(_table(prompt=pa.array(CHATS, pa.list_(MSG))), tmp_path / "a.parquet")
    pq.write_table(_table(prompt=chat), tmp_path / "b.parquet")
    _same_plan(tmp_path / "a.parquet", tmp_path / "b.parquet")
    for x in "ab":
        _ok(["export", f"{x}.parquet.plan.parquet", "--format", "verl", "--source", f"{x}.parquet", "-o",
             f"{x}.verl.parquet", "-q"], tmp_path)  # fmt: skip
    prompts = [pq.read_table(tmp_path / f"{x}.verl.parquet")["prompt"].to_pylist() for x in "ab"]
    assert prompts[0] == prompts[1]  # the same messages (dicts: key order aside), in the same order


def _csv(path: Path, newline: str, quoting: int, bom: bool) -> None:
    s = io.StringIO()
    w = csv.writer(s, lineterminator=newline, quoting=quoting)
    w.writerow(["length", "prompt", "id"] if bom else ["id", "prompt", "length"])
    for i in range(N):
        w.writerow([LENGTHS[i][0], PROMPTS[i], IDS[i]] if bom else [IDS[i], PROMPTS[i], LENGTHS[i][0]])
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + s.getvalue().encode())


def test_csv_crlf_bom_quote_all_gives_the_same_plan(tmp_path: Path) -> None:
    _csv(tmp_path / "a.csv", "\n", csv.QUOTE_MINIMAL, bom=False)
    _csv(tmp_path / "b.csv", "\r\n", csv.QUOTE_ALL, bom=True)
    _same_plan(tmp_path / "a.csv", tmp_path / "b.csv", field="length")


def test_jsonl_crlf_bom_spacing_key_order_and_exponents_give_the_same_plan(tmp_path: Path) -> None:
    rows = [{"id": IDS[i], "prompt": PROMPTS[i], "lengths": LENGTHS[i]} for i in range(N)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def odd(r: dict) -> str:  # keys reversed, spaced, lengths written 5e0 / 5.0
        nums = ",".join(f"{x}e0" if x % 2 else f"{x}.0" for x in r["lengths"])
        return f'{{ "lengths" : [{nums}] , "prompt" : {json.dumps(r["prompt"])} , "id" : {json.dumps(r["id"])} }}'

    (tmp_path / "b.jsonl").write_bytes(b"\xef\xbb\xbf" + "".join(f"  {odd(r)}\t \r\n" for r in rows).encode())
    _same_plan(tmp_path / "a.jsonl", tmp_path / "b.jsonl")


# --- findings of the hunt (each failed before its fix: a traceback, a refused file, a silently doubled key) ---


@pytest.mark.parametrize("fmt,out", [("verl", "x.parquet"), ("jsonl", "x.jsonl")])
def test_export_from_a_parquet_source_with_a_string_view_column(tmp_path: Path, fmt: str, out: str) -> None:
    pq.write_table(_table().append_column("note", pa.array(PROMPTS, pa.string_view())), tmp_path / "in.parquet")
    _ok(["compile", "in.parquet", "--length-field", "lengths", "-o", "plan.parquet", "-q"], tmp_path)
    _ok(["export", "plan.parquet", "--format", fmt, "--source", "in.parquet", "-o", out, "-q"], tmp_path)
    assert (tmp_path / out).is_file()


_UNUSED = {
    "date_past_python": pa.array([2**31 - 1] * N, pa.date32()),
    "struct_naming_a_field_twice": pa.StructArray.from_arrays([pa.array([1] * N), pa.array([2] * N)], names=["a", "a"]),
}


@pytest.mark.parametrize("kind", sorted(_UNUSED))
def test_predict_eval_ignores_an_unused_parquet_column(tmp_path: Path, kind: str) -> None:
    pq.write_table(_table().append_column("extra", _UNUSED[kind]), tmp_path / "in.parquet")
    _ok(["compile", "in.parquet", "--length-field", "lengths", "-o", "plan.parquet", "-q"], tmp_path)  # takes it
    _ok(["predict", "eval", "default", "in.parquet", "--length-field", "lengths", "-q"], tmp_path)


def _dup_lengths_jsonl(path: Path, with_prompt: bool) -> None:
    lines = []
    for i in range(N):
        rec = {"id": IDS[i], **({"prompt": PROMPTS[i]} if with_prompt else {}), "lengths": LENGTHS[i]}
        line = json.dumps(rec)
        lines.append(line[:-1] + ', "lengths": [9999]}' if i == 7 else line)
    path.write_text("\n".join(lines) + "\n")


def test_actual_lengths_refuse_a_length_key_given_twice(tmp_path: Path) -> None:
    _dup_lengths_jsonl(tmp_path / "d.jsonl", with_prompt=False)
    pq.write_table(_table(), tmp_path / "in.parquet")
    _ok(["compile", "in.parquet", "--length-field", "lengths", "-o", "plan.parquet", "-q"], tmp_path)
    res = _aspc(["run", "plan.parquet", "--actual-lengths", "d.jsonl", "--length-field", "lengths", "-q"], tmp_path)
    assert res.returncode == 2 and "appears twice" in res.stderr, (res.returncode, res.stderr[-500:])


def test_predict_refuses_a_length_key_given_twice(tmp_path: Path) -> None:
    _dup_lengths_jsonl(tmp_path / "d.jsonl", with_prompt=True)
    assert _aspc(["compile", "d.jsonl", "--length-field", "lengths", "-o", "p.parquet", "-q"], tmp_path).returncode == 2
    res = _aspc(["predict", "eval", "default", "d.jsonl", "--length-field", "lengths", "-q"], tmp_path)
    assert res.returncode == 2 and "appears twice" in res.stderr, (res.returncode, res.stderr[-500:])


def test_history_rollout_dump_with_a_bom(tmp_path: Path) -> None:
    rows = [json.dumps({"id": IDS[i], "prompt": PROMPTS[i]}) for i in range(60)]
    (tmp_path / "p.jsonl").write_text("\n".join(rows) + "\n")
    dump = "".join(json.dumps({"input": f"user\n{PROMPTS[i]}\nassistant\n", "output": "meow " * (3 * i + 1),
                               "score": 1.0, "step": 1}) + "\n" for i in range(60))  # fmt: skip
    for name, bom in (("plain", b""), ("bom", b"\xef\xbb\xbf")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "1.jsonl").write_bytes(bom + dump.encode())
    _ok(["compile", "p.jsonl", "--history", "plain", "-o", "a.parquet", "-q"], tmp_path)
    _ok(["compile", "p.jsonl", "--history", "bom", "-o", "b.parquet", "-q"], tmp_path)
