"""``--trainer module:factory``: the only import of user code, and its one-line errors."""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.errors import ConfigError
from aspc.runtime import BackendContext
from aspc.runtime.registry import make_trainer
from aspc.runtime.trainers.user import load_factory, parse_trainer_args
from tests.conftest import lognormal_records, write_jsonl

GOOD = """
from aspc.runtime import Trainer, TrainResult

class Counting(Trainer):
    def __init__(self, scale):
        self.scale = scale
        self.steps = 0

    def step(self, batch):
        self.steps += 1
        return TrainResult(version=batch.step + 1, elapsed=0.01 * self.scale)

def factory(context, scale=1):
    return Counting(scale)

not_callable = 3

def broken(context):
    raise RuntimeError("boom")

class Unprintable(BaseException):
    def __str__(self):
        raise ValueError("no text")

def halting(context):
    raise Unprintable()

def wrong_type(context):
    return object()

class Misbehaving(Trainer):
    def __init__(self, how):
        self.how = how

    def step(self, batch):
        if batch.step == 2 and self.how == "raise":
            raise RuntimeError("boom\\nat step two")
        elapsed = {"nan": float("nan"), "negative": -1.0}.get(self.how, 0.01)
        version = batch.step + (5 if self.how == "version" else 1)
        return None if self.how == "none" else TrainResult(version=version, elapsed=elapsed)

def misbehaving(context, how):
    return Misbehaving(how)

class Halt(BaseException):
    pass

class BadHook(Trainer):
    def __init__(self, how):
        self.how = how

    def setup(self, work):
        if self.how == "setup":
            raise RuntimeError("setup boom")

    def step(self, batch):
        if self.how == "exit":
            raise SystemExit(3)
        if self.how == "base":
            raise Halt("stopped by a BaseException")
        return TrainResult(version=batch.step + 1, elapsed=0.01)

    def durable(self, version):
        return "x" if self.how == "durable" else version

    def close(self):
        if self.how == "close":
            raise RuntimeError("close boom")

def bad_hook(context, how):
    return BadHook(how)

class SelfInterrupting(Trainer):
    # Sends its own process SIGINT at step 3, as a user's Ctrl-C; keeps no checkpoints if told.

    def __init__(self, refuse, at):
        self.refuse, self.at = refuse, at

    def step(self, batch):
        if batch.step == self.at:
            import os, signal
            os.kill(os.getpid(), signal.SIGINT)
        return TrainResult(version=batch.step + 1, elapsed=0.01)

    def resume_refusal(self):
        return "this trainer keeps no checkpoints" if self.refuse else None

    def restore(self, version):
        if version and self.refuse:
            from aspc.errors import ConfigError
            raise ConfigError("--resume: this trainer keeps no checkpoints")

def self_interrupting(context, refuse=False, at=3):
    return SelfInterrupting(refuse, at)
"""


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A directory holding user modules, made the current directory (as a user would run aspc)."""
    (tmp_path / "good_trainer_mod.py").write_text(textwrap.dedent(GOOD))
    (tmp_path / "raising_mod.py").write_text("raise ImportError('needs a package you lack')\n")
    (tmp_path / "syntax_mod.py").write_text("def f(:\n")
    (tmp_path / "exiting_mod.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "halting_mod.py").write_text("class Halt(BaseException):\n    pass\nraise Halt('at import')\n")
    monkeypatch.chdir(tmp_path)
    for name in ("good_trainer_mod", "raising_mod", "syntax_mod", "exiting_mod", "halting_mod"):
        monkeypatch.delitem(__import__("sys").modules, name, raising=False)
    return tmp_path


def test_loads_a_factory_from_the_current_directory(user_dir):
    trainer = make_trainer("good_trainer_mod:factory", BackendContext(n_workers=1, options={"trainer_args": {"scale": 3}}))
    assert type(trainer).__name__ == "Counting" and trainer.scale == 3
    assert callable(load_factory("good_trainer_mod:factory"))


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("a:b:c", "expected 'package.module:factory'"),
        ("no_such_module_xyz:factory", "cannot import 'no_such_module_xyz'"),
        ("raising_mod:factory", "needs a package you lack"),
        ("syntax_mod:f", "SyntaxError"),
        ("good_trainer_mod:missing", "has no attribute 'missing'"),
        ("good_trainer_mod:not_callable", "is not callable"),
        ("good_trainer_mod:broken", "the factory failed (RuntimeError: boom)"),
        # A user's own BaseException (and one whose text cannot be built) was a traceback.
        ("good_trainer_mod:halting", "the factory failed (Unprintable)"),
        ("halting_mod:factory", "cannot import 'halting_mod' (Halt: at import)"),
        ("good_trainer_mod:wrong_type", "not an aspc.runtime.Trainer"),
        ("nonsense", "unknown trainer"),
    ],
)
def test_bad_trainer_specs(user_dir, spec, fragment):
    with pytest.raises(ConfigError) as err:
        make_trainer(spec, BackendContext(n_workers=1))
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_the_python_api_hands_a_users_own_base_exception_back(plan):
    # Under the CLI it is one line (above); a caller of aspc.runtime.run gets its own control flow back
    # (a test's pytest.skip in a trainer, a cancellation), not "the trainer failed".
    from aspc.emit import read_plan
    from aspc.runtime import RunConfig, Trainer, run

    class Stop(BaseException):
        pass

    class Stopping(Trainer):
        def step(self, batch):
            raise Stop("mine")

    with pytest.raises(Stop, match="mine"):
        run(read_plan(plan[0]), config=RunConfig(workers=2, global_batch=8), trainer=Stopping())


def test_trainer_args():
    assert parse_trainer_args(["lr=1e-3", "name=abc", "n=4", "flag=true"]) == {
        "lr": 1e-3, "name": "abc", "n": 4, "flag": True}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_trainer_args(["novalue"])


@pytest.fixture
def plan(tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", lognormal_records(40))
    out = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--batch-size", "4",
                                  "-o", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    return out, data


def test_cli_user_trainer_with_the_sim_backend(plan, user_dir):
    path, data = plan
    r = CliRunner().invoke(main, ["run", str(path), "--actual-lengths", str(data), "--length-field", "lengths",
                                  "--workers", "2", "--global-batch", "8", "--trainer", "good_trainer_mod:factory",
                                  "--trainer-arg", "scale=2", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["n_trainer_steps"] == 40 // 8


def test_cli_trainer_import_failure_is_one_line(plan, user_dir):
    path, _ = plan
    run_dir = user_dir / "RUN"
    r = CliRunner().invoke(main, ["run", str(path), "--trainer", "raising_mod:factory", "--log", str(run_dir)])
    assert r.exit_code == 2
    assert "needs a package you lack" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("how", "fragment"),
    [
        ("raise", "the trainer failed at step 2: RuntimeError: boom at step two; fix it and rerun"),
        ("nan", "the trainer at step 0 returned elapsed nan; step() must return the seconds the step took"),
        ("negative", "the trainer at step 0 returned elapsed -1.0"),
        ("version", "the trainer at step 0 published version 5, not 1"),
        ("none", "the trainer at step 0 returned NoneType, not a TrainResult"),
    ],
)
def test_a_misbehaving_trainer_step_is_one_line_and_the_log_resumes(plan, user_dir, how, fragment):
    # Before, under the simulated clock: a traceback (raise, none), a run that spun forever (nan),
    # or a result taken as it was (a negative time, a version the contract does not allow).
    path, data = plan
    run_dir = user_dir / "RUN"
    args = ["run", str(path), "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "2",
            "--global-batch", "8", "--log", str(run_dir), "-q"]  # fmt: skip
    r = CliRunner().invoke(main, [*args, "--trainer", "good_trainer_mod:misbehaving", "--trainer-arg", f"how={how}"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and fragment in r.output, r.output
    # The fixed trainer (its class unchanged: a resume with another one is refused) goes on from the log.
    fixed = ["--trainer", "good_trainer_mod:misbehaving", "--trainer-arg", "how=fixed"]
    r = CliRunner().invoke(main, [*args, *fixed, "--resume", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["n_trainer_steps"] == 40 // 8


def test_a_trainer_module_that_exits_at_import_is_one_line(plan, user_dir):
    # Before: aspc ended with the module's exit code 3 and no message at all.
    r = CliRunner().invoke(main, ["run", str(plan[0]), "--trainer", "exiting_mod:factory", "-q"])
    assert r.exit_code == 2, r.output
    assert "importing 'exiting_mod' called sys.exit(3)" in r.output and len(r.output.strip().splitlines()) == 1


def test_a_ctrl_c_during_a_slow_trainer_import_interrupts_it(plan, user_dir):
    # The handler held every signal while any import-system frame was on the stack, so a Ctrl-C
    # waited out the module's whole import (a trainer importing torch, DeepSpeed: many seconds);
    # then the factory's own error ended the command and the Ctrl-C was lost.
    import time

    (user_dir / "slow_import_mod.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C while this module is still importing\n"
        "for _ in range(300):\n"
        "    time.sleep(0.1)\n"
        "def factory(context):\n"
        "    raise RuntimeError('never reached')\n"
    )
    t0 = time.monotonic()
    r = CliRunner().invoke(main, ["run", str(plan[0]), "--trainer", "slow_import_mod:factory", "--log",
                                  str(user_dir / "RUN"), "-q"])  # fmt: skip
    assert time.monotonic() - t0 < 15  # the import alone takes 30 s
    assert r.exit_code == 130, r.output
    assert "interrupted by SIGINT before the run log was started" in r.output, r.output
    assert not (user_dir / "RUN").exists()


def test_a_ctrl_c_a_trainer_module_swallows_at_import_still_interrupts(plan, user_dir):
    # Raised in the module's code, a bare except there would have lost it: it is raised again until it leaves.
    import time

    (user_dir / "swallowing_mod.py").write_text(
        "import os, signal, time\n"
        "try:  # an optional import's guard\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(2)\n"
        "except BaseException:\n"
        "    pass\n"
        "for _ in range(300):\n"
        "    time.sleep(0.1)\n"
        "def factory(context):\n"
        "    raise RuntimeError('never reached')\n"
    )
    t0 = time.monotonic()
    r = CliRunner().invoke(main, ["run", str(plan[0]), "--trainer", "swallowing_mod:factory", "-q"])
    assert time.monotonic() - t0 < 15  # the import alone takes 30 s
    assert r.exit_code == 130, r.output


@pytest.mark.parametrize(
    ("how", "fragment", "status"),
    [
        ("setup", "the trainer's setup() failed: RuntimeError: setup boom; fix it and rerun", None),
        ("close", "the run is complete, but the trainer's close() failed: RuntimeError: close boom", "complete"),
        ("durable", "returned 'x'; it must be a version from 0 to", "failed"),
        ("exit", "the trainer failed at step 0: SystemExit: 3; fix it and rerun", "failed"),
        ("base", "the trainer failed at step 0: Halt: stopped by a BaseException; fix it and rerun", "failed"),
    ],
)
def test_a_trainer_hook_that_fails_is_one_line(plan, user_dir, how, fragment, status):
    # Before: a traceback from setup() (the bundled GRPO trainer's with a bad --trainer-arg lr),
    # close() and durable(), a log left 'running' by the last two, and sys.exit in step() ended
    # aspc with the trainer's code and no word.
    path, data = plan
    run_dir = user_dir / "RUN"
    r = CliRunner().invoke(main, ["run", str(path), "--actual-lengths", str(data), "--length-field", "lengths",
                                  "--workers", "2", "--global-batch", "8", "--log", str(run_dir), "-q",
                                  "--trainer", "good_trainer_mod:bad_hook", "--trainer-arg", f"how={how}"])  # fmt: skip
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and fragment in r.output, r.output
    if status is None:
        assert not run_dir.exists()
    else:
        assert json.loads((run_dir / "meta.json").read_text())["status"] == status



def test_trainer_args_without_a_trainer_are_refused(plan, user_dir):
    # The sim trainer takes no arguments: they were dropped unread, exit 0.
    r = CliRunner().invoke(main, ["run", str(plan[0]), "--trainer-arg", "lr=1e-5", "--log", str(user_dir / "RUN")])
    assert r.exit_code == 2 and "--trainer-arg passes arguments to a --trainer factory" in r.output, r.output
    assert not (user_dir / "RUN").exists()


@pytest.mark.parametrize("refuse", [False, True])
def test_an_interrupted_run_offers_the_command_that_works_for_its_trainer(plan, user_dir, refuse):
    # A trainer that can restore only its initial weights (the bundled GRPO trainer without a
    # checkpoint_dir) was offered --resume, which it then refused.
    path, data = plan
    run_dir = user_dir / "RUN"
    args = ["run", str(path), "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "2",
            "--global-batch", "8", "--log", str(run_dir), "-q", "--trainer", "good_trainer_mod:self_interrupting",
            "--trainer-arg", f"refuse={str(refuse).lower()}"]  # fmt: skip
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 130 and len(r.output.strip().splitlines()) == 1, r.output
    if refuse:
        assert "trainer steps, but this trainer keeps no checkpoints, so it cannot go on" in r.output, r.output
        assert r.output.strip().endswith("--overwrite")
    else:
        assert "continue it with --resume" in r.output, r.output
    # The advice, with the same trainer sending no signal.
    follow = [*args, "--trainer-arg", "at=-1", "--overwrite" if refuse else "--resume"]
    r = CliRunner().invoke(main, [*follow, "--json"])
    assert r.exit_code == 0, r.output


def test_a_signal_at_a_complete_log_says_which_run_completed(plan, user_dir):
    # A complete log was offered --resume: after this run completed (the signal cut its close-down
    # short), or before it began, when the log still held an earlier run that --overwrite would replace.
    import signal

    from aspc.cli.run import _interrupted_message
    from aspc.errors import Interrupted

    run_dir = user_dir / "RUN"
    r = CliRunner().invoke(main, ["run", str(plan[0]), "--log", str(run_dir), "-q"])
    assert r.exit_code == 0, r.output
    from aspc.run_layout import meta_stamps

    # The command found no log (this run wrote it), or found it as it is now (an earlier run's).
    after = _interrupted_message(Interrupted(signal.SIGINT), run_dir, started={})
    assert after == f"interrupted by SIGINT after the run completed; run log {run_dir} is complete"
    before = _interrupted_message(Interrupted(signal.SIGINT), run_dir, started=meta_stamps(run_dir), refusal="no")
    assert "before the run began" in before and "still holds the earlier, complete run" in before
    assert before.endswith("--overwrite") and "--resume" not in before


def test_a_refused_resume_leaves_the_log_as_it_found_it(plan, user_dir):
    # The refusal came after the log was reopened: meta.json went from interrupted to failed, its
    # error replaced and a resume counted, for a command that did nothing.
    path, data = plan
    run_dir = user_dir / "RUN"
    args = ["run", str(path), "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "2",
            "--global-batch", "8", "--log", str(run_dir), "-q", "--trainer", "good_trainer_mod:self_interrupting",
            "--trainer-arg", "refuse=true"]  # fmt: skip
    assert CliRunner().invoke(main, args).exit_code == 130
    before = (run_dir / "meta.json").read_bytes()
    assert json.loads(before)["status"] == "interrupted"
    r = CliRunner().invoke(main, [*args, "--resume"])
    assert r.exit_code == 2 and "this trainer keeps no checkpoints" in r.output, r.output
    assert (run_dir / "meta.json").read_bytes() == before


def test_a_resume_without_the_runs_trainer_is_refused(plan, user_dir):
    # Forgetting --trainer on --resume went on with the sim trainer: the log mixed real and simulated steps.
    path, data = plan
    run_dir = user_dir / "RUN"
    args = ["run", str(path), "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "2",
            "--global-batch", "8", "--log", str(run_dir), "-q"]  # fmt: skip
    assert CliRunner().invoke(main, [*args, "--trainer", "good_trainer_mod:self_interrupting"]).exit_code == 130
    before = (run_dir / "meta.json").read_bytes()
    for other in ([], ["--trainer", "good_trainer_mod:factory"]):
        r = CliRunner().invoke(main, [*args, *other, "--resume"])
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
        assert "the trainer (good_trainer_mod.SelfInterrupting in the log" in r.output, r.output
        assert (run_dir / "meta.json").read_bytes() == before
    # The same class imported by another path (a copy of the module here) is the same trainer.
    (user_dir / "same_trainer_mod.py").write_text((user_dir / "good_trainer_mod.py").read_text())
    r = CliRunner().invoke(main, [*args, "--trainer", "same_trainer_mod:self_interrupting", "--trainer-arg", "at=-1",
                                  "--resume"])  # fmt: skip
    assert r.exit_code == 0, r.output
