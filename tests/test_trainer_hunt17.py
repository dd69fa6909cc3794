"""A user's trainer, as a hunt found it could break a run: a failing restore, a batch edited in place,
prints under --json, a trainer-arg nested too deep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.errors import ConfigError
from aspc.runtime.trainers.user import parse_trainer_args
from tests.conftest import lognormal_records, write_jsonl

ROOT = Path(__file__).resolve().parents[1]

TRAINERS = """
import os
from aspc.runtime import Trainer, TrainResult

class Checkpointing(Trainer):
    # Fails at step fail_at; restore() fails when told to; a checkpoint every step under ckdir.
    def __init__(self, fail_at, restore_fails, ckdir):
        self.fail_at, self.restore_fails, self.ckdir = fail_at, restore_fails, ckdir
        os.makedirs(ckdir, exist_ok=True)

    def step(self, batch):
        if batch.step == self.fail_at:
            raise RuntimeError("crash")
        open(os.path.join(self.ckdir, str(batch.step + 1)), "w").close()
        return TrainResult(version=batch.step + 1, elapsed=0.01)

    def durable(self, version):
        return max([int(f) for f in os.listdir(self.ckdir) if int(f) <= version], default=0)

    def restore(self, version):
        if self.restore_fails:
            raise RuntimeError(f"checkpoint {version} is unreadable")

def checkpointing(context, fail_at=-1, restore_fails=False, ckdir="ck"):
    return Checkpointing(fail_at, restore_fails, ckdir)

class Editing(Trainer):
    # Edits its batch in place, as a trainer re-indexing its samples would.
    def step(self, batch):
        ids = batch.samples
        ids -= ids.min()
        return TrainResult(version=batch.step + 1, elapsed=0.01)

def editing(context):
    return Editing()

print("printed at import")
import atexit
atexit.register(lambda: print("printed at exit"))  # as Ray's and vLLM's shutdown hooks print

class TakingSigint(Trainer):
    # Installs Python's own SIGINT handler in setup (as libraries do), then gets a Ctrl-C at step 2.
    def setup(self, work):
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def step(self, batch):
        if batch.step == 2:
            import signal
            signal.signal(signal.SIGINT, signal.default_int_handler)  # again, as a library's lazy init would
            os.kill(os.getpid(), signal.SIGINT)
        return TrainResult(version=batch.step + 1, elapsed=0.01)

def taking_sigint(context):
    return TakingSigint()

class Printing(Trainer):
    def step(self, batch):
        print("printed in step", batch.step)
        os.write(1, b"written to descriptor 1\\n")
        return TrainResult(version=batch.step + 1, elapsed=0.01)

def printing(context):
    print("printed by the factory")
    return Printing()
"""


@pytest.fixture
def setup(tmp_path, monkeypatch):
    (tmp_path / "hunt17_trainers.py").write_text(textwrap.dedent(TRAINERS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "hunt17_trainers", raising=False)
    data = write_jsonl(tmp_path / "in.jsonl", lognormal_records(40))
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--batch-size", "4",
                                  "-o", str(plan), "--quiet"])  # fmt: skip
    assert r.exit_code == 0, r.output
    args = ["run", str(plan), "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "2",
            "--global-batch", "8", "-q"]  # fmt: skip
    return tmp_path, args


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_failing_restore_is_one_line_and_leaves_the_log_to_resume(setup):
    # restore() raising on --resume was a traceback, and the refused resume rewrote meta.json and renamed parts.
    tmp_path, args = setup
    args = [*args, "--log", str(tmp_path / "RUN"), "--trainer", "hunt17_trainers:checkpointing"]
    r = CliRunner().invoke(main, [*args, "--trainer-arg", "fail_at=3"])
    assert r.exit_code == 2 and "the trainer failed at step 3" in r.output, r.output
    before = _tree(tmp_path / "RUN")
    r = CliRunner().invoke(main, [*args, "--resume", "--trainer-arg", "restore_fails=true"])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert lines[0] == ("Error: the trainer's restore(3) failed: RuntimeError: checkpoint 3 is unreadable; "
                        "fix it and rerun with --resume")  # fmt: skip
    assert _tree(tmp_path / "RUN") == before
    r = CliRunner().invoke(main, [*args, "--resume", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["n_trainer_steps"] == 40 // 8


def test_a_trainer_that_edits_its_batch_leaves_the_runs_books_alone(setup):
    # The batch held the scheduler's own sample ids: the run said samples were generated 3 times, then crashed.
    tmp_path, args = setup
    r = CliRunner().invoke(main, [*args, "--log", str(tmp_path / "RUN"), "--trainer", "hunt17_trainers:editing",
                                  "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["n_trainer_steps"] == 40 // 8
    assert json.loads((tmp_path / "RUN" / "meta.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("epochs", [[], ["--epochs", "2", "--log", "E"]])
def test_what_a_trainer_prints_goes_to_stderr_and_json_stays_whole(setup, epochs):
    # Python prints and writes to descriptor 1 came before the JSON object on stdout.
    tmp_path, args = setup
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    code = "import sys; from aspc.entry import main; sys.argv = ['aspc', *sys.argv[1:]]; main()"
    done = subprocess.run([sys.executable, "-c", code, *args, "--trainer", "hunt17_trainers:printing", "--json",
                           *epochs], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert ("epochs" in summary) == bool(epochs)
    for said in ("printed at import", "printed by the factory", "printed in step 0", "written to descriptor 1",
                 "printed at exit"):  # fmt: skip
        assert said in done.stderr
    # With stderr closed, what the trainer prints is dropped, never mixed into the result.
    again = [a if a != "E" else "E2" for a in epochs]
    done = subprocess.run([sys.executable, "-c", code, *args, "--trainer", "hunt17_trainers:printing", "--json",
                           *again], stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path, timeout=300,
                          preexec_fn=lambda: os.close(2))  # fmt: skip
    assert done.returncode == 0
    assert json.loads(done.stdout)


def test_the_result_stream_leaves_no_descriptor_behind(monkeypatch):
    # In-process callers with a stderr that has no descriptor: each use leaked the dup of descriptor 1.
    import io

    from aspc.cli.result_stream import results_only_on_stdout

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    for _ in range(5):
        with results_only_on_stdout():
            pass
    if before is not None:
        assert len(os.listdir("/proc/self/fd")) == before


def test_a_trainer_arg_nested_too_deep_is_one_line():
    with pytest.raises(ConfigError, match="nests too deeply"):
        parse_trainer_args(["a=" + "[" * 100_000 + "]" * 100_000])


def test_a_module_raising_keyboardinterrupt_at_import_is_one_line(setup):
    # It printed click's "Aborted!" with exit 1.
    tmp_path, args = setup
    (tmp_path / "hunt17_ki.py").write_text("raise KeyboardInterrupt\n")
    r = CliRunner().invoke(main, [*args, "--trainer", "hunt17_ki:make"])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == "Error: --trainer hunt17_ki:make: cannot import 'hunt17_ki' (KeyboardInterrupt)"


def test_an_exception_that_cannot_be_printed_still_names_its_type():
    from aspc.runtime.contracts import _said

    class Unprintable(RuntimeError):
        def __str__(self):
            raise ValueError("no")

    assert _said(Unprintable()) == "Unprintable"


def test_a_trainer_that_takes_sigint_still_gets_an_interrupted_run(setup):
    # Its handler turned a Ctrl-C into click's "Aborted!" (exit 1) and the log into "failed".
    tmp_path, args = setup
    r = CliRunner().invoke(main, [*args, "--log", str(tmp_path / "RUN"), "--trainer", "hunt17_trainers:taking_sigint"])
    assert r.exit_code == 130, r.output
    assert "Error: interrupted by SIGINT; run log" in r.output, r.output
    assert json.loads((tmp_path / "RUN" / "meta.json").read_text())["status"] == "interrupted"
