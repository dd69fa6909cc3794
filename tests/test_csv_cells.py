"""How CSV cells (text) are read where JSON holds other values: verl's extra_info, and lengths through export."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
from click.testing import CliRunner

from aspc.cli import main as cli
from aspc.io import read_prompts
from aspc.io.readers import iter_records
from aspc.io.rows import content_id


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8", newline="")
    return path


def _cli(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _compile(src: Path, out: Path, *args: str) -> list[dict]:
    res = _cli("compile", src, "-o", out, "-q", *args)
    assert res.exit_code == 0, res.output
    return pq.read_table(out).to_pylist()


def _export_jsonl(plan: Path, out: Path) -> list[dict]:
    res = _cli("export", plan, "--format", "jsonl", "-o", out, "-q")
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def test_csv_extra_info_cell_holding_an_object_is_that_object(tmp_path):
    src = _write_csv(tmp_path / "in.csv", ["prompt", "extra_info"],
                     [["a", '{"index": 3, "split": "train"}'], ["b", ' {"index": "x"} ']])  # fmt: skip
    assert [rec["extra_info"] for _, rec in iter_records(src)] == [{"index": 3, "split": "train"}, {"index": "x"}]
    assert read_prompts(src).ids == ["3", "x"]


def test_csv_extra_info_cell_that_is_no_object_stays_text(tmp_path):
    cells = ["", "text", "{not json", '{"index": 0', '[{"index": 0}]', "[]", "5", '"x"', "null", "{} trailing",
             '{"a":' * 5000 + "1" + "}" * 5000]  # fmt: skip
    src = _write_csv(tmp_path / "in.csv", ["prompt", "extra_info"], [[f"p{i}", c] for i, c in enumerate(cells)])
    assert [rec["extra_info"] for _, rec in iter_records(src)] == cells
    # No index on any row: content ids, as before.
    assert read_prompts(src).ids == [content_id(f"p{i}") for i in range(len(cells))]


def test_csv_extra_info_index_is_refused_where_jsonl_refuses_it(tmp_path):
    src = _write_csv(tmp_path / "in.csv", ["prompt", "extra_info"], [["a", '{"index": 0}'], ["b", "{}"]])
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"prompt": "a", "extra_info": {"index": 0}}\n{"prompt": "b", "extra_info": {}}\n')
    for path in (src, jsonl):
        t = read_prompts(path, on_bad_line="skip")
        assert t.ids == ["0"]
        assert [s.reason for s in t.skipped] == ["missing id field 'extra_info.index' (earlier rows have one); "
                                                 "add ids to every row"]  # fmt: skip


def test_csv_with_extra_info_exports_and_recompiles_to_its_ids(tmp_path):
    # Was: export --format jsonl refused the text cell ("the source's extra_info is not an object"), and
    # --format verl its string column.
    src = _write_csv(tmp_path / "in.csv", ["prompt", "len", "extra_info"],
                     [["a", "5", '{"index": 7, "split": "train"}'], ["b", "3", '{"index": 8, "split": "test"}']])  # fmt: skip
    args = ["--length-field", "len", "--strategy", "sorted"]
    plan = _compile(src, tmp_path / "plan.parquet", *args)
    assert sorted(r["prompt_id"] for r in plan) == ["7", "8"]
    recs = _export_jsonl(tmp_path / "plan.parquet", tmp_path / "x.jsonl")
    assert [{k: v for k, v in r["extra_info"].items() if k != "aspc"} for r in recs] == [
        {"index": 8, "split": "test"}, {"index": 7, "split": "train"}]  # fmt: skip
    again = _compile(tmp_path / "x.jsonl", tmp_path / "again.parquet", *args)
    assert [r["prompt_id"] for r in again] == ["8", "7"]
    res = _cli("export", tmp_path / "plan.parquet", "--format", "verl", "-o", tmp_path / "v.parquet", "-q")
    assert res.exit_code == 0, res.output
    verl = pq.read_table(tmp_path / "v.parquet")
    assert "id" not in verl.column_names  # extra_info.index gives the ids back
    assert sorted(r["prompt_id"] for r in _compile(tmp_path / "v.parquet", tmp_path / "v.plan.parquet")) == ["7", "8"]


def test_csv_export_writes_the_lengths_compile_read(tmp_path):
    src = _write_csv(tmp_path / "in.csv", ["id", "prompt", "len", "n"],
                     [["007", "a", " 4 ", "5"], ["2", "b", "[1, 2.5]", "6"], ["3", "c", "1e3", ""]])  # fmt: skip
    args = ["--length-field", "len", "--strategy", "sorted"]
    before = _compile(src, tmp_path / "plan.parquet", *args)
    recs = _export_jsonl(tmp_path / "plan.parquet", tmp_path / "x.jsonl")
    got = {r["id"]: (r["len"], r["n"]) for r in recs}
    # The length cells as the numbers compile read; every other cell (ids, other columns) as its text.
    assert got == {"007": (4, "5"), "2": ([1, 2.5], "6"), "3": (1000.0, "")}
    after = _compile(tmp_path / "x.jsonl", tmp_path / "again.parquet", *args)
    for r in before:
        r["source_row"] = r["dispatch_rank"]
    assert after == before


def test_csv_export_without_a_length_field_keeps_the_cells(tmp_path):
    src = _write_csv(tmp_path / "in.csv", ["id", "prompt", "len"], [["1", "a", "4"], ["2", "b", "[1, 2]"]])
    _compile(src, tmp_path / "plan.parquet", "--strategy", "sorted")
    recs = _export_jsonl(tmp_path / "plan.parquet", tmp_path / "x.jsonl")
    assert sorted((r["id"], r["len"]) for r in recs) == [("1", "4"), ("2", "[1, 2]")]  # compile read no lengths
