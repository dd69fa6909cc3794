"""Runtime options a bug hunt broke: each case failed on the code before its fix.

Out-of-range K and cost coefficients reached the simulator's kernels (a Numba
TypingError traceback, an overflow to a null mean); a refusal suggested a K
the next check refused; errors named the wrong flag; an option without the
one it modifies was silently ignored; ``--repeats`` mixed one repeat's fields
with another's means; epoch resumes that asked for fewer epochs than the log
held exited 0.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.conftest import invoke_cli as _run
from tests.conftest import one_line_error, write_jsonl


def _one_line_error(result) -> str:
    return one_line_error(result, code=2)  # a usage error: click's exit code



# --------------------------------------------------------------------------- ranges


@pytest.mark.parametrize("cmd", ["run", "simulate"])
def test_max_staleness_past_int64_is_one_line(tmp_path, small, plan, cmd):
    head = ["run", plan] if cmd == "run" else ["simulate", small, "--length-field", "lengths"]
    msg = _one_line_error(_run(*head, "--max-staleness", str(2**64), "-q"))
    assert "--max-staleness must be >= 1 and <= 2147483647" in msg
    assert not any(tmp_path.glob("**/meta.json"))


def test_largest_max_staleness_runs(plan):
    r = _run("run", plan, "--max-staleness", str(2**31 - 1), "--json", "-q")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["policy_lag_max"] >= 0


@pytest.mark.parametrize("key", ["decode_base", "prefill_per_token", "train_per_token"])
@pytest.mark.parametrize("cmd", ["run", "simulate"])
def test_huge_cost_coefficient_is_one_line(tmp_path, small, plan, key, cmd):
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({key: 1e306}))
    head = ["run", plan] if cmd == "run" else ["simulate", small, "--length-field", "lengths"]
    msg = _one_line_error(_run(*head, "--cost-model", cost, "-q"))
    assert f"cost model {key} must be <= 1e+06 seconds, got 1e+306" in msg


def test_largest_cost_coefficients_give_finite_metrics(tmp_path, plan):
    from aspc.runtime.backends.sim_cost import COEFFICIENT_MAX, SIM_COST_MODEL_KEYS

    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({k: COEFFICIENT_MAX for k in SIM_COST_MODEL_KEYS}))
    r = _run("run", plan, "--cost-model", cost, "--json", "-q")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["mean_iteration_time"] is not None and 0 < out["mean_iteration_time"] < 1e300


# --------------------------------------------------------------------------- a refusal's advice is accepted


def _advice(msg: str) -> tuple[int, int]:
    m = re.search(r"raise --max-staleness to (\d+) or --global-batch to (\d+)", msg)
    assert m, msg
    return int(m.group(1)), int(m.group(2))


@pytest.mark.parametrize("extra", [[], ["--replan"]])
def test_staleness_refusal_suggests_values_the_run_accepts(plan, extra):
    msg = _one_line_error(_run("run", plan, "--max-staleness", "1", "--global-batch", "8", *extra, "-q"))
    if extra:
        assert "a re-planned minibatch (up to" in msg
    k, b = _advice(msg)
    for args in (["--max-staleness", k, "--global-batch", "8"], ["--max-staleness", "1", "--global-batch", b]):
        r = _run("run", plan, *args, *extra, "--json", "-q")
        assert r.exit_code == 0, (args, r.output)
        assert json.loads(r.output)["policy_lag_max"] <= int(args[1])


@pytest.mark.parametrize(
    ("mode", "compile_args", "global_batch"),
    [
        (["--scout", "--scout-roll"], [], "8"),
        (["--scout"], [], "8"),
        # Epoch 1 (random: 16 prompts a minibatch) meets K = 1 at 48 samples; epoch 2, asp cut by the DP, would not.
        (["--epochs", "2"], ["--strategy", "random", "--order", "interleave"], "48"),
    ],
)
def test_staleness_refusal_for_plans_made_during_the_run_comes_first(tmp_path, small, mode, compile_args, global_batch):
    # Before: the scout (or epoch 1) ran and epoch 1's plan was written under --log before the run
    # refused the bound, and the rerun with the suggested K asked for --resume or --overwrite.
    plan = tmp_path / "n3.parquet"
    r = _run("compile", small, "--length-field", "lengths", "-n", "3", *compile_args, "-o", plan, "-q")
    assert r.exit_code == 0, r.output
    log = tmp_path / "R"
    head = ["run", plan, *mode, "--actual-lengths", small, "--length-field", "lengths", "--log", log]
    msg = _one_line_error(_run(*head, "--max-staleness", "1", "--global-batch", global_batch))  # no -q: no note first
    assert "a re-planned minibatch (up to" in msg
    assert not log.exists()
    k, b = _advice(msg)
    for args in (["--max-staleness", k, "--global-batch", global_batch], ["--max-staleness", "1", "--global-batch", b]):
        r = _run(*head, *args, "--overwrite", "--json", "-q")
        assert r.exit_code == 0, (args, r.output)
        assert json.loads(r.output)["policy_lag_max"] <= int(args[1])


@pytest.mark.parametrize(("n_prompts", "windows", "samples"), [(120, None, 4), (120, 7, 2), (1000, 3, 8), (9, 9, 1)])
def test_rolling_scout_bound_is_the_runs(n_prompts, windows, samples):
    from aspc.compiler import CompileConfig
    from aspc.io.table import PromptTable
    from aspc.predict.base import LengthPrediction
    from aspc.rolling_scout import RollingScout, rest_bound, scout_windows, window_sizes

    ids = [f"p{i}" for i in range(n_prompts)]
    table = PromptTable(ids=ids, prompts=ids, texts=ids, source_rows=list(range(n_prompts)),
                        prompt_tokens=[1] * n_prompts, lengths=None, input_hash="")  # fmt: skip
    mean = [100.0] * n_prompts
    prior = LengthPrediction(mean=mean, q10=mean, q50=mean, q90=mean)
    w = scout_windows(windows, n_prompts)
    roll = RollingScout(table, prior, CompileConfig(samples_per_prompt=samples), 4, 64, w, {}, keep=False)
    want = rest_bound(CompileConfig(samples_per_prompt=samples), window_sizes(n_prompts, w), samples)
    assert roll.largest_minibatch(None) == want


# --------------------------------------------------------------------------- flags named right


def test_missing_actual_length_field_names_length_field(tmp_path, small, plan):
    hist = write_jsonl(tmp_path / "h.jsonl", [{"id": "p00000", "len": 3}])
    for args in (
        ["run", plan, "--actual-lengths", hist],
        ["simulate", small, "--actual-lengths", hist],
        ["probe", small, "--backend", "sim", "--actual-lengths", hist, "--log", tmp_path / "pr", "-o", tmp_path / "pr.jsonl"],
    ):
        msg = _one_line_error(_run(*args, "-q"))
        assert "missing length field 'length'; pass --length-field NAME" in msg, args


def test_replan_every_needs_replan(plan):
    msg = _one_line_error(_run("run", plan, "--replan-every", "3", "-q"))
    assert "--replan-every sets how often --replan re-plans: pass --replan too" in msg
    assert "must be >= 1" in _one_line_error(_run("run", plan, "--replan", "--replan-every", "0", "-q"))
    assert _run("run", plan, "--replan", "--replan-every", "3", "-q").exit_code == 0


# --------------------------------------------------------------------------- simulate --repeats


def test_repeats_aggregate_every_field_and_repeat_zero_is_the_single_run(small):
    def sim(*extra):
        r = _run("simulate", small, "--length-field", "lengths", "--strategies", "random,asp", "--json", "-q", *extra)
        assert r.exit_code == 0, r.output
        return json.loads(r.output)["strategies"]["asp"]

    single, rep = sim(), sim("--repeats", "3")
    spread = rep["repeats"]
    assert spread["makespan"]["values"][0] == single["makespan"]
    assert spread["mean_iteration_time"]["values"][0] == single["mean_iteration_time"]
    assert rep["policy_lag_max"] == max(spread["policy_lag_max"]["values"])
    assert isinstance(rep["policy_lag_max"], int)
    assert rep["makespan"] == pytest.approx(sum(spread["makespan"]["values"]) / 3)
    # Every field is one aggregate: repeat 0's lower bound beside the mean makespan could exceed it.
    assert rep["lower_bound"] <= rep["makespan"]
    assert rep["samples_planned"] == single["samples_planned"]
    assert set(rep["bubbles"]) == set(single["bubbles"])


def test_aggregate_rules():
    from aspc.simulate_compare import aggregate

    assert aggregate("policy_lag_max", [2, 5, 3]) == 5
    assert aggregate("makespan", [1.0, 2.0, 6.0]) == 3.0
    assert aggregate("n_workers", [8, 8]) == 8
    assert aggregate("bubbles", [{"a": 1.0, "b": 0.0}, {"a": 3.0, "b": 1.0}]) == {"a": 2.0, "b": 0.5}
    assert aggregate("w", [[1.0, 2.0], [3.0, 4.0]]) == [2.0, 3.0]
    assert aggregate("x", [1.0, None]) is None
    assert aggregate("w", [[1.0], [1.0, 2.0]]) is None


# --------------------------------------------------------------------------- epochs and --log


def test_signal_between_epochs_names_the_epoch(tmp_path):
    from aspc.cli.run import _interrupted_message
    from aspc.errors import Interrupted

    (tmp_path / "epoch-1").mkdir()
    (tmp_path / "epoch-1" / "meta.json").write_text(json.dumps({"status": "complete"}))
    msg = _interrupted_message(Interrupted(2), tmp_path, 3)
    assert "after epoch 1 of 3 finished, before the next epoch started" in msg
    assert "marked complete" not in msg
    (tmp_path / "epoch-2").mkdir()
    (tmp_path / "epoch-2" / "meta.json").write_text(json.dumps({"status": "interrupted"}))
    assert "is marked interrupted" in _interrupted_message(Interrupted(2), tmp_path, 3)


def test_signal_before_an_overwrite_replaced_an_epochs_log_says_it_holds_the_earlier_run(tmp_path):
    # Before: "after epoch 3 of 1 finished ... continue it with --resume", which was then refused.
    from aspc.cli.run import _interrupted_message
    from aspc.errors import Interrupted
    from aspc.run_layout import meta_stamps

    (tmp_path / "epoch-3").mkdir(parents=True)
    (tmp_path / "epoch-3" / "meta.json").write_text(json.dumps({"status": "complete"}))
    started = meta_stamps(tmp_path)  # the command began after the earlier run's last epoch was written
    msg = _interrupted_message(Interrupted(2), tmp_path, 1, started=started, overwrite=True)
    assert "before the run began" in msg and "still holds the earlier run" in msg and "--resume" not in msg
    # Not overwriting, the same log is this run's to go on with.
    assert "continue it with --resume" in _interrupted_message(Interrupted(2), tmp_path, 3, started=started)


def test_signal_after_epoch_one_plan_says_resume_not_nothing_written(tmp_path, small, plan):
    # Before: "nothing was written to RUN" beside RUN/plans/epoch-1.parquet, and the rerun the
    # message implied was refused ("already holds epoch plans").
    from aspc.cli.run import _interrupted_message
    from aspc.errors import Interrupted

    log = tmp_path / "E"
    args = ("run", plan, "--epochs", "2", "--actual-lengths", small, "--length-field", "lengths", "--log", log, "-q")
    assert _run(*args).exit_code == 0
    for d in ("epoch-1", "epoch-2"):  # the state a signal leaves between epoch 1's plan and its log
        shutil.rmtree(log / d)
    (log / "plans" / "epoch-2.parquet").unlink()
    msg = _interrupted_message(Interrupted(2), log, 2)
    assert "before epoch 1's run log was started" in msg and "holds its plan: continue it with --resume" in msg
    assert _run(*args, "--resume").exit_code == 0


def test_signal_between_epochs_with_a_trainer_that_cannot_restore_says_start_over(tmp_path, small, plan):
    # Between epochs the newest epoch's log is complete: the refusal was skipped and --resume offered,
    # which restores the completed epoch's steps and was refused.
    from aspc.cli.run import _interrupted_message
    from aspc.errors import Interrupted

    log = tmp_path / "E"
    args = ("run", plan, "--epochs", "2", "--actual-lengths", small, "--length-field", "lengths", "--log", log, "-q")
    assert _run(*args).exit_code == 0
    shutil.rmtree(log / "epoch-2")  # the state a signal leaves after epoch 1 finished
    msg = _interrupted_message(Interrupted(2), log, 2, refusal="this trainer keeps no checkpoints")
    assert "trainer steps, but this trainer keeps no checkpoints, so it cannot go on" in msg, msg
    assert msg.endswith("--overwrite") and "--resume" not in msg
    assert "continue it with --resume" in _interrupted_message(Interrupted(2), log, 2)  # a trainer that can


def test_resume_with_fewer_epochs_than_logged_is_refused(tmp_path, plan):
    log = tmp_path / "E"
    assert _run("run", plan, "--epochs", "3", "--log", log, "-q").exit_code == 0
    before = sorted(str(p.relative_to(log)) for p in log.rglob("*"))
    msg = _one_line_error(_run("run", plan, "--epochs", "2", "--log", log, "--resume", "-q"))
    assert "holds 3 epochs, more than --epochs 2: resume it with --epochs 3" in msg
    msg = _one_line_error(_run("run", plan, "--log", log, "--resume", "-q"))
    assert "holds a run of 3 epochs" in msg and "resume it with --epochs 3" in msg
    assert sorted(str(p.relative_to(log)) for p in log.rglob("*")) == before
    assert _run("run", plan, "--epochs", "3", "--log", log, "--resume", "-q").exit_code == 0


def test_dangling_log_symlink_asks_for_a_directory(tmp_path, plan):
    link = tmp_path / "L"
    link.symlink_to(tmp_path / "absent")
    msg = _one_line_error(_run("run", plan, "--log", link, "-q"))
    assert "is a dangling symlink; remove it or point it at a directory" in msg


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--workers", str(2**31 - 1)], "--workers must be >= 1 and <= 65536"),  # ran out of memory, no message
        (["--global-batch", str(2**62)], "--global-batch must be >= 1 and <= 1099511627776"),  # named --queue-capacity
        (["--seed", str(2**63 - 1), "--repeats", "2"], "use a --seed of at most 9223372036854775806"),
    ],
)
def test_simulate_extremes_are_one_line(small, args, want):
    assert want in _one_line_error(_run("simulate", small, "--length-field", "lengths", *args, "-q"))


def test_most_workers_run(plan):
    from aspc.guards import MAX_WORKERS

    r = _run("run", plan, "--workers", MAX_WORKERS, "--json", "-q")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["n_workers"] == MAX_WORKERS


def test_a_damaged_epoch_plan_says_how_to_resume(tmp_path, small, plan):
    # Before: the plan reader's advice, "compile it again with 'aspc compile'", for a plan the run itself compiles.
    log = tmp_path / "E"
    args = ("run", plan, "--epochs", "2", "--actual-lengths", small, "--length-field", "lengths", "--log", log, "-q")
    assert _run(*args).exit_code == 0
    stored = log / "plans" / "epoch-2.parquet"
    stored.write_bytes(stored.read_bytes()[:100])
    msg = _one_line_error(_run(*args, "--resume"))
    assert "cannot resume epoch 2: epoch-2.parquet: not a readable Parquet file" in msg
    assert "delete it (the resume compiles it again from the run logs)" in msg and "aspc compile" not in msg
    stored.unlink()
    assert _run(*args, "--resume").exit_code == 0 and stored.is_file()


def test_a_rolling_scout_log_names_its_options_on_resume(tmp_path, small):
    # Before: "started with --epochs and without --scout", and its advice (--epochs 2) was refused next.
    plan = tmp_path / "n3.parquet"
    assert _run("compile", small, "--length-field", "lengths", "-n", "3", "-o", plan, "-q").exit_code == 0
    log = tmp_path / "R"
    head = ["run", plan, "--actual-lengths", small, "--length-field", "lengths", "--log", log, "-q"]
    assert _run(*head, "--scout", "--scout-roll").exit_code == 0
    for args, want in (([], "resume it with --scout --scout-roll"), (["--scout"], "started with --scout --scout-roll"),
                       (["--epochs", "2"], "started with --scout --scout-roll")):  # fmt: skip
        assert want in _one_line_error(_run(*head, *args, "--resume")), args
    assert _run(*head, "--scout", "--scout-roll", "--resume").exit_code == 0


@pytest.mark.parametrize(
    ("edit", "want"),
    [
        ({"samples_per_prompt": 2}, "the plan's stored samples_per_prompt 2 is not its rows' 4"),
        ({"batch_size": "x"}, "the plan's stored compile settings (aspc.config) fail a check: --batch-size must be"),
        ({"seed": -5}, "fail a check: --seed must be an integer"),
        (None, "the plan has no stored compile settings (aspc.config)"),
    ],
)
def test_an_edited_plan_config_is_refused_before_epoch_1(tmp_path, edit, want):
    # check passed these, and --epochs read them only to compile epoch 2: another sample count, or an
    # error about a flag never passed after a whole epoch had run.
    import pyarrow.parquet as pq

    from tests.conftest import invoke_cli, lognormal_records, write_jsonl

    data = write_jsonl(tmp_path / "d.jsonl", lognormal_records(60))
    plan = tmp_path / "p.parquet"
    assert invoke_cli("compile", data, "--length-field", "lengths", "-n", "4", "-o", plan, "-q").exit_code == 0
    table = pq.read_table(plan)
    meta = dict(table.schema.metadata)
    if edit is None:
        del meta[b"aspc.config"]
    else:
        meta[b"aspc.config"] = json.dumps({**json.loads(meta[b"aspc.config"]), **edit}).encode()
    pq.write_table(table.replace_schema_metadata(meta), plan)
    r = invoke_cli("run", plan, "--epochs", "2", "--actual-lengths", data, "--length-field", "lengths",
                   "--log", tmp_path / "RUN")  # fmt: skip
    assert r.exit_code == 2 and want in " ".join(r.output.split()), r.output
    assert not (tmp_path / "RUN").exists()
