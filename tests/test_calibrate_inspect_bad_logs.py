"""``aspc calibrate``, ``aspc inspect`` and ``aspc check`` on damaged or hand-edited run logs and plans.

Run logs: sample and minibatch rows holding times or features no run writes (infinite, negative, NaN,
minibatch ids out of range or matching no row), a malformed meta.json (a list backend, a numeric speed
probe, JSON nested thousands deep). Plans: a repeated column, metadata nested thousands deep. Each is
one ``Error: ...`` line and a non-zero exit (or, where the log is still usable, a normal result): no
traceback, no out-of-memory, and no cost model fitted silently from times that cannot be.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.conftest import lognormal_records, write_jsonl

ASPC = [sys.executable, "-m", "aspc.cli"]


def _cli(*args: object):
    """``aspc ARGS`` in this process, exceptions caught (a traceback shows as ``result.exception``)."""
    from aspc.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def _sub(*args: object, limit_as: int | None = None) -> subprocess.CompletedProcess:
    """``aspc ARGS`` as its own process (recursion depth and memory as a user's shell gives them)."""

    def pre() -> None:
        if limit_as is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([*ASPC, *map(str, args)], capture_output=True, text=True, env=env, preexec_fn=pre,
                          timeout=120)  # fmt: skip


def _assert_one_line_error(out: str, code: int, exception: object = None) -> str:
    """The single ``Error: ...`` line of a refused command: non-zero exit, no traceback, nothing else."""
    assert exception is None or isinstance(exception, SystemExit), repr(exception)
    assert "Traceback" not in out, out[-2000:]
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert code != 0, out
    assert len(lines) == 1 and lines[0].startswith("Error: "), out[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[Path, Path]:
    """A 200-prompt plan and its complete sim run log (static returns, run log 1.2)."""
    d = tmp_path_factory.mktemp("hunt_cal")
    src = write_jsonl(d / "x.jsonl", lognormal_records(200))
    plan = d / "plan.parquet"
    r = _cli("compile", src, "--length-field", "lengths", "-o", plan, "-q")
    assert r.exit_code == 0, r.output
    r = _cli("run", plan, "--log", d / "RUN", "-q")
    assert r.exit_code == 0, r.output
    return plan, d / "RUN"


def _copy_log(base, tmp_path: Path) -> Path:
    run = tmp_path / "RUN"
    shutil.copytree(base[1], run)
    return run


def _edit(run: Path, kind: str, fn) -> None:
    part = sorted((run / kind).glob("part-*.parquet"))[-1]
    pq.write_table(fn(pq.read_table(part)), part)


def _set(t: pa.Table, name: str, values) -> pa.Table:
    f = t.schema.field(name)
    return t.set_column(t.schema.get_field_index(name), f.with_nullable(True), pa.array(values, type=f.type))


def _edit_meta(run: Path, fn) -> None:
    meta = json.loads((run / "meta.json").read_text())
    fn(meta)
    (run / "meta.json").write_text(json.dumps(meta))


# ---------------------------------------------------------------------------------------------- calibrate


# Was: exit 0 and a cost model whose generation coefficients were all 0 (inf decode_time kept as a timed row).
def test_an_infinite_sample_decode_time_is_refused(base, tmp_path):
    run = _copy_log(base, tmp_path)
    _edit(run, "samples", lambda t: _set(t, "decode_time",
                                         np.where(np.arange(t.num_rows) == 5, np.inf,
                                                  t.column("decode_time").to_numpy(zero_copy_only=False))))
    out = tmp_path / "cost.json"
    r = _cli("calibrate", run, "-o", out, "-q")
    assert not out.exists()
    _assert_one_line_error(r.output, r.exit_code, r.exception)


# Was: a traceback, IndexError in sample_rows when no sample matched a minibatch row.
def test_samples_of_unknown_minibatches_are_one_line_or_a_fit(base, tmp_path):
    run = _copy_log(base, tmp_path)
    _edit(run, "samples", lambda t: _set(t, "minibatch", np.full(t.num_rows, -1, dtype=np.int32)))
    r = _cli("calibrate", run, "--json", "-q")
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    if r.exit_code != 0:
        _assert_one_line_error(r.output, r.exit_code, r.exception)


# Was: 'Error: cost model decode_base must be a finite number >= 0, got -1.56', naming neither log nor row.
@pytest.mark.parametrize("damage", ["end_before_start", "nan_context_tokens"])
def test_a_damaged_minibatch_row_is_named(base, tmp_path, damage):
    run = _copy_log(base, tmp_path)
    if damage == "end_before_start":
        _edit(run, "minibatches", lambda t: _set(t, "end", t.column("start").to_numpy() - 1000.0))
    else:
        _edit(run, "minibatches", lambda t: _set(t, "context_tokens",
                                                 np.where(np.arange(t.num_rows) == 0, np.nan,
                                                          t.column("context_tokens").to_numpy())))
    r = _cli("calibrate", run, "-q")
    line = _assert_one_line_error(r.output, r.exit_code, r.exception)
    assert "cost model decode_base" not in line, line
    assert str(run) in line or "run log" in line, line


# Was: a traceback, TypeError: unhashable type: 'list' ('backend in PADDED_BACKENDS').
def test_a_list_backend_in_meta_is_one_line(base, tmp_path):
    run = _copy_log(base, tmp_path)
    _edit_meta(run, lambda m: m["config"].__setitem__("backend", ["hf"]))
    r = _cli("calibrate", run, "-q")
    _assert_one_line_error(r.output, r.exit_code, r.exception)


# Was: a traceback, TypeError: 'int' object is not iterable in mean_speed_probe.
def test_a_numeric_speed_probe_list_is_no_speed_probe(base, tmp_path):
    run = _copy_log(base, tmp_path)
    _edit_meta(run, lambda m: m.setdefault("summary", {}).__setitem__("speed_probe_s", {"before": 5}))
    r = _cli("calibrate", run, "--json", "-q")
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["speed_probe_s"] is None


# Was: a traceback, RecursionError from json.loads in read_meta.
def test_a_deeply_nested_meta_json_is_one_line(base, tmp_path):
    run = _copy_log(base, tmp_path)
    text = (run / "meta.json").read_text()
    (run / "meta.json").write_text('{"junk": ' + "[" * 5000 + "]" * 5000 + ", " + text.lstrip()[1:])
    p = _sub("calibrate", run, "-q")
    _assert_one_line_error(p.stdout + p.stderr, p.returncode)


# Was: arrays sized by the largest minibatch id (16.9 GB), or 'out of memory' under a 4 GiB limit.
def test_an_out_of_range_minibatch_id_is_named(base, tmp_path):
    run = _copy_log(base, tmp_path)
    _edit(run, "minibatches", lambda t: _set(t, "minibatch", np.where(
        np.arange(t.num_rows) == t.num_rows - 1, 2**31 - 1, t.column("minibatch").to_numpy()).astype(np.int32)))
    p = _sub("calibrate", run, "-q", limit_as=4 * 2**30)
    line = _assert_one_line_error(p.stdout + p.stderr, p.returncode)
    assert "out of memory" not in line and "minibatch" in line, line


# Was: exit 0 and a cost model fitted on the value (a negative decode time or step duration, a negative count).
@pytest.mark.parametrize(("kind", "name", "value", "said"), [
    ("samples", "decode_time", -1.0, "decode_time is -1, not a finite number of seconds >= 0"),
    ("samples", "finish_time", np.inf, "finish_time is inf, not a finite number of seconds >= 0"),
    ("samples", "response_len", -100, "response_len is -100, not a count >= 0"),
    ("samples", "minibatch", 99, "a sample row names minibatch 99, out of range (the plan's minibatches are 0 to "),
    ("minibatches", "tokens", -100, "tokens is -100, not a finite count >= 0"),
    ("minibatches", "minibatch", -1, "a minibatch row names minibatch -1, out of range"),
    ("steps", "tokens", -10**6, "tokens is -1000000, not a finite count >= 0"),
    ("steps", "end", -1.0, "ends "),
])  # fmt: skip
def test_a_damaged_row_value_is_named(base, tmp_path, kind, name, value, said):
    run = _copy_log(base, tmp_path)
    _edit(run, kind, lambda t: _set(t, name, np.where(np.arange(t.num_rows) == 1, value,
                                                      t.column(name).to_numpy(zero_copy_only=False))))
    r = _cli("calibrate", run, "-q")
    line = _assert_one_line_error(r.output, r.exit_code, r.exception)
    assert str(run) in line and said in line and "the run log is damaged" in line, line


# Was: an IndexError in sample_rows when no sample matched a minibatch row (a library caller's columns).
def test_sample_rows_of_no_matching_minibatch_are_none():
    from aspc.runtime.calibrate import calibrate_columns, sample_rows

    rng = np.random.default_rng(0)
    n = 12
    mbs = {"minibatch": np.arange(n), "start": np.zeros(n), "end": rng.uniform(1, 2, n),
           "prompt_tokens": rng.integers(10, 99, n), "max_len": rng.integers(10, 99, n),
           "tokens": rng.integers(100, 999, n), "context_tokens": rng.uniform(1e3, 1e4, n)}  # fmt: skip
    smp = {"minibatch": np.full(4, 50), "response_len": np.arange(4) + 1, "prompt_tokens": np.full(4, 9),
           "decode_time": np.ones(4), "finish_time": np.ones(4)}  # fmt: skip
    x, y, g = sample_rows(smp, mbs)
    assert x.shape == (0, 5) and y.size == 0 and g.size == 0
    steps = {"start": np.zeros(0), "end": np.zeros(0), "tokens": np.zeros(0, dtype=np.int64)}
    assert calibrate_columns(mbs, steps, samples=smp).fit_rows == "minibatches"


# Was: sample_rows and is_continuous sized an array by the largest minibatch id (MemoryError for 2**40)
# and a negative id wrote to its last place (another minibatch's end).
def test_minibatch_ids_are_matched_not_used_as_array_indices():
    from aspc.runtime.calibrate import is_continuous, sample_rows

    mbs = {"minibatch": np.array([0, 2**40]), "start": np.zeros(2), "end": np.array([5.0, 7.0]),
           "prompt_tokens": np.array([9, 9])}
    smp = {"minibatch": np.array([2**40, 0]), "response_len": np.array([3, 4]), "prompt_tokens": np.array([9, 9]),
           "decode_time": np.array([6.0, 5.0]), "finish_time": np.array([7.0, 5.0])}  # fmt: skip
    x, y, g = sample_rows(smp, mbs)
    assert g.tolist() == [1, 0] and y.tolist() == [6.0, 5.0]
    assert not is_continuous(smp, mbs)
    wrapped = {"minibatch": np.array([0, -1]), "start": np.zeros(2), "end": np.array([5.0, 10.0])}
    assert not is_continuous({"minibatch": np.array([0]), "finish_time": np.array([5.0])}, wrapped)


# ---------------------------------------------------------------------------------------------- inspect


def _rewrite_plan(plan: Path, out: Path, *, table=None, meta: dict | None = None) -> Path:
    t = pq.read_table(plan)
    m = dict(t.schema.metadata)
    m.update(meta or {})
    pq.write_table((table if table is not None else t).replace_schema_metadata(m), out)
    return out


# Was: a traceback, KeyError 'Field "group" exists 2 times in schema' from table.select in read_plan.
@pytest.mark.parametrize("cmd", ["inspect", "check"])
def test_a_plan_with_a_repeated_column_is_one_line(base, tmp_path, cmd):
    src = pq.read_table(base[0])
    dup = pa.Table.from_arrays([*src.columns, src.column("group")], names=[*src.column_names, "group"])
    plan = _rewrite_plan(base[0], tmp_path / "dup.parquet", table=dup)
    r = _cli(cmd, plan, "--json")
    _assert_one_line_error(r.output, r.exit_code, r.exception)


# Was: a traceback, RecursionError from json.loads in read_plan's _json.
@pytest.mark.parametrize("cmd", ["inspect", "check"])
def test_deeply_nested_plan_metadata_is_one_line(base, tmp_path, cmd):
    metrics = pq.read_table(base[0]).schema.metadata[b"aspc.metrics"]
    deep = b'{"extra": ' + b"[" * 2000 + b"]" * 2000 + b", " + metrics[1:]
    plan = _rewrite_plan(base[0], tmp_path / "deep.parquet", meta={b"aspc.metrics": deep})
    p = _sub(cmd, plan, "--json")
    _assert_one_line_error(p.stdout + p.stderr, p.returncode)


# Was: a traceback, RecursionError in emit_json's _finite (a call per nesting level).
def test_inspect_json_on_900_deep_metadata_is_printed(base, tmp_path):
    metrics = pq.read_table(base[0]).schema.metadata[b"aspc.metrics"]
    deep = b'{"extra": ' + b"[" * 900 + b"]" * 900 + b", " + metrics[1:]
    plan = _rewrite_plan(base[0], tmp_path / "deep900.parquet", meta={b"aspc.metrics": deep})
    assert _sub("check", plan, "--json").returncode == 0  # check accepts it
    p = _sub("inspect", plan, "--json")
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    if p.returncode == 0:
        json.loads(p.stdout)
    else:
        _assert_one_line_error(p.stdout + p.stderr, p.returncode)


def test_positions_match_a_brute_force_oracle():
    """Dense ids (looked up by index) and sparse ones (by search) alike: the last row holding each id, else -1."""
    from aspc.runtime.calibrate import _positions

    rng = np.random.default_rng(0)
    for _ in range(400):
        row = rng.integers(-5, int(rng.choice([8, 40, 10**6])), size=int(rng.integers(0, 30)))
        ids = rng.integers(-10, 60, size=int(rng.integers(0, 50)))
        want = [max((i for i, r in enumerate(row) if r == x), default=-1) for x in ids]
        assert _positions(row, ids).tolist() == want
