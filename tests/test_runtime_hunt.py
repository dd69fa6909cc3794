"""Runtime and CLI defects found by a hunt: each test failed before its fix.

A trainer's huge elapsed, options ignored without a word, a KeyboardInterrupt
raised by a trainer's own code, resuming with the plan kept in the log, and
``--trainer-arg`` values that were silently dropped or not finite.
"""

from __future__ import annotations

import textwrap
import warnings

import click
import numpy as np
import pytest
from click.core import ParameterSource

from aspc.errors import ConfigError, RunError
from aspc.runtime.contracts import TrainBatch, Trainer, TrainResult, raised_by_code, take_step
from tests.conftest import EXAMPLE, invoke_cli, one_line_error

MODULE = """
import os
import signal
import time

from aspc.runtime.contracts import Trainer, TrainResult


class Fixed(Trainer):
    def __init__(self, elapsed=0.01, kb_at=None, sig_at=None, fail_at=None, ray_at=None, close_sig=False):
        self.elapsed, self.kb_at, self.sig_at, self.fail_at = elapsed, kb_at, sig_at, fail_at
        self.ray_at, self.close_sig = ray_at, close_sig

    def step(self, b):
        if b.step == self.kb_at:
            raise KeyboardInterrupt
        if b.step == self.sig_at:  # a user's Ctrl-C: a real signal to this process
            os.kill(os.getpid(), signal.SIGINT)
        if b.step == self.ray_at:  # ray.get's way with a Ctrl-C: aspc's Interrupted caught, a plain one raised
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except KeyboardInterrupt:
                raise KeyboardInterrupt from None
        if b.step == self.fail_at and not os.environ.get("HUNT_FIXED"):
            raise RuntimeError("boom")
        return TrainResult(b.step + 1, self.elapsed)

    def close(self):
        if self.close_sig and not os.environ.get("HUNT_FIXED"):  # a Ctrl-C while the run shuts down
            os.kill(os.getpid(), signal.SIGINT)


def make(ctx, **kw):
    return Fixed(**kw)


def make_kb(ctx):
    raise KeyboardInterrupt


def make_sig(ctx):
    os.kill(os.getpid(), signal.SIGINT)
    return Fixed()
"""


@pytest.fixture
def hunt_mod(tmp_path, monkeypatch):
    """The module ``hunt_trainer_mod`` in the current directory, as a user runs ``--trainer``."""
    (tmp_path / "hunt_trainer_mod.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(__import__("sys").modules, "hunt_trainer_mod", raising=False)
    return tmp_path


@pytest.fixture
def ex_plan(tmp_path):
    """examples/prompts.jsonl compiled as the defects were reproduced: 37 trainer steps."""
    out = tmp_path / "ex.parquet"
    assert invoke_cli("compile", EXAMPLE, "--length-field", "lengths", "-n", "4", "-o", out, "-q").exit_code == 0
    return out


def _batch(step: int = 0, n: int = 2) -> TrainBatch:
    ones = np.ones(n, dtype=np.int64)
    return TrainBatch(step, np.arange(n, dtype=np.int64), ones, ones, np.zeros(n, dtype=np.int64))


class _Returns(Trainer):
    def __init__(self, elapsed):
        self.elapsed = elapsed

    def step(self, batch):
        return TrainResult(batch.step + 1, self.elapsed)


# --------------------------------------------------------------------------- 1: a huge elapsed


def test_a_huge_finite_elapsed_is_one_line_not_an_infinite_clock(hunt_mod, plan):
    # Before: the run ended 'complete' (rc 0) with inf/nan times, a null makespan and numpy warnings.
    r = invoke_cli("run", plan, "--log", hunt_mod / "RUN", "-q", "--json", "--trainer", "hunt_trainer_mod:make",
                   "--trainer-arg", "elapsed=1e308")  # fmt: skip
    msg = one_line_error(r, 2)
    assert "the trainer at step 0 returned elapsed 1e+308" in msg and "at most 1e+06" in msg


@pytest.mark.parametrize("elapsed", [1e6 + 1, 10**400], ids=["1e6+1", "10**400"])
def test_take_step_bounds_elapsed(elapsed):
    with pytest.raises(RunError, match="returned elapsed .*at most 1e\\+06"):
        take_step(_Returns(elapsed), _batch())
    assert take_step(_Returns(1e6), _batch()).elapsed == 1e6


def test_the_step_bound_is_the_cost_models():
    from aspc.runtime.backends.sim_cost import COEFFICIENT_MAX
    from aspc.runtime.contracts import STEP_ELAPSED_MAX

    assert STEP_ELAPSED_MAX == COEFFICIENT_MAX


def test_the_sim_trainer_keeps_steps_past_one_coefficient():
    # α + β·tokens of the largest cost model passes 1e6 s: the sim's steps are finite by construction.
    from aspc.runtime.backends.sim_cost import COEFFICIENT_MAX, SimCostModel
    from aspc.runtime.trainers.sim import SimTrainer

    cost = SimCostModel(train_base=COEFFICIENT_MAX, train_per_token=COEFFICIENT_MAX)
    assert take_step(SimTrainer(cost), _batch()).elapsed > COEFFICIENT_MAX


def test_summary_refuses_a_non_finite_clock():
    from aspc.runtime.record import runlog as R
    from aspc.runtime.record.metrics import nonfinite_time, summarize

    steps = {"step": np.array([0, 1]), "start": np.array([0.0, 1.0]), "end": np.array([1.0, np.inf])}
    assert nonfinite_time({R.STEPS: steps}) == "step 1 end is inf"
    with pytest.raises(RunError, match="clock is not finite: step 1 end is inf"):
        summarize({R.SAMPLES: {}, R.MINIBATCHES: {}, R.STEPS: steps, R.QUEUE: {}}, n_workers=1)


def test_calibrate_of_a_log_with_an_infinite_clock_says_so(hunt_mod, ex_plan, monkeypatch):
    # An older aspc wrote such logs: calibrate said "decode_base must be a finite number >= 0, got nan".
    import aspc.runtime.contracts as contracts
    import aspc.runtime.record.metrics as metrics

    plan = ex_plan
    with monkeypatch.context() as m, warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        m.setattr(contracts, "STEP_ELAPSED_MAX", float("inf"))
        m.setattr(metrics, "nonfinite_time", lambda columns: None)
        r = invoke_cli("run", plan, "--log", hunt_mod / "OLD", "-q", "--trainer", "hunt_trainer_mod:make",
                       "--trainer-arg", "elapsed=1e308")  # fmt: skip
        assert r.exit_code == 0, r.output
    msg = one_line_error(invoke_cli("calibrate", hunt_mod / "OLD"), 2)
    assert "holds a time that is not finite" in msg and "run the plan again" in msg and "decode_base" not in msg
    from aspc.runtime.record import runlog as R

    with pytest.raises(RunError, match="OLD: the run log holds a time that is not finite"):
        metrics.summarize_log(R.read_run_log(hunt_mod / "OLD"))


# --------------------------------------------------------------------------- 2: options ignored unsaid


def test_id_field_without_actual_lengths_is_refused(plan):
    msg = one_line_error(invoke_cli("run", plan, "--id-field", "key", "-q"), 2)
    assert "--id-field names the prompt id field of --actual-lengths" in msg


@pytest.mark.parametrize(("command", "refused"), [("run", True), ("probe", False)])
def test_id_field_check_spares_probe(command, refused):
    # probe's --id-field also names its PROMPTS' id field: it stands without --actual-lengths.
    from aspc.cli.options import check_lengths_field

    ctx = click.Context(click.Command(command, params=[click.Option(["--id-field"])]), info_name=command)
    ctx.set_parameter_source("id_field", ParameterSource.COMMANDLINE)
    with ctx:
        if refused:  # aspc run asks for the check; aspc probe does not
            with pytest.raises(ConfigError, match="--id-field"):
                check_lengths_field(None, id_field=True)
        else:
            check_lengths_field(None)
        check_lengths_field("lengths.jsonl", id_field=refused)


def test_worker_timeout_on_sim_is_noted(plan):
    r = invoke_cli("run", plan, "--worker-timeout", "5")
    assert r.exit_code == 0, r.output
    assert "--worker-timeout is ignored by the sim backend" in " ".join(r.output.split())


# --------------------------------------------------------------------------- 3: KeyboardInterrupt from user code


def test_a_trainers_own_keyboard_interrupt_is_a_trainer_failure(hunt_mod, ex_plan):
    # Before: click's bare "Aborted!" and exit 1.
    r = invoke_cli("run", ex_plan, "--log", hunt_mod / "K", "-q", "--trainer", "hunt_trainer_mod:make",
                   "--trainer-arg", "kb_at=3")  # fmt: skip
    msg = one_line_error(r, 2)
    assert "the trainer failed at step 3: KeyboardInterrupt" in msg and "--resume" in msg


def test_a_factorys_own_keyboard_interrupt_is_a_factory_failure(hunt_mod, plan):
    msg = one_line_error(invoke_cli("run", plan, "-q", "--trainer", "hunt_trainer_mod:make_kb"), 2)
    assert "--trainer hunt_trainer_mod:make_kb: the factory failed (KeyboardInterrupt)" in msg


@pytest.mark.parametrize("where", [["--trainer", "hunt_trainer_mod:make", "--trainer-arg", "sig_at=3"],
                                   ["--trainer", "hunt_trainer_mod:make", "--trainer-arg", "ray_at=3"],
                                   ["--trainer", "hunt_trainer_mod:make_sig"]])  # fmt: skip
def test_a_real_ctrl_c_in_trainer_code_stays_an_interrupt(hunt_mod, ex_plan, where):
    msg = one_line_error(invoke_cli("run", ex_plan, "--log", hunt_mod / "S", "-q", *where), 130)
    assert msg.startswith("Error: interrupted by SIGINT") and "trainer failed" not in msg


def test_a_ctrl_c_while_the_run_shuts_down_marks_the_log(hunt_mod, ex_plan, monkeypatch):
    # Before: the log stayed "running", as a crash leaves it, though aspc was alive to mark it.
    from aspc.runtime.record.runlog import read_meta

    log, trainer = hunt_mod / "C", ["--trainer", "hunt_trainer_mod:make", "--trainer-arg", "close_sig=True"]
    msg = one_line_error(invoke_cli("run", ex_plan, "--log", log, "-q", *trainer), 130)
    assert msg.startswith("Error: interrupted by SIGINT")
    assert read_meta(log)["status"] == "interrupted"
    monkeypatch.setenv("HUNT_FIXED", "1")
    r = invoke_cli("run", ex_plan, "--log", log, "-q", "--json", *trainer, "--resume")
    assert r.exit_code == 0, r.output
    assert read_meta(log)["status"] == "complete"


def test_keyboard_interrupt_under_pythons_own_handler_is_not_taken_for_the_trainers():
    # Library use, no aspc signal policy: a plain KeyboardInterrupt in the main thread may be a real Ctrl-C.
    import signal

    from aspc.errors import Interrupted

    # Python's own handler, whatever this test process inherited (a background job starts with SIGINT ignored).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert not raised_by_code(KeyboardInterrupt())
        assert not raised_by_code(Interrupted(signal.SIGINT))
        assert raised_by_code(RuntimeError())
    finally:
        signal.signal(signal.SIGINT, previous)


# --------------------------------------------------------------------------- 4: resuming with the log's plan copy


def test_resume_with_the_plan_copy_kept_in_the_log(hunt_mod, ex_plan, monkeypatch):
    log = hunt_mod / "F"
    trainer = ["--trainer", "hunt_trainer_mod:make", "--trainer-arg", "fail_at=10"]
    r = invoke_cli("run", ex_plan, "--log", log, "-q", *trainer)
    assert "the trainer failed at step 10" in one_line_error(r, 2)
    copy = log / "plan.parquet"
    copy.write_bytes(ex_plan.read_bytes())
    monkeypatch.setenv("HUNT_FIXED", "1")  # the user fixed the trainer
    before = (copy.read_bytes(), copy.stat().st_ino, copy.stat().st_mtime_ns)
    # Before: "--log F contains the input plan.parquet; replacing the directory would delete it".
    r = invoke_cli("run", copy, "--log", log, "-q", "--json", *trainer, "--resume")
    assert r.exit_code == 0, r.output
    assert (copy.read_bytes(), copy.stat().st_ino, copy.stat().st_mtime_ns) == before
    msg = one_line_error(invoke_cli("run", copy, "--log", log, "-q", *trainer, "--overwrite"), 2)
    assert "replacing the directory would delete it" in msg


def test_check_output_allows_only_the_plan_copy_on_resume(tmp_path):
    from aspc import guards
    from aspc.errors import OutputError
    from aspc.guards import check_output
    from aspc.predict.pairs import PLAN_IN_LOG

    assert guards.PLAN_IN_LOG == PLAN_IN_LOG

    log = tmp_path / "F"
    (log / "epoch-1").mkdir(parents=True)
    for p in (log / "plan.parquet", log / "epoch-1" / "plan.parquet", log / "other.parquet"):
        p.write_bytes(b"x")
        with pytest.raises(OutputError, match="replacing the directory would delete it"):
            check_output(log, inputs=[p], kind="dir", option="--log", resume=False)
    check_output(log, inputs=[log / "plan.parquet"], kind="dir", option="--log", resume=True)
    check_output(log, inputs=[log / "epoch-1" / "plan.parquet"], kind="dir", option="--log", resume=True)
    with pytest.raises(OutputError, match="contains the input other.parquet"):
        check_output(log, inputs=[log / "other.parquet"], kind="dir", option="--log", resume=True)


# --------------------------------------------------------------------------- 5: --trainer-arg values


def test_a_repeated_trainer_arg_is_refused(hunt_mod, plan):
    from aspc.runtime.trainers.user import parse_trainer_args

    with pytest.raises(ConfigError, match="--trainer-arg lr is given twice"):
        parse_trainer_args(["lr=1", "lr=2"])
    r = invoke_cli("run", plan, "-q", "--trainer", "hunt_trainer_mod:make", "--trainer-arg", "elapsed=0.1",
                   "--trainer-arg", "elapsed=0.2")  # fmt: skip
    assert "--trainer-arg elapsed is given twice" in one_line_error(r, 2)


@pytest.mark.parametrize("value", ["1e999", "-1e999", "NaN", "Infinity", "[1, NaN]", '{"a": -Infinity}'])
def test_a_non_finite_trainer_arg_is_refused(value):
    from aspc.runtime.trainers.user import parse_trainer_args

    with pytest.raises(ConfigError, match="NaN or infinity; .*quote it as a JSON string") as err:
        parse_trainer_args([f"x={value}"])
    assert "\n" not in str(err.value)
    assert parse_trainer_args(['x="NaN"', "y=1e308", "z=NaNa"]) == {"x": "NaN", "y": 1e308, "z": "NaNa"}


def test_a_non_finite_trainer_arg_is_one_line_on_the_command_line(hunt_mod, plan):
    r = invoke_cli("run", plan, "-q", "--trainer", "hunt_trainer_mod:make", "--trainer-arg", "elapsed=1e999")
    assert "--trainer-arg 'elapsed=1e999': JSON reads a number in it as NaN or infinity" in one_line_error(r, 2)


def test_a_signal_just_after_the_log_says_running_marks_it(ex_plan, tmp_path, monkeypatch):
    # Before: a signal between meta.json's "running" and the run's main block left the log "running".
    import signal

    import aspc.runtime.api as api
    from aspc.emit import read_plan
    from aspc.errors import Interrupted
    from aspc.runtime.record.runlog import read_meta

    def signalled(*args, **kwargs):
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(api, "Scheduler", signalled)
    with pytest.raises(Interrupted):
        api.run(read_plan(ex_plan), log_dir=tmp_path / "R")
    assert read_meta(tmp_path / "R")["status"] == "interrupted"
    monkeypatch.undo()
    assert api.run(read_plan(ex_plan), log_dir=tmp_path / "R", resume=True).summary.n_trainer_steps > 0
    assert read_meta(tmp_path / "R")["status"] == "complete"
