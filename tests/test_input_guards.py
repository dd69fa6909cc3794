"""Inputs and plans a bug hunt broke in compile, export, check, inspect and probe: each case failed on the code
before its fix (a traceback, a silently cut prompt, an output left behind, a flag the command does not have).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.conftest import invoke_cli as _run
from tests.conftest import lognormal_records, write_jsonl
from tests.conftest import one_line_error as _one_line_error

# aspc report refuses first when matplotlib (the 'report' extra) is missing: its cases run only where it is.
HAS_MPL = importlib.util.find_spec("matplotlib") is not None


def test_lone_surrogate_id_is_one_line(tmp_path):
    src = tmp_path / "s.jsonl"
    src.write_text('{"id":"\\ud800","prompt":"x","lengths":[3]}\n')
    for args in (["compile", src, "--length-field", "lengths", "-o", tmp_path / "o.parquet"],
                 ["predict", "default", src, "-o", tmp_path / "a.parquet"]):  # fmt: skip
        msg = _one_line_error(_run(*args))
        assert "id field 'id' holds invalid Unicode (lone surrogates)" in msg
    assert not list(tmp_path.glob("*.parquet"))


@pytest.mark.parametrize(("value", "want"), [('"\\ud800"', "invalid Unicode"), ("NaN", "NaN or Infinity")])
def test_export_jsonl_refuses_values_json_cannot_hold(tmp_path, value, want):
    src = tmp_path / "s.jsonl"
    src.write_text('{"id":"a","prompt":"x","lengths":[3],"extra":' + value + "}\n")
    plan = tmp_path / "p.parquet"
    assert _run("compile", src, "--length-field", "lengths", "-o", plan, "-q").exit_code == 0
    formats = ["jsonl"] + (["verl"] if "Unicode" in want else [])
    for fmt in formats:
        out = tmp_path / f"e.{fmt}"
        assert want in _one_line_error(_run("export", plan, "--format", fmt, "-o", out))
        assert not out.exists()


def test_csv_row_with_more_fields_than_the_header_is_refused(tmp_path):
    src = tmp_path / "t.csv"
    src.write_text("id,lengths,prompt\na,5,Hello, world\nb,6,Hi there\n")
    out = tmp_path / "t.parquet"
    msg = _one_line_error(_run("compile", src, "--length-field", "lengths", "-o", out))
    assert "t.csv: line 2: 4 fields but the header has 3; quote fields that hold commas" in msg
    assert not out.exists()
    r = _run("compile", src, "--length-field", "lengths", "-o", out, "--on-bad-line", "skip", "-q")
    assert r.exit_code == 0, r.output
    assert pq.read_table(out).column("prompt").to_pylist() == ["Hi there"]


@pytest.mark.parametrize(
    ("option", "value", "want"),
    [
        ("--anneal-iterations", 2**62, "--anneal-iterations must be >= 0 and <= 100000000"),
        ("--max-response-length", 2**64, "--max-response-length must be >= 1 and <= 1000000000"),
        ("--max-prompt-length", 2**64, "--max-prompt-length must be >= 1 and <= 1000000000"),
    ],
)
def test_compile_option_bounds(tmp_path, small, option, value, want):
    out = tmp_path / "o.parquet"
    assert want in _one_line_error(_run("compile", small, "--length-field", "lengths", option, value, "-o", out))
    assert not out.exists()


def _edit(plan: Path, out: Path, key: str, field: str, value: object) -> Path:
    t = pq.read_table(plan)
    meta = dict(t.schema.metadata)
    d = json.loads(meta[key.encode()])
    d[field] = value
    meta[key.encode()] = json.dumps(d).encode()
    pq.write_table(t.replace_schema_metadata(meta), out)
    return out


@pytest.mark.parametrize(
    ("key", "field", "value"),
    [
        ("aspc.metrics", "response_cap", "x"),
        ("aspc.metrics", "response_cap", 1e300),
        ("aspc.config", "max_prompt_length", "abc"),
        ("aspc.config", "inputs", "s"),
        ("aspc.config", "inputs", {"id_field": 3}),
        ("aspc.metrics", "cost_model", "x"),  # was "unknown cost model 'x'; use one of ...": no file, no fix
    ],
)
def test_edited_plan_metadata_is_one_line_everywhere(tmp_path, plan, key, field, value):
    bad = _edit(plan, tmp_path / "bad.parquet", key, field, value)
    out = tmp_path / "e.parquet"
    for args in (["export", bad, "-o", out], ["check", bad], ["inspect", bad], ["report", bad, "-o", tmp_path / "r"]):
        if args[0] == "report" and not HAS_MPL:
            continue  # needs matplotlib (pip install 'aspc[report]'): without it report says only that
        assert "plan metadata" in _one_line_error(_run(*args)), args
    assert not out.exists()


def test_export_refuses_edited_rows(tmp_path, plan):
    t = pq.read_table(plan)
    i = t.schema.get_field_index("predicted_len")
    t = t.set_column(i, t.schema.field(i), pc.multiply(t["predicted_len"], 2))
    bad = tmp_path / "bad.parquet"
    pq.write_table(t, bad)
    out = tmp_path / "e.parquet"
    assert "rows do not match the plan's metadata" in _one_line_error(_run("export", bad, "-o", out))
    assert not out.exists()


def test_probe_on_a_used_log_names_only_its_own_options(tmp_path, small):
    log = tmp_path / "L"
    log.mkdir()
    (log / "f").write_text("x")
    msg = _one_line_error(_run("probe", small, "--backend", "sim", "--actual-lengths", small, "--length-field",
                               "lengths", "--log", log, "-o", tmp_path / "O"))  # fmt: skip
    assert "pass --overwrite to probe again" in msg and "--resume" not in msg


def test_history_length_field_without_history_is_refused(tmp_path, small):
    want = "--history-length-field names the length field of --history datasets: pass --history too"
    out = tmp_path / "o.parquet"
    for args in (["compile", small, "--length-field", "lengths", "-o", out],
                 ["predict", "apply", "default", small, "-o", out]):  # fmt: skip
        assert want in _one_line_error(_run(*args, "--history-length-field", "n"))
    assert not out.exists()


def test_missing_path_without_a_suffix_says_no_such_file(tmp_path):
    msg = _one_line_error(_run("compile", tmp_path / "nonexist", "--length-field", "lengths", "-o", tmp_path / "o.parquet"))
    assert "nonexist: no such file; check the path" in msg
    (tmp_path / "data.txt").write_text("x\n")  # an existing file of another type still names the types
    assert "unsupported file type .txt" in _one_line_error(_run("compile", tmp_path / "data.txt", "-o", tmp_path / "o.parquet"))


def test_export_refuses_an_empty_data_source(tmp_path, plan):
    out = tmp_path / "e.parquet"
    for value in ("", "  "):
        assert "--data-source is empty" in _one_line_error(_run("export", plan, "--data-source", value, "-o", out))
    assert not out.exists()


def test_top_k_past_int32_is_one_line(tmp_path, small):
    r = _run("probe", small, "--backend", "sim", "--actual-lengths", small, "--length-field", "lengths",
             "--top-k", 2**64, "--log", tmp_path / "L", "-o", tmp_path / "O")  # fmt: skip
    assert "--top-k must be >= 0 (0 = off) and <= 2147483647" in _one_line_error(r)
    assert not (tmp_path / "L").exists()


def test_lexical_training_refuses_a_device(tmp_path, small):
    out = tmp_path / "pred"
    r = _run("predict", "train", small, "--length-field", "lengths", "--kind", "lexical", "--device", "cpu", "-o", out)
    assert "--device cpu: the lexical predictor trains on the CPU" in _one_line_error(r)
    assert not out.exists()


@pytest.mark.parametrize(
    ("edit", "want"),
    [
        (lambda m: m["config"]["features"].update(bits=-1), "features.bits -1 is not an integer in 1..30"),
        (lambda m: m.update(targets="abc"), "targets 'abc' are not names"),
        (lambda m: m.update(targets=["a", "b", "c"]), "are not names of the weights'"),
        (lambda m: m["marginal"].update(mean=float("nan")), "its metadata 'marginal' is not four finite lengths"),
    ],
)
def test_edited_predictor_metadata_is_one_line(tmp_path, small, edit, want):
    pred = tmp_path / "pred"
    assert _run("predict", "train", small, "--length-field", "lengths", "-o", pred, "-q").exit_code == 0
    meta = json.loads((pred / "metadata.json").read_text())
    edit(meta)
    (pred / "metadata.json").write_text(json.dumps(meta))
    assert want in _one_line_error(_run("predict", "eval", pred, small, "--length-field", "lengths", "--json"))


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--strategy", "sorted", "--slack", "2", "--order", "lpt"], "--slack, --order: --strategy sorted cuts"),
        (["--strategy", "random", "--anneal-iterations", "5"], "--anneal-iterations: --strategy random cuts"),
        (["--order", "ascending", "--minibatch-overhead", "3", "--equal-samples"],
         "--minibatch-overhead, --equal-samples: --order ascending cuts equal minibatches"),
    ],
)
def test_options_the_strategy_ignores_are_noted(tmp_path, small, args, want):
    # A note, not an error: one option set for every strategy is how a comparison script compiles.
    out = tmp_path / "o.parquet"
    r = _run("compile", small, "--length-field", "lengths", *args, "-o", out)
    assert r.exit_code == 0 and want in r.output, r.output
    r = _run("compile", small, "--length-field", "lengths", "-o", out, "--strategy", "sorted", "--batch-size", "8")
    assert "not used" not in r.output


def test_ignored_options_change_no_row(tmp_path, small):
    """What the note rests on: these options do not move a row of a sorted plan."""
    hashes = set()
    for extra in ([], ["--slack", "3", "--anneal-iterations", "7", "--minibatch-overhead", "9", "--equal-samples"]):
        out = tmp_path / f"o{len(extra)}.parquet"
        r = _run("compile", small, "--length-field", "lengths", "--strategy", "sorted", *extra, "-o", out, "-q")
        assert r.exit_code == 0, r.output
        hashes.add(pq.read_schema(out).metadata[b"aspc.rows_hash"])
    assert len(hashes) == 1


def test_missing_run_log_says_no_such_directory(tmp_path):
    msg = _one_line_error(_run("calibrate", tmp_path / "nonexist"))
    assert "nonexist: no such directory; pass the directory given to 'aspc run --log'" in msg


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_a_named_id_field_in_no_row_is_refused(tmp_path, fmt):
    # Before: a misspelt --id-field silently gave content-hash ids, so history and actual lengths matched nothing.
    rows = [{"id": "a", "prompt": "x", "len": 3}, {"id": "b", "prompt": "y", "len": 4}]
    src = tmp_path / f"p.{fmt}"
    if fmt == "jsonl":
        src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "parquet":
        import pyarrow as pa

        pq.write_table(pa.Table.from_pylist(rows), src)
    else:
        src.write_text("id,prompt,len\na,x,3\nb,y,4\n")
    out = tmp_path / "o.parquet"
    msg = _one_line_error(_run("compile", src, "--id-field", "uid", "--length-field", "len", "-o", out))
    assert f"p.{fmt}: line " in msg and "missing id field 'uid' (named by --id-field)" in msg
    assert not out.exists()
    r = _run("compile", src, "--id-field", "id", "--length-field", "len", "-o", out, "-q")
    assert r.exit_code == 0, r.output
    assert sorted(pq.read_table(out).column("prompt_id").to_pylist()) == ["a", "b"]


def test_a_named_id_field_missing_from_one_row_names_that_row(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text('{"uid":"a","prompt":"x","len":3}\n{"prompt":"y","len":4}\n')
    for args in (["compile", src, "--id-field", "uid", "--length-field", "len", "-o", tmp_path / "o.parquet"],
                 ["predict", "train", src, "--id-field", "uid", "--length-field", "len", "-o", tmp_path / "pred"]):  # fmt: skip
        assert "p.jsonl: line 2: missing id field 'uid'" in _one_line_error(_run(*args))
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "pred").exists()


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["compile", ""], "'INPUT'"),
        (["compile", "{src}", "--predictor", ""], "'--predictor'"),
        (["compile", "{src}", "--tokenizer", ""], "'--tokenizer'"),
        (["check", ""], "'PLAN'"),
        (["run", "{plan}", "--log", ""], "'--log'"),
        (["predict", "eval", "", "{src}"], "'PREDICTOR'"),
        (["predict", "train", "{src}", "--init", ""], "'--init'"),
        (["report", "{plan}", ""], "'[RUN]...'"),
    ],
)
def test_an_empty_path_is_refused(tmp_path, small, plan, args, name):
    # Before: pathlib read '' as '.', so INPUT became the current directory and --predictor '' the default predictor.
    out = tmp_path / "out"
    argv = [a.format(src=small, plan=plan) for a in args] + (["-o", out] if args[0] in ("compile", "report") else [])
    argv += ["-o", out] if args[:2] == ["predict", "train"] else []
    msg = _one_line_error(_run(*argv), code=2)
    assert f"Invalid value for {name}: is empty; give a file or directory name" in msg
    assert not out.exists()


# --------------------------------------------------------------------------- damaged run logs


@pytest.fixture
def run_log(tmp_path, plan) -> Path:
    log = tmp_path / "RUN"
    assert _run("run", plan, "--log", log, "-q").exit_code == 0
    return log


def _readers(tmp_path, plan, log):
    return {
        "report": ["report", plan, log, "-o", tmp_path / "rep"],
        "calibrate": ["calibrate", log, "-o", tmp_path / "c.json"],
        "predict train": ["predict", "train", log, "-o", tmp_path / "pred"],
        "compile --history": ["compile", plan.parent / "x.jsonl", "--history", log, "-o", tmp_path / "h.parquet"],
        "run --resume": ["run", plan, "--log", log, "--resume"],
    }


@pytest.mark.parametrize("parts", [[], 5, {"samples": [0]}, {"samples": "x"}, {"samples": [2, 1]}, {"steps": [0.5, 1]}])
def test_corrupt_part_ranges_are_one_line_everywhere(tmp_path, plan, run_log, parts):
    # Before: a traceback (unpacking, comparison or .get on a list) in every reader but compile --history.
    meta = json.loads((run_log / "meta.json").read_text())
    meta["parts"] = parts
    (run_log / "meta.json").write_text(json.dumps(meta))
    for name, args in _readers(tmp_path, plan, run_log).items():
        if name == "report" and not HAS_MPL:
            continue  # needs matplotlib (pip install 'aspc[report]'): without it report says only that
        msg = _one_line_error(_run(*args, "-q"))
        assert "RUN: corrupt part ranges in meta.json; the run log is damaged" in msg, name
    assert not any((tmp_path / p).exists() for p in ("rep", "c.json", "pred", "h.parquet"))


def test_deleted_committed_parts_are_refused_everywhere(tmp_path, plan, run_log):
    # Before: report and calibrate exited 0 on the empty log (a "complete" run with no samples, default coefficients).
    for f in (run_log / "samples").glob("part-*.parquet"):
        f.unlink()
    for name, args in _readers(tmp_path, plan, run_log).items():
        if name == "report" and not HAS_MPL:
            continue  # needs matplotlib (pip install 'aspc[report]'): without it report says only that
        msg = _one_line_error(_run(*args, "-q"))
        assert "RUN: committed parts of samples/ are missing; the run log is damaged" in msg, name


@pytest.mark.parametrize("targets", [[], ["m1"], ["m1", "m1"], ["m2", "m1"]])
def test_edited_target_names_of_a_multi_target_predictor_are_refused_or_kept_in_order(tmp_path, targets):
    # Fewer names than heads were taken: every target then read another's head, silently.
    recs = [{**r, "model": m} for r in lognormal_records(120) for m in ("m1", "m2")]
    data = write_jsonl(tmp_path / "two.jsonl", [{**r, "id": f"{r['id']}-{r['model']}"} for r in recs])
    pred = tmp_path / "pred"
    r = _run("predict", "train", data, "--length-field", "lengths", "--target-field", "model", "-o", pred, "-q")
    assert r.exit_code == 0, r.output
    meta = json.loads((pred / "metadata.json").read_text())
    assert meta["targets"] == ["m1", "m2"]
    meta["targets"] = targets
    (pred / "metadata.json").write_text(json.dumps(meta))
    r = _run("predict", "eval", pred, data, "--length-field", "lengths", "--json")
    if len(targets) == 2 and len(set(targets)) == 2:  # a renaming keeps the heads' count: targets_sha256 sees it
        assert "target names do not match their recorded hash" in _one_line_error(r)
    else:
        assert "are not names of the weights' 2 target heads" in _one_line_error(r)


def test_an_earlier_output_directory_holding_other_files_is_not_replaced(tmp_path, small, plan):
    # report -o and predict train -o replace the directory whole: run logs or notes copied into an
    # earlier report or predictor were deleted silently.
    # The report half needs matplotlib (pip install 'aspc[report]'); the predictor half runs everywhere.
    rep, pred = tmp_path / "rep", tmp_path / "pred"
    if HAS_MPL:
        assert _run("report", plan, "-o", rep, "-q").exit_code == 0
    assert _run("predict", "train", small, "--length-field", "lengths", "-o", pred, "-q").exit_code == 0
    if HAS_MPL:
        assert _run("report", plan, "-o", rep, "-q").exit_code == 0  # its own files only: replaced
    assert _run("predict", "train", small, "--length-field", "lengths", "-o", pred, "-q").exit_code == 0
    (pred / "sub").mkdir()
    if HAS_MPL:
        (rep / "notes.txt").write_text("mine")
        msg = _one_line_error(_run("report", plan, "-o", rep))
        assert "holds 'notes.txt', which is no part of an aspc report" in msg
    r = _run("predict", "train", small, "--length-field", "lengths", "-o", pred)
    assert "holds 'sub', which no aspc predictor writes" in _one_line_error(r)
    assert (pred / "sub").is_dir()
    if HAS_MPL:
        assert (rep / "notes.txt").read_text() == "mine"
