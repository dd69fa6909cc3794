"""Re-planning during a run (``--replan``) and epochs (``--epochs``): nothing dispatched moves, nothing is lost."""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspc.cli import main
from aspc.compiler import CompileConfig, compile_plan
from aspc.emit import read_plan
from aspc.emit import schema as S
from aspc.emit.check import check_plan
from aspc.epochs import epoch_lengths, run_epochs
from aspc.errors import RunError
from aspc.io.prompts import PromptTable
from aspc.predict.base import LengthPrediction
from aspc.replan import OnlineReplanner
from aspc.runtime import RunConfig, run
from aspc.runtime.core.revise import revise_work
from aspc.runtime.work import work_from_table
from aspc.testing.plans import plan_table
from tests.conftest import trainer_failing_at

WORDS = ["explain", "list", "write", "code", "story", "short", "essay", "detail", "one", "word"]


def _data(n: int, seed: int):
    """Prompts whose length depends on their words; a predictor that knows nothing of it."""
    rng = np.random.default_rng(seed)
    ids = [f"p{i}" for i in range(n)]
    texts = [" ".join(rng.choice(WORDS, 4)) for _ in range(n)]
    level = np.array([5.0 + (1.5 if "essay" in t else 0) + (0.8 if "code" in t else 0) for t in texts])
    lens = {pid: np.maximum(1, rng.lognormal(level[i], 0.4, size=4)) for i, pid in enumerate(ids)}
    table = PromptTable(ids, texts, texts, np.arange(n, dtype=np.int64), np.full(n, 20, dtype=np.int64), None, "0" * 64)
    flat = LengthPrediction(*(np.full(n, 300.0) * f for f in (1.0, 0.5, 1.0, 2.0)))
    return table, lens, flat


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(1, 5), min_size=2, max_size=20), n_samples=st.integers(1, 3), data=st.data())
def test_revise_work_keeps_the_prefix_and_every_sample(sizes, n_samples, data):
    mb = np.repeat(np.arange(len(sizes)), sizes)
    work = work_from_table(plan_table(mb, n_samples=n_samples))
    first = data.draw(st.integers(0, len(sizes) - 1))
    r0 = int(work.row_offsets[first])
    before_ids = work.prompt_ids.copy()
    before_samples = [(before_ids[work.sample_row[i]], int(work.sample_index[i])) for i in range(work.n_total_samples)]
    tail = work.table.slice(r0)
    perm = data.draw(st.permutations(list(range(tail.num_rows))))
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, tail.num_rows - 1)), max_size=4))) - {tail.num_rows})
    new_mb = np.searchsorted(np.array(cuts), np.arange(tail.num_rows), side="right").astype(np.int32)
    tail = tail.take(pa.array(perm)).set_column(tail.schema.get_field_index(S.MINIBATCH), S.MINIBATCH, pa.array(new_mb))
    new_to_old = revise_work(work, first, tail)
    # Prefix untouched, every (prompt, sample) once, the map says where each came from.
    assert work.prompt_ids[:r0].tolist() == before_ids[:r0].tolist()
    assert np.array_equal(new_to_old[: work.sample_offsets[first]], np.arange(work.sample_offsets[first]))
    after = [(work.prompt_ids[work.sample_row[i]], int(work.sample_index[i])) for i in range(work.n_total_samples)]
    assert [before_samples[j] for j in new_to_old] == after
    assert work.n_minibatches == first + len(cuts) + 1


def test_replanned_run_logs_revisions_and_generates_every_sample_once(tmp_path):
    table, lens, flat = _data(480, 0)
    cfg = CompileConfig(samples_per_prompt=4, batch_size=8, workers=4)
    plan = compile_plan(table, flat, cfg)
    rc = RunConfig(workers=4, global_batch=32)
    rp = OnlineReplanner(plan.table, cfg, every_steps=4, log_dir=tmp_path / "run")
    res = run(plan, config=rc, actual_lengths=lens, replanner=rp, log_dir=tmp_path / "run")
    assert rp.revisions, "no revision happened"
    s = res.summary
    assert s.samples_generated == s.samples_planned == 1920
    mbs = ds.dataset(tmp_path / "run" / "minibatches").to_table().to_pydict()
    smp = ds.dataset(tmp_path / "run" / "samples").to_table().to_pydict()
    assert len(set(zip(smp["prompt_id"], smp["sample_index"], strict=True))) == 1920
    # A revision only defines minibatches at or after its first undispatched one.
    firsts = {r["revision"]: r["first_minibatch"] for r in rp.revisions}
    for m, r in zip(mbs["minibatch"], mbs["plan_revision"], strict=True):
        if r > 0:
            assert m >= firsts[r]
        later = [firsts[q] for q in firsts if q > r]
        if later:
            assert m < min(later) or r == max(firsts)
    for r in firsts:
        revised = read_plan(tmp_path / "run" / "plans" / f"revision-{r}.parquet")
        assert check_plan(revised).ok
    assert not any("--replan" in n for n in res.notes)


class _Windows(OnlineReplanner):
    """An online replanner that records the trainer step of every window it is asked at."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.asked: list[int] = []

    def revise(self, view):
        self.asked.append(view.step)
        return super().revise(view)


def test_a_resumed_replanned_run_keeps_the_windows_of_an_uninterrupted_one(tmp_path):
    # Windows fall every 4 trainer steps counted from the start of the run, not from where a
    # resume picked it up: a log stopped after 6 steps resumes with windows at 8, 12, ..., not 10, 14, ...
    table, lens, flat = _data(480, 0)
    cfg = CompileConfig(samples_per_prompt=4, batch_size=8, workers=4)
    plan = compile_plan(table, flat, cfg)
    rc = RunConfig(workers=4, global_batch=32, log_flush_seconds=0.0)
    log = tmp_path / "run"
    first = _Windows(plan.table, cfg, every_steps=4, log_dir=log)
    with pytest.raises(RunError, match="trainer lost"):
        run(plan, config=rc, actual_lengths=lens, replanner=first, log_dir=log, trainer=trainer_failing_at(6))
    assert first.asked == [4]
    again = _Windows(plan.table, cfg, every_steps=4, log_dir=log)
    res = run(plan, config=rc, actual_lengths=lens, replanner=again, log_dir=log, resume=True)
    assert res.summary.samples_generated == res.summary.samples_planned
    assert again.asked and all(step % 4 == 0 for step in again.asked), again.asked


def test_a_step_patched_on_the_sim_trainer_instance_runs_without_a_replanner(tmp_path):
    # A plain run (no replanner) takes the sim trainer's closed-form step cost only while its step is
    # the class's own: a step replaced on the instance (conftest's failing trainer) was skipped and the
    # run finished, so a test meant to stop part-way did not.
    table, lens, flat = _data(480, 0)
    cfg = CompileConfig(samples_per_prompt=4, batch_size=8, workers=4)
    plan = compile_plan(table, flat, cfg)
    rc = RunConfig(workers=4, global_batch=32, log_flush_seconds=0.0)
    with pytest.raises(RunError, match="trainer lost"):
        run(plan, config=rc, actual_lengths=lens, trainer=trainer_failing_at(3))


def test_a_run_too_short_to_revise_says_why(tmp_path):
    # 40 minibatches on 8 workers: by the first window fewer than 4 rounds of 8 are left, so
    # --replan keeps the plan; the run says so instead of silently doing nothing.
    table, lens, flat = _data(80, 0)
    cfg = CompileConfig(samples_per_prompt=4, batch_size=2, slack=0, workers=8)
    plan = compile_plan(table, flat, cfg)
    rp = OnlineReplanner(plan.table, cfg, every_steps=4)
    res = run(plan, config=RunConfig(workers=8, global_batch=32), actual_lengths=lens, replanner=rp)
    assert not rp.revisions
    (msg,) = [n for n in res.notes if n.startswith("--replan made no revision")]
    assert "trainer step 4" in msg and "fewer than 4 rounds of 8 workers" in msg and "--replan-every" in msg
    assert "\n" not in msg


def test_a_plan_no_window_could_revise_is_not_told_to_try_an_earlier_one():
    # 36 minibatches on 8 workers: 28 remain even after the first dispatch, under 4 rounds of 8; the
    # note's "--replan-every" hint could not work.
    table, lens, flat = _data(72, 0)
    cfg = CompileConfig(samples_per_prompt=4, batch_size=2, slack=0, workers=8)
    plan = compile_plan(table, flat, cfg)
    rp = OnlineReplanner(plan.table, cfg, every_steps=4)
    res = run(plan, config=RunConfig(workers=8, global_batch=32), actual_lengths=lens, replanner=rp)
    (msg,) = [n for n in res.notes if n.startswith("--replan made no revision")]
    assert "at least 40 for 8 workers; this plan has 36, so no window could revise it" in msg
    assert "--replan-every" not in msg


def test_run_and_simulate_say_when_replan_revised_nothing(tmp_path):
    # The short plan above through the CLI: `run --replan` and `simulate --strategies asp+replan` print the
    # note (stderr); with 4 times the prompts the first window revises and neither prints it.
    runner = CliRunner()
    for n_prompts, says in ((80, True), (320, False)):
        table, lens, _ = _data(n_prompts, 0)
        data = tmp_path / f"in{n_prompts}.jsonl"
        data.write_text("".join(json.dumps({"id": str(i), "prompt": t, "lengths": lens[i].tolist()}) + "\n"
                                for i, t in zip(table.ids, table.prompts, strict=True)))  # fmt: skip
        common = ["--actual-lengths", str(data), "--length-field", "lengths", "--workers", "8", "--global-batch", "32"]
        plan = tmp_path / f"plan{n_prompts}.parquet"
        r = runner.invoke(main, ["compile", str(data), "-n", "4", "-b", "2", "--slack", "0", "-o", str(plan), "--quiet"])
        assert r.exit_code == 0, r.output
        r = runner.invoke(main, ["run", str(plan), *common, "--replan", "--replan-every", "4"])
        assert r.exit_code == 0, r.output
        assert ("--replan made no revision" in r.stderr) == says, r.stderr
        r = runner.invoke(main, ["run", str(plan), *common, "--replan", "--replan-every", "4", "--epochs", "2",
                                 "--log", str(tmp_path / f"E{n_prompts}")])  # fmt: skip
        assert r.exit_code == 0, r.output
        assert ("epoch 1: --replan made no revision" in r.stderr) == says, r.stderr
        r = runner.invoke(main, ["simulate", str(data), *common[2:], "--samples-per-prompt", "4", "-b", "2",
                                 "--slack", "0", "--strategies", "asp,asp+replan"])  # fmt: skip
        assert r.exit_code == 0, r.output
        assert ("asp+replan: --replan made no revision" in r.stderr) == says, r.stderr


def test_replan_learns_what_the_predictor_did_not_know():
    # The plan's predictor is flat (no information); the run's observations
    # teach the correction which words make answers long.
    table, lens, flat = _data(960, 1)
    cfg = CompileConfig(samples_per_prompt=4, batch_size=8, workers=4)
    plan = compile_plan(table, flat, cfg)
    rc = RunConfig(workers=4, global_batch=32)
    plain = run(plan, config=rc, actual_lengths=lens).summary
    rp = OnlineReplanner(plan.table, cfg, every_steps=8)
    replanned = run(plan, config=rc, actual_lengths=lens, replanner=rp).summary
    assert replanned.lower_bound < 0.97 * plain.lower_bound
    assert replanned.mean_iteration_time < plain.mean_iteration_time


def test_replan_penalty_follows_what_the_returned_prompts_show():
    # Words that set the length: the held-out error picks a light penalty.
    # Lengths that are noise around the plan's predictions: a heavy one.
    from aspc.replan import RIDGE_LAMBDAS

    table, lens, flat = _data(600, 2)
    cfg = CompileConfig(samples_per_prompt=4, batch_size=8, workers=4)
    rp = OnlineReplanner(compile_plan(table, flat, cfg).table, cfg)
    obs = np.arange(400, dtype=np.int64)
    ids = rp_ids = list(table.ids)
    glob = np.array([rp._index[p] for p in rp_ids], dtype=np.int64)
    signal = np.log([lens[ids[i]].mean() for i in range(400)])
    noise = rp._offset[glob[obs]] + np.random.default_rng(0).normal(0, 0.4, 400)
    lam_signal = rp._choose_lambda(glob[obs], signal, 0)
    lam_noise = rp._choose_lambda(glob[obs], noise, 0)
    assert lam_signal in RIDGE_LAMBDAS and lam_noise in RIDGE_LAMBDAS
    assert lam_signal < lam_noise
    assert rp._choose_lambda(glob[obs], signal, 0) == lam_signal  # seeded: a resumed run chooses the same


def test_epochs_write_checkable_plans_and_per_epoch_metrics(tmp_path):
    table, lens, flat = _data(400, 2)
    cfg = CompileConfig(samples_per_prompt=4, batch_size=8, workers=4)
    plan = compile_plan(table, flat, cfg)
    res = run_epochs(plan, 3, tmp_path / "run", config=RunConfig(workers=4, global_batch=32), actual_lengths=lens)
    out = res.to_dict()
    assert [e["epoch"] for e in out["epochs"]] == [1, 2, 3]
    assert out["n_trainer_steps"] == sum(e["n_trainer_steps"] for e in out["epochs"])
    for k in (1, 2, 3):
        assert check_plan(read_plan(tmp_path / "run" / "plans" / f"epoch-{k}.parquet")).ok
    # History pins down each prompt: the second epoch's plan packs less padding.
    assert out["epochs"][1]["lower_bound"] < out["epochs"][0]["lower_bound"]


def test_commands_given_an_epochs_root_name_its_epoch_logs(tmp_path):
    from click.testing import CliRunner

    from aspc.cli import main
    from aspc.emit import write_plan

    table, lens, flat = _data(120, 3)
    plan = compile_plan(table, flat, CompileConfig(samples_per_prompt=2, batch_size=8))
    root = tmp_path / "run"
    run_epochs(plan, 2, root, config=RunConfig(workers=2, global_batch=16), actual_lengths=lens)
    write_plan(plan, tmp_path / "plan.parquet")
    want = f"epoch logs of 'aspc run --epochs': pass one, {root / 'epoch-1'} … {root / 'epoch-2'}"
    for args in (
        ["report", tmp_path / "plan.parquet", root, "-o", tmp_path / "rep"],
        ["calibrate", root, "-o", tmp_path / "c.json"],
        ["predict", "train", root, "-o", tmp_path / "pred"],
        ["predict", "eval", "default", root],
    ):
        if args[0] == "report" and importlib.util.find_spec("matplotlib") is None:
            continue  # needs matplotlib (pip install 'aspc[report]'): without it report says only that
        r = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
        assert r.exit_code == 2 and want in r.output, (args, r.output)
        assert len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "rep").exists() and not (tmp_path / "c.json").exists() and not (tmp_path / "pred").exists()


def test_epochs_with_replan_revise_each_epoch_and_keep_every_sample(tmp_path):
    table, lens, flat = _data(400, 2)
    cfg = CompileConfig(samples_per_prompt=4, batch_size=8, workers=4)
    plan = compile_plan(table, flat, cfg)
    res = run_epochs(
        plan, 2, tmp_path / "run", config=RunConfig(workers=4, global_batch=32), actual_lengths=lens, replan_every=1
    )
    for k, r in enumerate(res.runs, start=1):
        assert r.summary.samples_generated == r.summary.samples_planned == 1600
        revisions = sorted((tmp_path / "run" / f"epoch-{k}" / "plans").glob("revision-*.parquet"))
        assert revisions, f"epoch {k} was not re-planned"
        assert all(check_plan(read_plan(p)).ok for p in revisions)
        revs = r.columns["minibatches"]["plan_revision"]
        assert int(np.nanmax(np.asarray(revs, dtype=float))) == len(revisions)


def test_epoch_lengths_rotate_and_drift():
    got = epoch_lengths({"a": np.array([1.0, 2, 3, 4, 5])}, 2, 2, drift=0.5)["a"]
    assert got.tolist() == np.round([4.5, 6.0, 7.5, 2.0, 3.0]).tolist()
    with pytest.raises(Exception, match="length-drift"):
        run_epochs(None, 2, "x", config=RunConfig(), length_drift=-2)  # type: ignore[arg-type]


def _epoch_plans(root) -> dict[int, bytes]:
    return {k: (root / "plans" / f"epoch-{k}.parquet").read_bytes() for k in (1, 2, 3)}


def test_epochs_resume_continues_exactly_and_reads_back_complete_epochs(tmp_path):
    table, lens, flat = _data(400, 2)
    cfg = CompileConfig(samples_per_prompt=4, batch_size=8, workers=4)
    plan = compile_plan(table, flat, cfg)
    rc = RunConfig(workers=4, global_batch=32)
    ref = run_epochs(plan, 3, tmp_path / "ref", config=rc, actual_lengths=lens).to_dict()
    run_epochs(plan, 2, tmp_path / "run", config=rc, actual_lengths=lens)
    assert not (tmp_path / "run" / "plans" / "epoch-3.parquet").exists()
    got = run_epochs(plan, 3, tmp_path / "run", config=rc, actual_lengths=lens, resume=True).to_dict()
    assert got == ref  # epochs 1-2 read back from their complete logs, epoch 3 run fresh
    assert _epoch_plans(tmp_path / "run") == _epoch_plans(tmp_path / "ref")
    for k in (1, 2, 3):  # each epoch's log keeps its plan, for 'aspc predict train RUN/epoch-K'
        assert (tmp_path / "run" / f"epoch-{k}" / "plan.parquet").read_bytes() == _epoch_plans(tmp_path / "ref")[k]
    # Without --resume the stored epochs are not silently replaced.
    with pytest.raises(Exception, match="--resume to continue them"):
        run_epochs(plan, 3, tmp_path / "run", config=rc, actual_lengths=lens)


def test_epochs_resume_refuses_a_stored_plan_the_epochs_do_not_compile_to(tmp_path):
    from aspc.emit import write_plan
    from aspc.errors import ConfigError

    table, lens, flat = _data(400, 2)
    cfg = CompileConfig(samples_per_prompt=4, batch_size=8, workers=4)
    plan = compile_plan(table, flat, cfg)
    rc = RunConfig(workers=4, global_batch=32)
    run_epochs(plan, 2, tmp_path / "run", config=rc, actual_lengths=lens)
    stored = tmp_path / "run" / "plans" / "epoch-2.parquet"
    write_plan(compile_plan(table, flat, CompileConfig(samples_per_prompt=4, batch_size=8, workers=4, seed=9)), stored)
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=r"epoch-2\.parquet: not the plan epoch 2 compiles"):
        run_epochs(plan, 3, tmp_path / "run", config=rc, actual_lengths=lens, resume=True)
    # Nothing written: no epoch 3, every file as it was.
    assert {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before


def test_cli_epochs_sigkilled_in_epoch_two_resume_to_the_same_plans_and_samples(tmp_path):
    import time

    from tests.test_runtime_resume import TEST_DELAY_ENV, _cli, _kill_at, _plan_files, check_contract

    data, plan, want = _plan_files(tmp_path, 120)
    want = {k: max(1, v) for k, v in want.items()}  # epochs replay at least one token (epoch_lengths)

    def args(run_dir):
        return ["run", str(plan), "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "3",
                "--global-batch", "12", "--epochs", "3", "--log", str(run_dir), "--log-flush-seconds", "0.02",
                "--quiet", "--json"]

    ref = tmp_path / "REF"
    p = _cli(args(ref))
    assert p.wait() == 0, p.stderr.read()
    run_dir = tmp_path / "RUN"
    p = _cli(args(run_dir), env={TEST_DELAY_ENV: "0.02"})
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline:
        if any((run_dir / "epoch-2" / "minibatches").glob("part-*.parquet")):
            break
        time.sleep(0.01)
    assert _kill_at(p, 0.1), "the run finished before it was killed: the test would prove nothing"
    assert not (run_dir / "plans" / "epoch-3.parquet").exists()
    p = _cli([*args(run_dir), "--resume"])
    out, err = p.communicate()
    assert p.returncode == 0, err
    assert [e["epoch"] for e in json.loads(out)["epochs"]] == [1, 2, 3]

    def lengths(d):
        return {(r["prompt_id"], r["sample_index"]): r["response_len"] for r in check_contract(d, want, 12).values()}

    for k in (1, 2, 3):
        name = f"plans/epoch-{k}.parquet"
        assert (run_dir / name).read_bytes() == (ref / name).read_bytes(), name
        assert lengths(run_dir / f"epoch-{k}") == lengths(ref / f"epoch-{k}")


class _Recording(OnlineReplanner):
    """An online replanner recording the samples of every minibatch its revisions plan."""

    def revise(self, view):
        tail = super().revise(view)
        if tail is not None:
            mb = tail.column(S.MINIBATCH).to_numpy()
            per_row = view.work.n_samples[int(view.work.row_offsets[view.first_undispatched]):]
            self.sizes.extend(np.bincount(mb, weights=per_row).astype(int).tolist())
        return tail


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(120, 400),
    batch_size=st.sampled_from([None, 4, 8]),
    slack=st.sampled_from([None, 0, 2, 7]),
    n_samples=st.integers(1, 4),
    workers=st.integers(1, 4),
    every=st.integers(1, 3),
    k=st.integers(1, 3),
    mult=st.integers(1, 2),
    seed=st.integers(0, 5),
)
def test_replan_under_a_staleness_bound(n, batch_size, slack, n_samples, workers, every, k, mult, seed):
    # Every revision's minibatches fit the bound the replanner declared before the run (the staleness check
    # is sized by it, so none could be left unable to start), and every consumed sample's lag is <= K.
    if batch_size is not None and slack is not None and slack >= batch_size:
        slack = batch_size - 1
    table, lens, flat = _data(n, seed)
    lens = {p: v[:n_samples] for p, v in lens.items()}
    cfg = CompileConfig(samples_per_prompt=n_samples, batch_size=batch_size, slack=slack, workers=workers, seed=seed)
    plan = compile_plan(table, flat, cfg)
    rp = _Recording(plan.table, cfg, every_steps=every)
    rp.sizes = []
    bound = rp.largest_minibatch(work_from_table(plan.table))
    gb = -(-bound // k) * mult
    res = run(plan, config=RunConfig(workers=workers, global_batch=gb, max_staleness=k, seed=seed),
              actual_lengths=lens, replanner=rp)  # fmt: skip
    assert all(s <= bound for s in rp.sizes)
    s = res.summary
    assert s.samples_generated == s.samples_planned == n * n_samples
    assert s.policy_lag_max is None or s.policy_lag_max <= k


def test_replan_never_extrapolates_past_what_returned_prompts_needed():
    # Returned prompts of 1-3 lines whose answers grow with words x lines; the
    # remainder holds one prompt of 60 lines. The correction's
    # unpenalised length terms must not carry that trend out to it (once, on
    # CASTILLO, a 1e10-token prediction that stopped the run).
    from aspc.runtime.contracts import ReplanView

    rng = np.random.default_rng(3)
    n = 200
    lines = rng.integers(1, 4, n)
    texts = ["\n".join(" ".join(rng.choice(WORDS, int(rng.integers(1, 5)))) for _ in range(k)) for k in lines]
    texts[-1] = "\n".join(" ".join(rng.choice(WORDS, 8)) for _ in range(60))
    ids = [f"p{i}" for i in range(n)]
    base = np.full(n, 300.0)
    base[-1] = 1000.0  # predicted longest: dispatched last
    table = PromptTable(ids, texts, texts, np.arange(n, dtype=np.int64), np.full(n, 20, dtype=np.int64), None, "0" * 64)
    pred = LengthPrediction(base, base * 0.5, base, base * 2.0)
    cfg = CompileConfig(samples_per_prompt=2, batch_size=8, workers=2, order="ascending")
    plan = compile_plan(table, pred, cfg)
    work = work_from_table(plan.table)
    last = work.n_minibatches - 1
    assert work.prompt_ids[work.row_offsets[last] :].tolist().count(ids[-1]) == 1
    resp = np.full(work.n_total_samples, -1, dtype=np.int64)
    done = work.sample_offsets[last]
    size = np.array([len(texts[int(p[1:])].split()) * texts[int(p[1:])].count("\n") + 1 for p in work.prompt_ids])
    resp[:done] = np.round(30.0 * size[work.sample_row[:done]])
    rp = OnlineReplanner(plan.table, cfg)
    rest, revised = rp.predict_remainder(ReplanView(work, last, resp, 8, 0))
    row = int(np.flatnonzero(work.prompt_ids[rest] == ids[-1])[0])
    returned = [rp._index[p] for p in work.prompt_ids[: work.row_offsets[last]].tolist()]
    most = float(np.max(resp[:done].reshape(-1, 2).mean(axis=1) / rp._base.mean[returned]))
    assert np.isfinite(revised.mean).all()
    assert revised.mean[row] <= base[-1] * most * (1 + 1e-9)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(80, 240),
    order=st.sampled_from(["lpt", "ascending", "interleave"]),
    n_samples=st.integers(1, 3),
    share=st.floats(0.2, 0.8),
    seed=st.integers(0, 10_000),
)
def test_revisions_of_adversarial_prompts_and_lengths_stay_valid_and_bounded(n, order, n_samples, share, seed):
    # Prompts from empty to kilobytes and hundreds of lines, predictions over four decades, returned
    # lengths from 0 to a cap: a revision is a valid plan of exactly the remainder, and each prompt's
    # revised prediction is its plan prediction times a ratio some returned prompt showed.
    from aspc.runtime.contracts import ReplanView

    rng = np.random.default_rng(seed)
    shapes = rng.integers(0, 3, n)
    texts = [
        "" if s == 0 else "\n".join(" ".join(rng.choice(WORDS, int(rng.integers(1, 12)))) for _ in range(int(rng.integers(1, 8**s))))
        for s in shapes
    ]  # fmt: skip
    texts[int(rng.integers(n))] = "\n".join(" ".join(rng.choice(WORDS, 30)) for _ in range(300))
    ids = [f"p{i}" for i in range(n)]
    base = np.exp(rng.uniform(0, np.log(1e4), n))
    table = PromptTable(ids, texts, texts, np.arange(n, dtype=np.int64), np.full(n, 20, dtype=np.int64), None, "0" * 64)
    cfg = CompileConfig(samples_per_prompt=n_samples, batch_size=4, workers=2, order=order, seed=seed)
    plan = compile_plan(table, LengthPrediction(base, base * 0.3, base, base * 3.0), cfg)
    work = work_from_table(plan.table)
    first = max(1, min(work.n_minibatches - 1, int(share * work.n_minibatches)))
    done = int(work.sample_offsets[first])
    resp = np.full(work.n_total_samples, -1, dtype=np.int64)
    resp[:done] = np.where(rng.random(done) < 0.05, 4096, rng.integers(0, 4096, done))
    log = tempfile.TemporaryDirectory()
    rp = OnlineReplanner(plan.table, cfg, log_dir=log.name)
    got = rp.predict_remainder(ReplanView(work, first, resp, 8, 0))
    if got is None:
        return
    rest, revised = got
    assert np.isfinite(revised.mean).all() and (revised.mean > 0).all()
    r0 = int(work.row_offsets[first])
    obs_mean = resp[:done].reshape(-1, n_samples).mean(axis=1) if n_samples > 1 else resp[:done].astype(float)
    returned = [rp._index[p] for p in work.prompt_ids[:r0].tolist()]
    ratio = np.maximum(obs_mean, 1.0) / np.maximum(rp._base.mean[returned], 1.0)
    own = rp._base.mean[[rp._index[p] for p in work.prompt_ids[rest].tolist()]]
    assert (revised.mean <= own * ratio.max() * (1 + 1e-9)).all()
    assert (revised.mean >= own * ratio.min() * (1 - 1e-9)).all()
    tail = rp.revise(ReplanView(work, first, resp, 8, 0))
    if tail is not None:
        assert sorted(tail.column(S.PROMPT_ID).to_pylist()) == sorted(work.prompt_ids[r0:].tolist())
        assert check_plan(read_plan(Path(log.name) / "plans" / "revision-1.parquet")).ok
    log.cleanup()


def test_epoch_refit_is_bounded_like_a_revision():
    # The refit between epochs shares the revision's bound: a prompt no epoch observed, longer than every
    # observed one, gets a factor within the observed ratios.
    from aspc.replan import refit_factor

    rng = np.random.default_rng(4)
    texts = ["\n".join(" ".join(rng.choice(WORDS, int(rng.integers(1, 5)))) for _ in range(int(k))) for k in rng.integers(1, 4, 120)]
    texts.append("\n".join(" ".join(rng.choice(WORDS, 8)) for _ in range(60)))
    size = np.array([len(t.split()) * t.count("\n") + 1.0 for t in texts])
    obs = np.arange(120)
    y = np.log(30.0 * size[obs])
    f = refit_factor(texts, np.full(121, 300.0), obs, y)
    ratio = 30.0 * size[obs] / 300.0
    assert np.isfinite(f).all() and ratio.min() * (1 - 1e-9) <= f.min() and f.max() <= ratio.max() * (1 + 1e-9)


def test_a_damaged_revision_says_to_start_over_not_to_compile(tmp_path):
    # Before: the plan reader's advice, "compile it again with 'aspc compile'", which no revision can be.
    from aspc.errors import RunError
    from aspc.replan import read_revisions

    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "revision-1.parquet").write_bytes(b"PAR1 not a plan")
    with pytest.raises(RunError) as info:
        read_revisions(tmp_path, "--replan")
    msg = str(info.value)
    assert "revision-1.parquet: cannot resume with --replan" in msg and "not a readable Parquet file" in msg
    assert msg.endswith("the run log is damaged: start a new run with --overwrite") and "compile it" not in msg


def test_revisions_are_spaced_so_a_large_run_stays_linear(tmp_path):
    # A window every trainer step revised ~every window: 30,000 prompts made 458 revisions (166 s, an 826 MB
    # log of whole remainders), each refit and compile O(n). Now a revision needs 1/MAX_REVISIONS of the plan
    # dispatched since the previous one.
    from aspc.replan import MAX_REVISIONS

    table, lens, flat = _data(2400, 3)
    cfg = CompileConfig(samples_per_prompt=4, batch_size=4, workers=4)
    plan = compile_plan(table, flat, cfg)
    n_mb = len(set(plan.table.column(S.MINIBATCH).to_pylist()))
    rp = _Windows(plan.table, cfg, every_steps=1, log_dir=tmp_path / "run")
    res = run(plan, config=RunConfig(workers=4, global_batch=16), actual_lengths=lens, replanner=rp,
              log_dir=tmp_path / "run")  # fmt: skip
    assert len(rp.asked) > 4 * MAX_REVISIONS  # many windows ...
    assert 2 <= len(rp.revisions) <= MAX_REVISIONS + 1  # ... few revisions
    firsts = [r["first_minibatch"] for r in rp.revisions]
    assert all(b - a >= n_mb / MAX_REVISIONS for a, b in zip(firsts[:-1], firsts[1:], strict=True))
    assert len(list((tmp_path / "run" / "plans").glob("revision-*.parquet"))) == len(rp.revisions)
    assert res.summary.samples_generated == res.summary.samples_planned == 9600


def test_a_revision_does_not_keep_the_previous_plan_alive():
    # The kept rows were a slice of the previous table, whose last chunk is the previous revision's whole
    # remainder: every revision's buffers stayed alive (10,000 prompts: 190 MB of Arrow memory for a 3 MB plan).
    work = work_from_table(plan_table(np.repeat(np.arange(40), 5), n_samples=2))
    for first in range(1, 30, 3):
        r0 = int(work.row_offsets[first])
        tail = work.table.slice(r0)
        sizes = np.diff(work.row_offsets[first:])
        mb = np.repeat(np.arange(len(sizes)), sizes).astype(np.int32)
        tail = tail.set_column(tail.schema.get_field_index(S.MINIBATCH), S.MINIBATCH, pa.array(mb))
        revise_work(work, first, tail)
        assert max(work.table.column(c).num_chunks for c in work.table.column_names) <= 2
