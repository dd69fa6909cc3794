"""Property-based fuzzing of the readers and of ``check`` on mutated plans.

Only aspc's own typed errors may escape. The default run uses a small number
of examples; ``make fuzz`` (marker ``fuzz``) runs >= 10,000 generated inputs.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspc.compiler import CompileConfig, InputOptions, compile_file
from aspc.emit import check_plan, read_plan, write_plan
from aspc.emit import schema as S
from aspc.errors import AspcError, PlanError
from aspc.io import read_lengths, read_prompts
from tests.conftest import lognormal_records, write_jsonl

FUZZ_EXAMPLES = int(os.environ.get("ASPC_FUZZ_EXAMPLES", "10000"))
SMALL = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
LARGE = settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))

json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "wizard", ""]), "content": st.one_of(st.text(max_size=30), json_scalar)}
)
record = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.text(max_size=6), st.integers(0, 5), json_value),
        "prompt": st.one_of(st.text(max_size=40), st.lists(message, max_size=3), json_value),
        "messages": st.lists(message, max_size=3),
        "lengths": st.one_of(
            st.integers(-5, 10**8), st.floats(allow_nan=True), st.lists(st.one_of(st.integers(-2, 5000), st.floats()), max_size=5), json_value
        ),
    },
)
line = st.one_of(
    record.map(lambda r: json.dumps(r, allow_nan=True)),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
    st.text(max_size=40),
)


def _read_any(tmp_path, lines, suffix, skip):
    p = tmp_path / f"fuzz{suffix}"
    p.write_bytes("\n".join(lines).encode("utf-8", errors="surrogatepass"))
    try:
        t = read_prompts(p, length_field="lengths", on_bad_line="skip" if skip else "error")
    except AspcError as exc:
        assert "\n" not in str(exc)
        return
    assert len(t) == len(set(t.ids)) >= 1
    assert all(np.all(np.isfinite(x)) and np.all(x >= 0) for x in t.lengths)


def _fuzz_readers(tmp_path_factory, lines, suffix, skip):
    _read_any(tmp_path_factory.mktemp("f"), lines, suffix, skip)


@SMALL
@given(lines=st.lists(line, max_size=8), suffix=st.sampled_from([".jsonl", ".json", ".csv", ".parquet"]), skip=st.booleans())
def test_reader_fuzz_small(tmp_path_factory, lines, suffix, skip):
    _fuzz_readers(tmp_path_factory, lines, suffix, skip)


@pytest.mark.fuzz
@LARGE
@given(lines=st.lists(line, max_size=8), suffix=st.sampled_from([".jsonl", ".json", ".csv", ".parquet"]), skip=st.booleans())
def test_reader_fuzz_large(tmp_path_factory, lines, suffix, skip):
    _fuzz_readers(tmp_path_factory, lines, suffix, skip)


def _fuzz_lengths(tmp_path_factory, lines):
    p = tmp_path_factory.mktemp("l") / "h.jsonl"
    p.write_bytes("\n".join(lines).encode("utf-8", errors="surrogatepass"))
    try:
        read_lengths(p, length_field="lengths")
    except AspcError:
        pass


@SMALL
@given(lines=st.lists(line, max_size=6))
def test_length_reader_fuzz_small(tmp_path_factory, lines):
    _fuzz_lengths(tmp_path_factory, lines)


@pytest.fixture(scope="module")
def base_plan(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    src = write_jsonl(d / "in.jsonl", lognormal_records(60, seed=5))
    plan = compile_file(src, InputOptions(length_field="lengths"), CompileConfig(batch_size=4, slack=1, group_size=3))
    write_plan(plan, d / "plan.parquet")
    return d / "plan.parquet"


_MUTABLE = [f.name for f in S.PLAN_SCHEMA]


@st.composite
def mutation(draw):
    kind = draw(st.sampled_from(["cell", "swap", "drop", "truncate", "flip", "meta"]))
    return kind, draw(st.integers(0, 10**9)), draw(st.integers(-(10**6), 10**6))


def _mutate(src, dst, kind, a, b):
    data = src.read_bytes()
    if kind == "truncate":
        dst.write_bytes(data[: a % len(data)])
        return True
    if kind == "flip":
        arr = bytearray(data)
        arr[a % len(arr)] ^= 1 + (abs(b) % 255)
        dst.write_bytes(bytes(arr))
        return True
    t = pq.read_table(src)
    meta = dict(t.schema.metadata)
    if kind == "meta":
        key = sorted(meta)[a % len(meta)]
        meta[key] = str(b).encode() if b % 2 else meta[key][: max(0, len(meta[key]) - 3)]
        pq.write_table(t.replace_schema_metadata(meta), dst)
        return True
    if kind == "drop":
        t = t.drop_columns([_MUTABLE[a % len(_MUTABLE)]])
    elif kind == "swap":
        i, j = a % t.num_rows, abs(b) % t.num_rows
        idx = np.arange(t.num_rows)
        idx[i], idx[j] = idx[j], idx[i]
        if i == j:
            return False
        t = t.take(idx)
    else:
        name = _MUTABLE[a % len(_MUTABLE)]
        col = t.column(name).to_pylist()
        r = abs(b) % t.num_rows
        old = col[r]
        col[r] = (old + (b % 7 or 1)) if isinstance(old, (int, float)) else (old or "") + "x"
        t = t.set_column(t.schema.get_field_index(name), name, pa.array(col, t.schema.field(name).type))
    pq.write_table(t.replace_schema_metadata(meta), dst)
    return True


def _check_mutation(base_plan, tmp_path_factory, mut):
    kind, a, b = mut
    dst = tmp_path_factory.mktemp("m") / "plan.parquet"
    changed = _mutate(base_plan, dst, kind, a, b)
    try:
        plan = read_plan(dst)
        res = check_plan(plan)
    except AspcError:
        return
    # A plan that reads and checks clean must hold exactly the original rows.
    if changed and kind in ("cell", "swap", "drop"):
        original = read_plan(base_plan).table
        assert plan.table.equals(original), f"undetected {kind} mutation"
    assert res.ok


@SMALL
@given(mut=mutation())
def test_check_detects_mutations_small(base_plan, tmp_path_factory, mut):
    _check_mutation(base_plan, tmp_path_factory, mut)


@pytest.mark.fuzz
@LARGE
@given(mut=mutation())
def test_check_detects_mutations_large(base_plan, tmp_path_factory, mut):
    _check_mutation(base_plan, tmp_path_factory, mut)


def test_every_cell_edit_is_detected(base_plan, tmp_path):
    """Exhaustive over columns: editing any single cell makes check fail."""
    for k in range(len(_MUTABLE)):
        dst = tmp_path / f"{k}.parquet"
        _mutate(base_plan, dst, "cell", k, 3)
        with pytest.raises(PlanError):
            check_plan(read_plan(dst))


# --------------------------------------------------------------------------- adversarial classes (issue 15)
# Line-separator characters, huge integers, plans stripped of their hash,
# numeric options at the edges, and signals at random moments. The reader
# classes hold with the columnar readers (scale helper's branch).

_SEPARATORS = "\u2028\u2029\u0085\x1c\x1d\x1e\x0b\x0c\r"
sep_text = st.text(alphabet=st.sampled_from(list(_SEPARATORS) + list("ab é")), min_size=1, max_size=12)


def _separator_case(tmp_path_factory, texts, as_list):
    recs = [
        {"id": f"r{i}", "prompt": f"p{t}q", "lengths": [i + 1, i + 2] if as_list else i + 1}
        for i, t in enumerate(texts)
    ]
    p = tmp_path_factory.mktemp("sep") / "in.jsonl"
    p.write_bytes("\n".join(json.dumps(r, ensure_ascii=False) for r in recs).encode("utf-8") + b"\n")
    t = read_prompts(p, length_field="lengths", on_bad_line="skip")
    assert len(t) == len(recs) and not t.skipped, "a valid line was split at a separator character"
    assert t.source_rows.tolist() == list(range(len(recs)))
    assert t.ids == [r["id"] for r in recs]


@pytest.mark.fuzz
@LARGE
@given(texts=st.lists(sep_text, min_size=1, max_size=6), as_list=st.booleans())
def test_line_separators_inside_strings_large(tmp_path_factory, texts, as_list):
    _separator_case(tmp_path_factory, texts, as_list)


huge_int = st.builds(
    lambda digits, neg: ("-" if neg else "") + "9" * digits, st.integers(19, 6000), st.booleans()
)


def _huge_case(tmp_path_factory, value, suffix, skip, in_list):
    d = tmp_path_factory.mktemp("huge")
    cell = f"[3, {value}]" if in_list else value
    if suffix == ".jsonl":
        body = '{"id": "a", "prompt": "x", "lengths": 5}\n' + f'{{"id": "b", "prompt": "y", "lengths": {cell}}}\n'
    elif suffix == ".json":
        body = f'[{{"id": "a", "prompt": "x", "lengths": 5}}, {{"id": "b", "prompt": "y", "lengths": {cell}}}]'
    else:
        body = "id,prompt,lengths\na,x,5\n" + f'b,y,"{cell}"\n'
    p = d / f"in{suffix}"
    p.write_text(body)
    for reader in (
        lambda: read_prompts(p, length_field="lengths", on_bad_line="skip" if skip else "error"),
        lambda: read_lengths(p, length_field="lengths"),
    ):
        try:
            reader()
        except AspcError as exc:
            assert "\n" not in str(exc)


@pytest.mark.fuzz
@LARGE
@given(value=huge_int, suffix=st.sampled_from([".jsonl", ".json", ".csv"]), skip=st.booleans(), in_list=st.booleans())
def test_huge_integer_lengths_large(tmp_path_factory, value, suffix, skip, in_list):
    _huge_case(tmp_path_factory, value, suffix, skip, in_list)


@st.composite
def unhashed_edit(draw):
    """A cell edit plus removal (or blanking) of the rows hash and maybe the metrics."""
    return (
        draw(st.integers(0, len(_MUTABLE) - 1)),
        draw(st.integers(1, 10**6)),
        draw(st.sampled_from(["drop", "blank"])),
        draw(st.booleans()),
    )


def _check_unhashed(base_plan, tmp_path_factory, edit):
    col, b, how, drop_metrics = edit
    dst = tmp_path_factory.mktemp("u") / "plan.parquet"
    _mutate(base_plan, dst, "cell", col, b)
    t = pq.read_table(dst)
    meta = dict(t.schema.metadata)
    if how == "drop":
        meta.pop(S.META_ROWS_HASH)
    else:
        meta[S.META_ROWS_HASH] = b""
    if drop_metrics:
        meta.pop(S.META_METRICS)
    pq.write_table(t.replace_schema_metadata(meta), dst)
    with pytest.raises(AspcError):
        check_plan(read_plan(dst))


@SMALL
@given(edit=unhashed_edit())
def test_check_without_hash_small(base_plan, tmp_path_factory, edit):
    _check_unhashed(base_plan, tmp_path_factory, edit)


@pytest.mark.fuzz
@LARGE
@given(edit=unhashed_edit())
def test_check_without_hash_large(base_plan, tmp_path_factory, edit):
    _check_unhashed(base_plan, tmp_path_factory, edit)


edge_float = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e305, -1e305, 1e6, 1e6 + 1, 0.0, -0.0, 5e-324]),
)
edge_int = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([0, -1, 1, 2**63 - 1, 2**63, 2**64]))


@pytest.fixture(scope="module")
def small_prompts(tmp_path_factory):
    from aspc.compiler import prepare

    src = write_jsonl(tmp_path_factory.mktemp("opts") / "in.jsonl", lognormal_records(48, seed=9))
    table, prediction, _ = prepare(src, InputOptions(length_field="lengths"), CompileConfig())
    return table, prediction


def _compile_with(small_prompts, kw):
    from aspc.compiler import compile_plan

    table, prediction = small_prompts
    try:
        plan = compile_plan(table, prediction, CompileConfig(**kw))
    except AspcError as exc:
        assert "\n" not in str(exc)
        return
    assert plan.n_rows == len(table)


option_values = st.fixed_dictionaries(
    {},
    optional={
        "minibatch_overhead": edge_float,
        "batch_size": st.one_of(st.integers(-3, 60), edge_int),
        "slack": st.one_of(st.integers(-2, 8), edge_int),
        "group_size": st.one_of(st.integers(-1, 20), edge_int),
        "seed": edge_int,
        "strategy": st.sampled_from(["asp", "sorted", "random"]),
        "anneal_iterations": st.one_of(st.integers(-5, 500), edge_int),
    },
)


@SMALL
@given(kw=option_values)
def test_numeric_options_small(small_prompts, kw):
    _compile_with(small_prompts, kw)


@pytest.mark.fuzz
@settings(max_examples=max(FUZZ_EXAMPLES // 5, 100), deadline=None, suppress_health_check=list(HealthCheck))
@given(kw=option_values)
def test_numeric_options_large(small_prompts, kw):
    _compile_with(small_prompts, kw)


@pytest.mark.fuzz
def test_sigterm_or_sigint_at_random_moments_during_compile(tmp_path):
    """Either a whole plan or nothing, and never a temporary left behind."""
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    src = write_jsonl(tmp_path / "in.jsonl", lognormal_records(60_000, seed=4, n_lengths=2))
    rng = np.random.default_rng(15)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    outcomes = []
    for trial in range(16):
        out = tmp_path / f"plan{trial}.parquet"
        proc = subprocess.Popen(
            [sys.executable, "-m", "aspc.cli", "compile", str(src), "--length-field", "lengths", "-o", str(out), "-q"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        time.sleep(float(rng.uniform(0.5, 6.0)))
        sig = signal.SIGTERM if trial % 2 == 0 else signal.SIGINT
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
        leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        assert not leftovers, leftovers
        if proc.returncode == 0:
            assert check_plan(read_plan(out)).ok
        else:
            assert proc.returncode == 128 + sig, err
            assert not out.exists()
            assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, err
        outcomes.append(proc.returncode)
    assert any(rc != 0 for rc in outcomes), "no signal landed mid-compile; lengthen the input"


def _exactly_once(run_dir, planned):
    import pyarrow.dataset as pads

    t = pads.dataset(str(run_dir / "samples")).to_table(columns=["prompt_id", "sample_index"])
    keys = set(zip(t.column("prompt_id").to_pylist(), t.column("sample_index").to_pylist(), strict=True))
    assert t.num_rows == len(keys) == planned, (t.num_rows, len(keys), planned)


class _SignalAfter:
    def __init__(self, sig, after):
        self.sig, self.after, self.seen = sig, after, 0

    def stage(self, name, total=None):
        pass

    def advance(self, n=1):
        self.seen += n
        if self.sig and self.seen >= self.after:
            sig, self.sig = self.sig, 0
            os.kill(os.getpid(), sig)

    def done(self):
        pass


def _interrupt_and_resume(tmp_path_factory, stops, flush):
    import signal

    from aspc import interrupt
    from aspc.errors import Interrupted
    from aspc.runtime import RunConfig, run
    from aspc.testing.plans import synthetic_plan

    table = synthetic_plan(240, 8, n_samples=2, seed=11)
    cfg = RunConfig(workers=3, global_batch=16, log_flush_seconds=flush)
    run_dir = tmp_path_factory.mktemp("sig") / "R"
    for i, after in enumerate(stops):
        sig = (signal.SIGTERM, signal.SIGINT)[i % 2]
        try:
            with interrupt.handlers():
                run(table, config=cfg, log_dir=run_dir, resume=i > 0, progress=_SignalAfter(sig, after))
        except Interrupted:
            meta = json.loads((run_dir / "meta.json").read_text())
            assert meta["status"] == "interrupted"
            assert not list(run_dir.rglob("*.tmp"))
    run(table, config=cfg, log_dir=run_dir, resume=True)
    assert json.loads((run_dir / "meta.json").read_text())["status"] == "complete"
    _exactly_once(run_dir, 480)


@pytest.mark.fuzz
@settings(max_examples=max(FUZZ_EXAMPLES // 100, 20), deadline=None, suppress_health_check=list(HealthCheck))
@given(stops=st.lists(st.integers(1, 30), min_size=1, max_size=4), flush=st.sampled_from([0.0, 0.001, 10.0]))
def test_signals_at_random_moments_during_run(tmp_path_factory, stops, flush):
    _interrupt_and_resume(tmp_path_factory, stops, flush)


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory):
    from click.testing import CliRunner

    from aspc.cli import main

    d = tmp_path_factory.mktemp("runs")
    src = write_jsonl(d / "in.jsonl", lognormal_records(1000, seed=12, n_lengths=4))
    r = CliRunner().invoke(
        main, ["compile", str(src), "--length-field", "lengths", "-n", "4", "-o", str(d / "plan.parquet"), "-q"]
    )
    assert r.exit_code == 0, r.output
    return d, src, d / "plan.parquet"


def _popen_run(args):
    import subprocess
    import sys

    from tests.conftest import ROOT

    return subprocess.Popen(
        [sys.executable, "-m", "aspc.cli", *args], env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


@pytest.mark.fuzz
def test_two_writers_and_process_signals_at_random_moments(run_inputs):
    """Two `aspc run --resume` on one log, started at random offsets, signalled at random:
    at most one writes; whatever happens, a last --resume completes with every sample once."""
    import signal
    import time

    d, src, plan = run_inputs
    rng = np.random.default_rng(16)
    for trial in range(8):
        run_dir = d / f"R{trial}"
        args = ["run", str(plan), "--actual-lengths", str(src), "--length-field", "lengths", "--log", str(run_dir),
                "--resume", "--log-flush-seconds", "0", "-q"]
        a = _popen_run(args)
        time.sleep(float(rng.uniform(0, 8)))
        b = _popen_run(args)
        time.sleep(float(rng.uniform(0, 8)))
        sig = [signal.SIGTERM, signal.SIGINT, signal.SIGKILL][trial % 3]
        for p in (a, b):
            if p.poll() is None:
                p.send_signal(sig)
        for p in (a, b):
            _, err = p.communicate(timeout=300)
            if p.returncode == 2:
                assert "locked by another aspc run" in err, err
            # -sig: the signal came after the command had finished and put
            # the default handlers back (interpreter shutdown): nothing to do.
            elif p.returncode not in (0, 128 + sig, -sig):
                raise AssertionError((p.returncode, err))
            if p.returncode in (128 + signal.SIGTERM, 128 + signal.SIGINT):
                assert "--resume" in err or "nothing was written" in err, err
        final = _popen_run(args)
        _, err = final.communicate(timeout=600)
        assert final.returncode == 0, err
        assert json.loads((run_dir / "meta.json").read_text())["status"] == "complete"
        _exactly_once(run_dir, 4000)
