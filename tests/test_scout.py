"""The length scout (aspc.scout, ``simulate --strategies asp+scout``, ``probe --batch-size``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.compiler import CompileConfig, InputOptions, compile_plan
from aspc.errors import ConfigError, InputError
from aspc.io.prompts import PromptTable
from aspc.io.ragged import RaggedLengths
from aspc.predict.base import LengthPrediction
from aspc.predict.metrics import kendall_tau
from aspc.runtime import RunConfig, run
from aspc.scout import after_scout, run_scout, scout_batch_size, scout_tokens, scouted_prediction, spare_lengths
from aspc.simulate import comparison_table, simulate_strategies

ROOT = Path(__file__).resolve().parents[1]


def _levels(n: int, seed: int, k: int, spread: float = 1.0, within: float = 0.25):
    """Prompts whose lengths differ a lot between prompts (level) and little within one (k samples each)."""
    rng = np.random.default_rng(seed)
    level = rng.normal(5.5, spread, size=n)
    ids = [f"p{i}" for i in range(n)]
    lens = {p: np.maximum(1.0, np.round(np.exp(level[i] + within * rng.normal(size=k)))) for i, p in enumerate(ids)}
    return ids, level, lens


def _write(path: Path, ids, lens, texts=None) -> Path:
    with open(path, "w") as f:
        for i, p in enumerate(ids):
            text = texts[i] if texts else f"question number {i}"
            f.write(json.dumps({"id": p, "prompt": text, "lengths": [int(x) for x in lens[p]]}) + "\n")
    return path


def test_scout_tokens_and_width():
    assert scout_tokens(4096) == 1024 and scout_tokens(None) == 1024 and scout_tokens(3) == 1
    assert scout_tokens(4096, 700) == 700 and scout_tokens(512, 700) == 512  # never past the response cap
    for bad in (0, -1, True, 1.5, 10**8):
        with pytest.raises(ConfigError):
            scout_tokens(4096, bad)
    assert scout_batch_size(2218, 8) == 256 and scout_batch_size(600, 8) == 75 and scout_batch_size(3, 8) == 1


def test_spare_lengths_take_the_first_length_the_run_does_not_replay():
    known = RaggedLengths.from_arrays([np.array([1.0, 2, 3, 40]), np.array([5.0, 6, 7, 80, 9])])
    assert spare_lengths(known, 3, ["a", "b"]).tolist() == [40.0, 80.0]
    with pytest.raises(InputError, match="1 of 2 prompts have only 4 for 4 samples"):
        spare_lengths(known, 4, ["a", "b"])


def test_one_scouted_length_ranks_prompts_a_flat_prior_cannot():
    ids, level, lens = _levels(400, 0, 5)
    n = len(ids)
    flat = LengthPrediction(*(np.full(n, 300.0) for _ in range(4)))
    table = PromptTable(ids, ids, ids, np.arange(n), np.full(n, 20), None, "0" * 64)
    scouted = spare_lengths(RaggedLengths.from_arrays([lens[p] for p in ids]), 4, ids)
    got = scouted_prediction(table, flat, scouted, {})
    assert kendall_tau(flat.mean, level) == 0.0
    assert kendall_tau(got.mean, level) > 0.7
    # What was never observed keeps the prior: an empty scout changes nothing.
    assert np.all(got.q10 <= got.q50) and np.all(got.q50 <= got.q90)


def test_after_scout_puts_the_epoch_behind_the_scout():
    ids, _, lens = _levels(300, 1, 5)
    n = len(ids)
    table = PromptTable(ids, ids, ids, np.arange(n), np.full(n, 20), None, "0" * 64)
    prior = LengthPrediction(*(np.full(n, 300.0) for _ in range(4)))
    cfg = CompileConfig(samples_per_prompt=4, workers=4, seed=0)
    rc = RunConfig(workers=4, global_batch=64, seed=0)
    spare = spare_lengths(RaggedLengths.from_arrays([lens[p] for p in ids]), 4, ids)
    scout = run_scout(table, prior, spare, cfg, rc, 128)
    # The scout replays the spare lengths cut at T, in wide minibatches, and trains nothing.
    got = np.sort(np.asarray(scout.columns["samples"]["response_len"]))
    assert np.array_equal(got, np.sort(np.minimum(spare, 128)))
    assert scout.summary.n_trainer_steps == 0 and scout.summary.n_reloads == 0
    assert scout.summary.n_minibatches == 4  # 300 prompts / 4 workers: 75 per minibatch
    epoch = run(compile_plan(table, prior, cfg), config=rc, actual_lengths={p: lens[p][:4] for p in ids})
    both = after_scout(scout, epoch, 4, 128)
    s, e, b = scout.summary, epoch.summary, both.summary
    assert b.makespan == pytest.approx(s.makespan + e.makespan)
    assert b.n_trainer_steps == e.n_trainer_steps and b.samples_consumed == e.samples_consumed
    assert b.n_minibatches == s.n_minibatches + e.n_minibatches
    last = float(np.max(epoch.columns["steps"]["end"]))
    assert b.mean_iteration_time == pytest.approx((s.makespan + last) / e.n_trainer_steps)
    assert b.mean_iteration_time > e.mean_iteration_time
    assert b.trainer_wait_fraction > e.trainer_wait_fraction  # the trainer idles through the scout
    assert b.policy_lag_max == e.policy_lag_max
    assert b.extra["scout"] == {"tokens": 128, "makespan": s.makespan, "n_minibatches": 4,
                                "responses_cut": int(np.count_nonzero(spare >= 128))}


def _wide_levels(tmp_path: Path, strategies: list[str], repeats: int):
    """800 prompts whose lengths differ widely, texts that say nothing of them: simulated results and table."""
    ids, _, lens = _levels(800, 2, 5, spread=1.0)
    path = _write(tmp_path / "in.jsonl", ids, lens)
    cfg = CompileConfig(samples_per_prompt=4, workers=4, max_response_length=4096)
    rc = RunConfig(workers=4, global_batch=64, max_new_tokens=4096)
    res = simulate_strategies(path, InputOptions(length_field="lengths"), cfg, rc, strategies=strategies,
                              repeats=repeats)  # fmt: skip
    return res, comparison_table(res)


def test_asp_scout_beats_asp_where_the_text_says_nothing(tmp_path):
    # Prompt texts carry no length information; prompts' lengths differ widely.
    # The scout learns them; its cost (one response per prompt, cut at T) is
    # counted; asp on the text prior is about random.
    res, table = _wide_levels(tmp_path, ["random", "asp", "asp+scout"], 3)
    asp, scout = (table[k]["mean_iteration_time_vs_random"] for k in ("asp", "asp+scout"))
    assert scout < asp - 0.05, json.dumps({"asp": asp, "asp+scout": scout})
    assert table["asp+scout"]["scout"]["tokens"] == 1024


def test_simulate_cli_asp_scout_json_is_deterministic(tmp_path):
    ids, _, lens = _levels(200, 3, 5)
    path = _write(tmp_path / "in.jsonl", ids, lens)
    args = ["simulate", str(path), "--length-field", "lengths", "--samples-per-prompt", "4", "--workers", "4",
            "--global-batch", "32", "--strategies", "random,asp+scout", "--scout-tokens", "200", "--json"]
    runner = CliRunner()
    first = runner.invoke(main, args)
    assert first.exit_code == 0, first.output
    d = json.loads(first.stdout)["strategies"]["asp+scout"]
    for key in ("mean_iteration_time", "makespan", "lower_bound", "policy_lag_max", "n_trainer_steps"):
        assert d[key] is not None
    assert d["scout"]["tokens"] == 200
    assert runner.invoke(main, args).stdout == first.stdout


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--strategies", "random,asp", "--scout-tokens", "5"], "applies to the asp+scout strategy"),
        (["--strategies", "asp+scout", "--scout-tokens", "0"], "--scout-tokens must be an integer"),
        (["--strategies", "asp+scout", "--samples-per-prompt", "5"], "record more lengths per prompt"),
        (["--strategies", "random,asp+scout", "--scout-keep-through", "2"], "applies to the asp+scout+keep strategy"),
        (["--strategies", "asp+scout+keep", "--scout-keep-through", "-1"], "must be an integer >= 0"),
    ],
)
def test_simulate_cli_asp_scout_bad_options_fail_in_one_line(tmp_path, extra, message):
    ids, _, lens = _levels(60, 4, 5)
    path = _write(tmp_path / "in.jsonl", ids, lens)
    r = CliRunner().invoke(main, ["simulate", str(path), "--length-field", "lengths", *extra])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_scout_refuses_history(tmp_path):
    ids, _, lens = _levels(60, 5, 5)
    path = _write(tmp_path / "in.jsonl", ids, lens)
    cfg = CompileConfig(samples_per_prompt=4, history=(str(path),), history_length_field="lengths")
    with pytest.raises(ConfigError, match="drop --history"):
        simulate_strategies(path, InputOptions(length_field="lengths"), cfg, RunConfig(), strategies=["asp+scout"])


def test_probe_as_a_scout_then_compile_with_its_history(tmp_path):
    # The real-run workflow of aspc.scout: probe every prompt once, cut at T, in
    # wide minibatches; compile the epoch with the probe's log as history.
    ids, level, lens = _levels(300, 6, 5)
    path = _write(tmp_path / "in.jsonl", ids, lens)
    runner = CliRunner()
    r = runner.invoke(main, ["probe", str(path), "--backend", "sim", "--actual-lengths", str(path), "--length-field",
                             "lengths", "--prompts", "1000", "--max-new-tokens", "400", "--batch-size", "100",
                             "--workers", "3", "--log", str(tmp_path / "scout"), "-o", str(tmp_path / "pred"),
                             "--quiet"])
    assert r.exit_code == 0, r.output
    import pyarrow.parquet as pq

    mbs = pq.read_table(tmp_path / "scout" / "plan.parquet").column("minibatch").to_numpy()
    assert np.bincount(mbs).min() >= 75  # wide: 100 ± 25 prompts per minibatch
    out = tmp_path / "plan.parquet"
    r = runner.invoke(main, ["compile", str(path), "--history", str(tmp_path / "scout"), "--samples-per-prompt", "4",
                             "-o", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    plan = pq.read_table(out)
    meta = json.loads(pq.read_schema(out).metadata[b"aspc.predictor"])
    assert meta["history_prompts_matched"] == 300
    order = {p: i for i, p in enumerate(ids)}
    pred = plan.column("predicted_len").to_numpy()
    truth = level[[order[p] for p in plan.column("prompt_id").to_pylist()]]
    assert kendall_tau(pred, truth) > 0.6
    assert pred.max() <= 400 * 1.5  # scouted lengths were cut at 400


def test_scout_on_a_real_model_then_compile_with_its_history(tmp_path):
    pytest.importorskip("torch", reason="needs torch: pip install 'aspc[hf]'")
    # The same pair with real generation (hf backend, a tiny random causal LM),
    # each response forced to its recorded length cut at T: the probe's wide
    # minibatches and its cut reach a real backend, and the log plans the epoch.
    from tests.realmodel import run_log_samples, tiny_model

    ids, _, lens = _levels(60, 7, 5, spread=0.8)
    lens = {p: np.maximum(1, np.round(v / 40)) for p, v in lens.items()}  # ~6 tokens: a fast real run
    path = _write(tmp_path / "in.jsonl", ids, lens)
    log = tmp_path / "scout"
    r = CliRunner().invoke(main, ["probe", str(path), "--backend", "hf", "--model", str(tiny_model(tmp_path)),
                                  "--replay-lengths", "--actual-lengths", str(path), "--length-field", "lengths",
                                  "--max-new-tokens", "8", "--batch-size", "30", "--workers", "1",
                                  "--log", str(log), "-o", str(tmp_path / "pred"), "--quiet"])
    assert r.exit_code == 0, r.output
    got = {(s["prompt_id"]): s["response_len"] for s in run_log_samples(log)}
    assert got == {p: int(min(lens[p][0], 8)) for p in ids}
    assert len({s["minibatch"] for s in run_log_samples(log)}) == 2  # 60 prompts, 30 per minibatch
    out = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(path), "--history", str(log), "-o", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    import pyarrow.parquet as pq

    assert json.loads(pq.read_schema(out).metadata[b"aspc.predictor"])["history_prompts_matched"] == 60


def _run_scout_args(plan: Path, data: Path, log: Path, *extra: str) -> list[str]:
    return ["run", str(plan), "--scout", "--samples-per-prompt", "4", "--workers", "4", "--global-batch", "32",
            "--max-new-tokens", "2000", "--actual-lengths", str(data), "--length-field", "lengths", "--log", str(log),
            "--json", "--quiet", *extra]  # fmt: skip


def test_run_scout_is_simulate_asp_scout_and_resumes(tmp_path):
    # `aspc run PLAN --scout` runs the same scout and epoch as `simulate --strategies asp+scout` (one
    # machinery: aspc.scout's plan and run settings), writes them as logs, and resumes exactly.
    import pyarrow.parquet as pq

    ids, level, lens = _levels(240, 8, 5)
    data = _write(tmp_path / "in.jsonl", ids, lens)
    plan = tmp_path / "plan.parquet"
    runner = CliRunner()
    r = runner.invoke(main, ["compile", str(data), "--samples-per-prompt", "4", "--workers", "4", "-o", str(plan),
                             "--quiet"])  # fmt: skip
    assert r.exit_code == 0, r.output
    log = tmp_path / "RUN"
    first = runner.invoke(main, _run_scout_args(plan, data, log))
    assert first.exit_code == 0, first.output
    out = json.loads(first.stdout)
    sc = out["scout"]
    assert sc["tokens"] == 500 and sc["responses"] == 240  # the cap / 4, one response per prompt
    assert out["run_time"] == pytest.approx(sc["run_time"] + out["epochs"][0]["run_time"])
    # The scout took no trainer step and replayed each prompt's 5th recorded length, cut at T.
    from tests.realmodel import run_log_samples

    scouted = {s["prompt_id"]: s["response_len"] for s in run_log_samples(log / "scout")}
    assert scouted == {p: int(min(lens[p][4], 500)) for p in ids}
    assert pq.read_table(log / "scout" / "steps").num_rows == 0
    # Epoch 1 ran the plan compiled from the scout: it ranks the prompts' levels as one sample can.
    e1 = pq.read_table(log / "plans" / "epoch-1.parquet")
    order = {p: i for i, p in enumerate(ids)}
    assert kendall_tau(e1.column("predicted_len").to_numpy(), level[[order[p] for p in e1.column("prompt_id").to_pylist()]]) > 0.6
    assert runner.invoke(main, ["check", str(log / "plans" / "epoch-1.parquet")]).exit_code == 0
    sim = runner.invoke(main, ["simulate", str(data), "--length-field", "lengths", "--samples-per-prompt", "4",
                               "--workers", "4", "--global-batch", "32", "--max-new-tokens", "2000",
                               "--strategies", "asp+scout", "--json", "--quiet"])  # fmt: skip
    assert sim.exit_code == 0, sim.output
    s = json.loads(sim.stdout)["strategies"]["asp+scout"]
    assert out["mean_iteration_time"] == pytest.approx(s["mean_iteration_time"], rel=1e-9)
    # Resumed (whole, and after losing epoch 1's log): the same figures, the scout not run again.
    assert runner.invoke(main, _run_scout_args(plan, data, log, "--resume")).stdout == first.stdout
    import shutil

    shutil.rmtree(log / "epoch-1")
    again = runner.invoke(main, _run_scout_args(plan, data, log, "--resume"))
    assert again.exit_code == 0, again.output
    assert again.stdout == first.stdout


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--scout-tokens", "5"], "pass --scout too"),
        (["--scout", "--scout-tokens", "0", "--log", "RUN"], "--scout-tokens must be an integer"),
        (["--scout"], "pass --log RUN"),
        (["--scout", "--samples-per-prompt", "5", "--log", "RUN"], "record more lengths per prompt"),
        (["--scout-keep"], "pass --scout too"),
        (["--scout", "--scout-keep-through", "1", "--log", "RUN"], "pass --scout-keep too"),
        (["--scout", "--scout-keep", "--scout-keep-through", "-2", "--log", "RUN"], "must be an integer >= 0"),
        (["--scout", "--scout-keep", "--replan", "--log", "RUN"], "does not combine with --replan"),
        (["--scout", "--scout-keep", "--backend", "hf", "--log", "RUN"], "--scout-roll --scout-windows 1 scouts every"),
    ],
)
def test_run_scout_bad_options_fail_in_one_line_and_write_nothing(tmp_path, extra, message, monkeypatch):
    ids, _, lens = _levels(60, 9, 5)
    data = _write(tmp_path / "in.jsonl", ids, lens)
    plan = tmp_path / "plan.parquet"
    assert CliRunner().invoke(main, ["compile", str(data), "-o", str(plan), "--quiet"]).exit_code == 0
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["run", str(plan), "--actual-lengths", str(data), "--length-field", "lengths", *extra])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "RUN").exists()


def test_run_scout_on_a_real_model_cuts_the_scout_only(tmp_path):
    pytest.importorskip("torch", reason="needs torch: pip install 'aspc[hf]'")
    # hf backend, a tiny random causal LM, responses forced to their recorded lengths: the scout's
    # responses stop at T, the epoch's at the run's cap again (the backend's options are restored).
    from tests.realmodel import run_log_samples, tiny_model

    ids, _, lens = _levels(24, 10, 5, spread=0.8)
    lens = {p: np.maximum(1, np.round(v / 12)) for p, v in lens.items()}  # ~20 tokens: a fast real run
    data = _write(tmp_path / "in.jsonl", ids, lens)
    plan = tmp_path / "plan.parquet"
    runner = CliRunner()
    assert runner.invoke(main, ["compile", str(data), "--samples-per-prompt", "2", "-o", str(plan), "--quiet"]).exit_code == 0
    log = tmp_path / "RUN"
    r = runner.invoke(main, ["run", str(plan), "--backend", "hf", "--model", str(tiny_model(tmp_path)),
                             "--replay-lengths", "--actual-lengths", str(data), "--length-field", "lengths",
                             "--samples-per-prompt", "2", "--workers", "2", "--global-batch", "8",
                             "--max-new-tokens", "40", "--scout", "--scout-tokens", "8", "--log", str(log),
                             "--json", "--quiet"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["scout"]["tokens"] == 8
    scouted = {s["prompt_id"]: s["response_len"] for s in run_log_samples(log / "scout")}
    assert scouted == {p: int(min(lens[p][2], 8)) for p in ids}
    epoch = run_log_samples(log / "epoch-1")
    assert len(epoch) == 48
    assert max(s["response_len"] for s in epoch) == int(min(max(max(v[:2]) for v in lens.values()), 40)) > 8


def test_a_signal_during_the_scout_says_how_to_resume(tmp_path):
    # The scout's log is the one a signal stops before epoch 1 starts; the message points at it.
    import signal

    from aspc.cli.run import _interrupted_message
    from aspc.interrupt import Interrupted

    (tmp_path / "scout").mkdir()
    (tmp_path / "scout" / "meta.json").write_text(json.dumps({"status": "interrupted"}))
    msg = _interrupted_message(Interrupted(signal.SIGTERM), tmp_path)
    assert "marked interrupted" in msg and "--resume" in msg and "\n" not in msg


def _carry_setup(n_rows: int = 120, k: int = 4):
    ids, _, lens = _levels(n_rows, 6, k + 1)
    table = PromptTable(ids, ids, ids, np.arange(n_rows), np.full(n_rows, 20), None, "0" * 64)
    mean = np.array([lens[p].mean() for p in ids])
    pred = LengthPrediction(mean, mean * 0.7, mean, mean * 1.4)
    plan = compile_plan(table, pred, CompileConfig(samples_per_prompt=k, workers=4, seed=0))
    order = plan.table.column("prompt_id").to_pylist()
    kept = np.array([int(lens[p][k]) if i % 3 else -1 for i, p in enumerate(order)], dtype=np.int64)
    return plan, lens, order, kept


def test_carried_responses_cost_no_decode_steps():
    # A minibatch whose rows each carry one response takes exactly as long as
    # the same minibatch with one sample fewer on those rows: the kernel's
    # closed form drops a zero-length sequence before the first decode step.
    from aspc.runtime.backends.sim import SimBackend, minibatch_times
    from aspc.runtime.backends.sim_cost import SimCostModel
    from aspc.runtime.carry import carry
    from aspc.runtime.work import work_from_table

    plan, lens, order, _ = _carry_setup()
    every = np.full(len(order), 7, dtype=np.int64)
    full, fewer = work_from_table(plan.table), work_from_table(plan.table, samples_per_prompt=3)
    ids = carry(full, every)
    assert ids.size == len(order) and np.all(full.sample_index[ids] == 3)
    cost = SimCostModel()

    def replayed(w):
        return np.array([lens[order[r]][i] for r, i in zip(w.sample_row, w.sample_index, strict=True)], np.int64)

    backend = SimBackend(cost, replayed(full))
    backend.setup(full, 4)
    got = [backend.generate(0, full.minibatch(m)) for m in range(full.n_minibatches)]
    d_fewer, _ = minibatch_times(fewer, replayed(fewer), cost)
    np.testing.assert_allclose([g.elapsed for g in got], d_fewer, rtol=1e-12)
    prefill = cost.prefill_base + cost.prefill_per_token * np.add.reduceat(full.prompt_tokens, full.row_offsets[:-1])
    finish = np.concatenate([g.finish_offset for g in got])
    mb = np.repeat(np.arange(full.n_minibatches), full.minibatch_sizes)
    np.testing.assert_allclose(finish[ids], prefill[mb[ids]], rtol=1e-12)  # they finish at prefill
    assert np.all(np.concatenate([g.response_len for g in got])[ids] == 7)  # with the carried length
    assert backend.known_timing() is None  # the one-call kernel knows no per-sample version
    with pytest.raises(Exception, match="carried lengths for"):
        carry(full, every[:-1])


def test_carried_responses_are_consumed_with_version_zero(tmp_path):
    plan, lens, order, kept = _carry_setup()
    rc = RunConfig(workers=4, global_batch=40, seed=0, reload_time=0.0)
    actual = {p: lens[p] for p in order}
    res = run(plan, config=rc, actual_lengths=actual, carried=kept, log_dir=tmp_path / "RUN")
    # The log's summary counts them too, and a complete log read back says the same.
    assert json.loads((tmp_path / "RUN" / "meta.json").read_text())["summary"]["samples_carried"] == np.count_nonzero(
        kept >= 0
    )
    again = run(plan, config=rc, actual_lengths=actual, carried=kept, log_dir=tmp_path / "RUN", resume=True)
    assert again.summary.extra["samples_carried"] == res.summary.extra["samples_carried"]
    base = run(plan, config=rc, actual_lengths=actual)
    from aspc.runtime.work import work_from_table

    smp = res.columns["samples"]  # by global sample id
    rows = work_from_table(plan.table).sample_row
    is_kept = (np.asarray(smp["sample_index"]) == 3) & (kept[rows] >= 0)
    assert is_kept.sum() == np.count_nonzero(kept >= 0)
    assert np.array_equal(np.asarray(smp["response_len"])[is_kept], kept[rows[is_kept]])
    assert np.all(np.asarray(smp["weights_version"])[is_kept] == 0)
    step = np.asarray(smp["consumed_step"])
    lag = np.asarray(smp["policy_lag"])
    assert np.all(lag[is_kept & (step >= 0)] == step[is_kept & (step >= 0)])
    assert res.summary.samples_planned == base.summary.samples_planned  # the groups stay whole
    assert res.summary.policy_lag_max == int(lag.max())
    assert res.summary.makespan < base.summary.makespan  # a third of the prompts generate one sample fewer
    assert res.summary.extra["samples_carried"] == np.count_nonzero(kept >= 0)


@pytest.mark.parametrize("through", [0, 1, 3])
def test_carries_past_the_version_bound_are_generated_afresh(through):
    from aspc.runtime.work import work_from_table

    plan, lens, order, kept = _carry_setup(240)
    rc = RunConfig(workers=4, global_batch=40, seed=1)
    res = run(plan, config=rc, actual_lengths={p: lens[p] for p in order}, carried=kept, carry_through=through)
    work = work_from_table(plan.table)
    smp, mbs = res.columns["samples"], res.columns["minibatches"]
    mb = np.asarray(smp["minibatch"])
    version = np.asarray(mbs["weights_version"])[mb]  # of the minibatch each sample belongs to
    wanted = (work.sample_index == 3) & (kept[work.sample_row] >= 0)
    late = wanted & (version > through)
    assert late.any() and (wanted & ~late).any()  # both cases occur in this run
    replayed = np.array([lens[order[r]][3] for r in work.sample_row[late]], dtype=np.int64)
    assert np.array_equal(np.asarray(smp["response_len"])[late], replayed)  # generated afresh
    assert np.all(np.asarray(smp["weights_version"])[late] == version[late])
    assert np.all(np.asarray(smp["weights_version"])[wanted & ~late] == 0)  # kept
    assert res.summary.extra["samples_carried"] == int(np.count_nonzero(wanted & ~late))


@pytest.mark.parametrize("seed", range(6))
def test_kept_responses_meet_the_staleness_bound(seed):
    # Under --max-staleness K only minibatches dispatched by version 0 keep theirs,
    # and those are consumed by step K: policy lag <= K for every sample, always.
    rng = np.random.default_rng(seed)
    plan, lens, order, kept = _carry_setup(int(rng.integers(60, 240)))
    k = int(rng.choice([1, 2, 4]))
    largest = int(np.max(np.bincount(plan.table.column("minibatch").to_numpy()))) * 4  # samples
    gb = max(int(rng.choice([8, 20, 40])), -(-largest // k))  # a minibatch must fit K batches to start
    rc = RunConfig(workers=int(rng.integers(1, 6)), global_batch=gb, max_staleness=k, seed=seed)
    res = run(plan, config=rc, actual_lengths={p: lens[p] for p in order}, carried=kept, carry_through=None)
    lag = np.asarray(res.columns["samples"]["policy_lag"])
    assert lag.max() <= k, (k, int(lag.max()))
    assert res.summary.extra["samples_carried"] > 0


def test_asp_scout_keep_beats_asp_scout(tmp_path):
    res, table = _wide_levels(tmp_path, ["random", "asp+scout", "asp+scout+keep"], 2)
    scout, keep = (table[k]["mean_iteration_time_vs_random"] for k in ("asp+scout", "asp+scout+keep"))
    # Most responses here finish under the 1,024-token cut, so a quarter of the
    # epoch's sequences are not generated; a decode step's cost is mostly per
    # step, not per sequence, so that saves ~5% of the workers' time (measured).
    assert keep < scout - 0.01, json.dumps({"asp+scout": scout, "asp+scout+keep": keep})
    busy = {k: [float(np.sum(np.asarray(r.columns["minibatches"]["end"]) - r.columns["minibatches"]["start"]))
                for r in res[k]] for k in ("asp+scout", "asp+scout+keep")}
    assert all(b < 0.97 * a for a, b in zip(busy["asp+scout"], busy["asp+scout+keep"], strict=True)), busy
    assert table["asp+scout+keep"]["policy_lag_max"] >= table["asp+scout"]["policy_lag_max"]
    for r in res["asp+scout+keep"]:
        info = r.summary.extra["scout"]
        assert info["responses_kept"] == 800 - info["responses_cut"]  # every finished one, none cut


def test_simulate_cli_scout_keep_json(tmp_path):
    ids, _, lens = _levels(200, 4, 5)
    path = _write(tmp_path / "in.jsonl", ids, lens)
    args = ["simulate", str(path), "--length-field", "lengths", "--samples-per-prompt", "4", "--workers", "4",
            "--global-batch", "32", "--strategies", "random,asp+scout+keep", "--json"]
    runner = CliRunner()
    out, stdout = {}, {}
    for extra in ([], ["--scout-keep-through", "1"], ["--max-staleness", "4"]):
        r = runner.invoke(main, [*args, *extra])
        assert r.exit_code == 0, r.output
        stdout[" ".join(extra)] = r.stdout
        out[" ".join(extra)] = json.loads(r.stdout)["strategies"]["asp+scout+keep"]
    every, bounded, stale = out.values()
    assert every["scout"]["responses_kept"] > bounded["scout"]["responses_kept"] > 0
    assert stale["policy_lag_max"] <= 4 < every["policy_lag_max"]
    again = runner.invoke(main, [*args, "--scout-keep-through", "1"])
    assert again.stdout == stdout["--scout-keep-through 1"]  # same input and seed, same report




def _keep_args(plan: Path, data: Path, log: Path, *extra: str) -> list[str]:
    return ["run", str(plan), "--actual-lengths", str(data), "--length-field", "lengths", "--samples-per-prompt", "2",
            "--workers", "3", "--global-batch", "12", "--scout", "--scout-tokens", "60", "--scout-keep",
            "--scout-keep-through", "2", "--log", str(log), "--log-flush-seconds", "0.02", "--quiet", *extra]


def _committed_minibatches(run_dir: Path) -> set[int]:
    """Minibatches a (killed) run log has committed: a resume keeps them as they were."""
    from aspc.runtime import read_run_log

    if not (run_dir / "meta.json").exists():
        return set()
    log = read_run_log(run_dir, allow_incomplete=True)
    return set(log.tables["minibatches"].column("minibatch").to_pylist())


def _keep_rows(log: Path, lens: dict, through: int) -> dict:
    """Epoch 1's sample rows by (prompt, sample index), checked against the keep rules."""
    import pyarrow.dataset as ds

    scouted = {r["prompt_id"]: r["response_len"] for r in ds.dataset(str(log / "scout" / "samples")).to_table().to_pylist()}
    rows = ds.dataset(str(log / "epoch-1" / "samples")).to_table().to_pylist()
    mbs = ds.dataset(str(log / "epoch-1" / "minibatches")).to_table().to_pydict()
    mb_version = dict(zip(mbs["minibatch"], mbs["weights_version"], strict=True))
    by_key = {(r["prompt_id"], r["sample_index"]): r for r in rows}
    assert len(by_key) == len(rows) == 2 * len(lens)  # every sample once
    for (p, i), r in by_key.items():
        kept = i == 1 and scouted[p] < 60 and mb_version[r["minibatch"]] <= through
        want_len, want_version = (scouted[p], 0) if kept else (int(lens[p][i]), mb_version[r["minibatch"]])
        assert (r["response_len"], r["weights_version"]) == (want_len, want_version), (p, i, r)
        if r["consumed_step"] is not None:
            assert r["policy_lag"] == r["consumed_step"] - r["weights_version"]
    return by_key


def test_run_scout_keep_is_simulate_and_resumes_after_sigkill(tmp_path):
    # `aspc run --scout --scout-keep` replays what `simulate --strategies asp+scout+keep` does, logs each
    # kept response as its group's sample (weights version 0), and after a SIGKILL mid-epoch resumes to
    # the same samples: what the log shows was dispatched past --scout-keep-through stays generated afresh.
    from aspc.runtime.engines.virtual import TEST_DELAY_ENV
    from tests.test_runtime_resume import _cli, _kill_mid_run

    ids, _, lens = _levels(120, 11, 3, spread=0.6)
    lens = {p: np.maximum(1, np.round(v / 4)) for p, v in lens.items()}  # ~60 tokens: some scouts cut at 60
    data = _write(tmp_path / "in.jsonl", ids, lens)
    plan = tmp_path / "plan.parquet"
    runner = CliRunner()
    assert runner.invoke(main, ["compile", str(data), "--samples-per-prompt", "2", "--workers", "3", "-o", str(plan),
                                "--quiet"]).exit_code == 0  # fmt: skip
    ref = tmp_path / "REF"
    first = runner.invoke(main, [*_keep_args(plan, data, ref), "--json"])
    assert first.exit_code == 0, first.output
    out = json.loads(first.stdout)
    ref_rows = _keep_rows(ref, lens, 2)
    assert 0 < out["scout"]["responses_kept"] < 120 - out["scout"]["responses_cut"]  # some kept, some aged out
    sim = runner.invoke(main, ["simulate", str(data), "--length-field", "lengths", "--samples-per-prompt", "2",
                               "--workers", "3", "--global-batch", "12", "--strategies", "asp+scout+keep",
                               "--scout-tokens", "60", "--scout-keep-through", "2", "--json", "--quiet"])  # fmt: skip
    assert sim.exit_code == 0, sim.output
    s = json.loads(sim.stdout)["strategies"]["asp+scout+keep"]
    assert out["mean_iteration_time"] == pytest.approx(s["mean_iteration_time"], rel=1e-9)
    assert out["scout"]["responses_kept"] == s["scout"]["responses_kept"]
    assert runner.invoke(main, [*_keep_args(plan, data, ref, "--resume"), "--json"]).stdout == first.stdout
    killed = 0
    for seed in range(2):
        log = tmp_path / f"RUN{seed}"
        p = _cli(_keep_args(plan, data, log), env={TEST_DELAY_ENV: "0.02"})
        killed += _kill_mid_run(p, log / "epoch-1", float(np.random.default_rng(seed).uniform(0.0, 0.8)))
        before = _committed_minibatches(log / "epoch-1")
        p = _cli(_keep_args(plan, data, log, "--resume"))
        _, err = p.communicate()
        assert p.returncode == 0, err
        rows = _keep_rows(log, lens, 2)  # every sample once, each kept or not by its logged dispatch version
        # What was in flight at the kill is dispatched again, perhaps past version 2 where the uninterrupted
        # run kept it: only the committed minibatches' samples must be the reference's.
        assert rows.keys() == ref_rows.keys()
        same = {k: r["response_len"] for k, r in rows.items() if r["minibatch"] in before}
        assert same == {k: ref_rows[k]["response_len"] for k in same}
    assert killed >= 1  # else this proves nothing
    # Another keep setting cannot resume this log (one line).
    other = _keep_args(plan, data, ref, "--resume")
    i = other.index("--scout-keep-through")
    r = runner.invoke(main, other[:i] + other[i + 2 :])  # keep every finished one this time
    assert r.exit_code == 2 and "--scout-keep (" in r.output and len(r.output.strip().splitlines()) == 1, r.output


@pytest.mark.parametrize("extra", [(), ("--scout-roll",)], ids=["scout", "roll"])
def test_run_scout_takes_a_verl_plan(tmp_path, extra):
    # The scout (and a rolling scout's windows) run in aspc's runtime: before, their wide unequal
    # minibatches went through --for verl's equal-groups check, so every verl plan was refused with
    # "use --slack 0", an option `run` does not have.
    import pyarrow.parquet as pq

    ids, _, lens = _levels(160, 3, 5)
    data = _write(tmp_path / "in.jsonl", ids, lens)
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--for", "verl", "-b", "8", "--group-size", "4",
                                  "--max-response-length", "2000", "-n", "4", "-o", str(plan), "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    log = tmp_path / "RUN"
    r = CliRunner().invoke(main, [*_run_scout_args(plan, data, log), *extra])
    assert r.exit_code == 0, r.output
    e1 = pq.read_table(log / "plans" / "epoch-1.parquet").column("minibatch").to_numpy()
    if not extra:  # the epoch's own plan keeps the verl shape: minibatches of exactly B prompts
        assert set(np.bincount(e1).tolist()) == {8}
