"""Hunt 28: aspc under unusual interpreter modes and embedded in host programs (the way verl, OpenRLHF, AReaL,
Ray actors and notebooks use a library): ``python -OO``, a closed stdout, a forked child, a host's own SIGINT
handler or an inherited ignored SIGINT, a host thread creating files while aspc writes, and the host's
transformers logging and matplotlib backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not EXAMPLE.is_file(), reason="examples/prompts.jsonl is not in this checkout")


def _prompts(tmp_path: Path, n: int = 80) -> Path:
    data = tmp_path / "in.jsonl"
    with open(EXAMPLE, encoding="utf-8") as fh:
        data.write_text("".join(fh.readline() for _ in range(n)), encoding="utf-8")
    return data


def _python(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 60, **kw):
    full = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=timeout, **kw)  # fmt: skip


@pytest.mark.parametrize(("argv", "want"), [
    (["--help"], "compile generation schedules for LLM reinforcement learning"),
    (["check", "--help"], "exit 0 within bounds, 1 on a violated bound"),
    (["compile", "--help"], "Compile a prompt dataset"),
])  # fmt: skip
def test_help_text_survives_python_OO(argv, want):
    """README, Commands: "Every command has `--help`". Python's documentation of ``-OO``: "Remove assert and
    __debug__-dependent statements ... and discard docstrings" (the same as ``PYTHONOPTIMIZE=2``, which
    production images set).

    ``python -OO -m aspc.cli check --help`` prints the options only: the description, which is the only place
    the help says what check's exit codes mean ("exit 0 within bounds, 1 on a violated bound, 2 on bad input"),
    is gone; ``aspc --help`` loses its summary and examples, and its command list shows bare names with no
    one-line description. click takes all of these from the commands' ``__doc__``, which ``-OO`` sets to None.
    """
    plain = _python(["-m", "aspc.cli", *argv])
    assert plain.returncode == 0 and want in " ".join(plain.stdout.split()), plain.stdout  # the text is there
    r = _python(["-OO", "-m", "aspc.cli", *argv])
    assert r.returncode == 0, r.stderr
    assert want in " ".join(r.stdout.split()), r.stdout


@pytest.mark.parametrize("argv", [["--help"], ["compile", "--help"], ["--version"]])
def test_help_to_a_closed_stdout_is_one_line(argv):
    """README, Commands: "Bad input gets a one-line error and a non-zero exit"; every command's result to a
    closed stdout is "Error: stdout is closed; give the command somewhere to write its result" (exit 2,
    tests/test_adversary.py), and ``aspc --help > /dev/full`` is "Error: cannot write the help or version text
    to stdout" (exit 2).

    ``aspc --help >&-`` (and ``aspc compile --help``, ``aspc --version``) exits 0 and prints nothing at all:
    with fd 1 closed Python sets ``sys.stdout`` to None and click's echo silently drops the text, so a script
    reading the help or the version sees success and gets nothing.
    """
    r = _python(["-m", "aspc.cli", *argv], preexec_fn=lambda: os.close(1))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0, r.stderr
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr


def test_compile_in_a_forked_child_after_the_parent_compiled(tmp_path):
    """The hunt's standard for a library: called from a ``multiprocessing`` child, the same result as a plain
    run or one clear error. ``fork`` is multiprocessing's default start method on Linux up to Python 3.13
    (and PyTorch DataLoader workers are forked); nothing in the README says aspc cannot be used there.

    A process that called ``aspc.compiler.compile_file`` once (80 prompts) and then starts a
    ``multiprocessing`` fork child that compiles again: the child prints Numba's "Terminating: fork() called
    from a process already using GNU OpenMP, this is unsafe." and dies by SIGTERM (exit code -15); under
    ``multiprocessing.Pool(...).map`` the parent then waits for ever (seen: killed by a 60 s timeout). The
    parallel kernels (``NJIT_PARALLEL_FLAGS``, ``prange``) run on Numba's ``omp`` threading layer, which
    GNU OpenMP makes unusable after a fork; a spawn or forkserver child, or a child of a process that never
    compiled, gives the same plan.
    """
    data = _prompts(tmp_path)
    script = textwrap.dedent(f"""
        import multiprocessing as mp
        from aspc.compile_config import CompileConfig
        from aspc.compiler import compile_file
        from aspc.io.options import InputOptions

        from aspc.emit.plan import write_plan

        def job(out):
            write_plan(compile_file({str(data)!r}, InputOptions(), CompileConfig()), out)

        if __name__ == "__main__":
            job({str(tmp_path / "parent.parquet")!r})
            child = mp.get_context("fork").Process(target=job, args=({str(tmp_path / "child.parquet")!r},))
            child.start()
            child.join(60)
            print("exitcode", child.exitcode)
    """)
    r = _python(["-c", script], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "exitcode 0" in r.stdout, (r.stdout, r.stderr[-2000:])
    # The child ran the kernels serially: the same plan, byte for byte.
    assert (tmp_path / "child.parquet").read_bytes() == (tmp_path / "parent.parquet").read_bytes()


def test_ctrl_c_under_a_host_sigint_handler_is_an_interrupt(tmp_path):
    """``aspc.runtime.run``'s docstring: "Interrupted: SIGTERM/SIGINT ...: the commit in progress finished and
    the log is marked ``interrupted``, resumable", against "RunError: The run failed part-way"; the commit
    that made the rule (a2300e2): "a KeyboardInterrupt raised by trainer code is the trainer's failure, a real
    Ctrl-C still an interrupt". Python's documentation of KeyboardInterrupt: it derives from BaseException
    "so as to not be accidentally caught by code that catches Exception".

    A host that installed its own SIGINT handler raising KeyboardInterrupt (the usual pattern: clean up, then
    raise; structio, C-Vise, training loops) calls ``run(plan, log_dir=RUN)``; a real SIGINT arrives while
    the trainer steps. Under Python's default handler the run raises ``aspc.errors.Interrupted`` and marks
    the log ``interrupted``; under the host's handler it raises a RunError (an Exception) "the trainer failed
    at step 0: KeyboardInterrupt; fix it and rerun" and marks the log ``failed``: the host's Ctrl-C is no
    longer a KeyboardInterrupt, so its ``except Exception`` swallows it. ``raised_by_code`` takes any
    KeyboardInterrupt under a SIGINT handler other than ``default_int_handler`` for one the trainer raised.
    """
    data = _prompts(tmp_path)
    script = textwrap.dedent(f"""
        import json, os, signal, time
        from aspc.compile_config import CompileConfig
        from aspc.compiler import compile_file
        from aspc.io.options import InputOptions
        from aspc.runtime import RunConfig, run
        from aspc.runtime.backends.sim_cost import SimCostModel
        from aspc.runtime.trainers.sim import SimTrainer

        def host_handler(signum, frame):
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, host_handler)
        plan = compile_file({str(data)!r}, InputOptions(), CompileConfig())
        trainer = SimTrainer(SimCostModel())
        real = trainer.step

        def step(batch):
            if batch.step == 0:
                os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, while the trainer works
                time.sleep(0.5)
            return real(batch)

        trainer.step = step
        try:
            run(plan, config=RunConfig(global_batch=16), trainer=trainer, log_dir={str(tmp_path / "RUN")!r})
            print("raised nothing")
        except BaseException as exc:
            print("raised", "KeyboardInterrupt" if isinstance(exc, KeyboardInterrupt) else type(exc).__name__)
        print("status", json.loads(open({str(tmp_path / "RUN" / "meta.json")!r}).read())["status"])
    """)
    r = _python(["-c", script], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["raised", "KeyboardInterrupt", "status", "interrupted"], r.stdout


def test_writing_outputs_never_sets_the_process_umask(tmp_path, monkeypatch):
    """POSIX umask(2): the mask is a process attribute, shared by every thread. ``aspc/atomic.py``: outputs get
    "the mode a plain open() would". The hunt's standard: a library leaves its host's state as it was.

    ``aspc.atomic._umask`` (and its copies in ``aspc.report`` and ``aspc.export``) reads the mask as
    ``os.umask(0)`` then ``os.umask(mask)``; every output, plan, run-log part and ``meta.json`` goes through
    it. In between, the whole process creates files with mode 0666/0777. Seen: a host thread creating files
    (a C-level ``open(..., 0666)``, as a checkpoint writer or a log handler in C does) under umask 022 while
    the main thread wrote outputs with ``aspc.atomic.atomic_write_bytes`` got 13 world-writable files (0666)
    in 5 s. (By the same reading, two aspc writers in two threads interleaving there could leave the mask at 0
    for good; not seen in 20,000 writes from 4 threads.)
    Here ``os.umask`` is recorded while the documented API writes a plan and a run log: it is set to 0.
    """
    from aspc.compile_config import CompileConfig
    from aspc.compiler import compile_file
    from aspc.emit.plan import write_plan
    from aspc.io.options import InputOptions
    from aspc.runtime import run

    plan = compile_file(_prompts(tmp_path), InputOptions(), CompileConfig())
    real = os.umask
    set_to: list[int] = []

    def recording(mask: int) -> int:
        set_to.append(mask)
        return real(mask)

    monkeypatch.setattr(os, "umask", recording)
    write_plan(plan, tmp_path / "plan.parquet")
    run(plan, log_dir=tmp_path / "RUN")
    monkeypatch.undo()
    current = os.umask(0o022)
    os.umask(current)
    assert [m for m in set_to if m != current] == []


def test_a_transformer_predictor_leaves_the_hosts_transformers_logging_as_it_was(tmp_path):
    """Python's Logging HOWTO, "Configuring Logging for a Library": the configuration of logging "is the
    prerogative of the application developer", not a library's. The hunt's standard: a library call leaves the
    host's logging configuration as it was.

    A host (a verl or OpenRLHF trainer, which log through transformers) configures transformers' logging at
    WARNING with progress bars on, then compiles through the library with a transformer predictor
    (``compile_file(..., CompileConfig(predictor=pred))``, the library form of ``aspc compile --predictor``;
    ``aspc.predict.load_predictor(pred).predict(...)`` does the same). Afterwards
    ``transformers.utils.logging.get_verbosity()`` is 40 (ERROR) and ``is_progress_bar_enabled()`` False, for
    the rest of the host process: ``aspc.predict.transformer._require_torch`` calls ``set_verbosity_error()``
    and ``disable_progress_bar()`` and never puts them back, so every later transformers warning of the host
    (its own model loads included) is dropped. (The hf backend's ``disable_progress_bar`` calls, in
    ``aspc/runtime/backends/hf.py`` and ``models.py``, leave the bars off the same way.)
    """
    pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[predict]'")
    data = _prompts(tmp_path)
    script = textwrap.dedent(f"""
        import string
        from pathlib import Path
        from tests.conftest import save_tiny_bert
        from aspc.cli import main

        base = save_tiny_bert(Path({str(tmp_path / "tiny")!r}), ["the", "a", "of"], string.ascii_lowercase)
        pred = {str(tmp_path / "pred")!r}
        # The predictor, trained by the command line (which may quiet transformers for itself).
        main(["predict", "train", {str(data)!r}, "--length-field", "lengths", "--kind", "transformer",
              "--base-model", str(base), "--epochs", "1", "-o", pred, "-q"], standalone_mode=False)
        from transformers.utils import logging as tl
        tl.set_verbosity_warning()  # the host's own configuration
        tl.enable_progress_bar()
        from aspc.compile_config import CompileConfig
        from aspc.compiler import compile_file
        from aspc.io.options import InputOptions

        compile_file({str(data)!r}, InputOptions(), CompileConfig(predictor=pred))
        print("verbosity", tl.get_verbosity(), "bars", tl.is_progress_bar_enabled())
    """)
    r = _python(["-c", script], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-4:] == ["verbosity", "30", "bars", "True"], r.stdout


def test_a_report_leaves_the_hosts_matplotlib_backend_as_it_was(tmp_path):
    """README, Layout: ``aspc/report/`` "figures (canvas, plan, run) and the HTML report", whose library form
    is ``aspc.report.write_report``; matplotlib's documentation of ``matplotlib.use``: with pyplot imported,
    ``force=True`` switches pyplot's backend (``pyplot.switch_backend``). The hunt's standard: a library call
    leaves its host's state as it was (a notebook's ``%matplotlib inline``, a GUI app's QtAgg).

    A host with pyplot on the "svg" backend and a figure open calls ``write_report(plan, [RUN], out)``:
    afterwards ``matplotlib.get_backend()`` is "Agg" for the rest of the process, so a notebook's or a GUI's
    later ``plt.show()`` shows nothing. ``aspc.report.canvas.require_matplotlib`` calls
    ``matplotlib.use("Agg", force=True)``, though the report draws on ``matplotlib.figure.Figure`` objects
    of its own, which need no pyplot backend.
    """
    pytest.importorskip("matplotlib", reason="needs matplotlib: pip install 'aspc[report]'")
    data = _prompts(tmp_path)
    script = textwrap.dedent(f"""
        import matplotlib
        matplotlib.use("svg")
        import matplotlib.pyplot as plt
        plt.plot([1, 2, 3])
        from aspc.compile_config import CompileConfig
        from aspc.compiler import compile_file
        from aspc.emit.plan import write_plan
        from aspc.io.options import InputOptions
        from aspc.report import write_report
        from aspc.runtime import run

        plan = compile_file({str(data)!r}, InputOptions(), CompileConfig())
        write_plan(plan, {str(tmp_path / "plan.parquet")!r})
        run(plan, log_dir={str(tmp_path / "RUN")!r})
        write_report({str(tmp_path / "plan.parquet")!r}, [{str(tmp_path / "RUN")!r}], {str(tmp_path / "rep")!r})
        print("backend", matplotlib.get_backend(), "figures", len(plt.get_fignums()))
    """)
    r = _python(["-c", script], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-4:] == ["backend", "svg", "figures", "1"], r.stdout


@pytest.mark.parametrize("script", [True, False], ids=["aspc_script", "python_m"])
def test_an_inherited_ignored_sigint_stays_ignored(tmp_path, script):
    """Python's ``signal`` documentation: "SIGINT is translated into a KeyboardInterrupt exception if the parent
    process has not changed it"; POSIX sh (Shell Command Language, 2.11): in a non-interactive shell an
    asynchronous list (``cmd &``) has "SIGINT and SIGQUIT ... ignored", so that a Ctrl-C at the terminal that
    stops the script's foreground command leaves its background jobs running. README, Signals: "SIGHUP (a
    closed terminal; left ignored under `nohup`)": aspc keeps that convention for SIGHUP only.

    ``aspc compile in.jsonl -o plan.parquet -q`` started with SIGINT ignored (as by ``aspc ... &`` in a
    script, or a launcher that ignores it in its workers) and then sent SIGINT: it exits 130 with "Error:
    interrupted by SIGINT; nothing was written", under the ``aspc`` script (``aspc/entry.py`` installs its
    early handler for SIGINT whatever its disposition) and under ``python -m aspc.cli``
    (``aspc.interrupt._ours`` keeps only an ignored SIGHUP). Plain Python under the same parent ignores it.
    """
    import signal
    import time

    data = _prompts(tmp_path)
    out = tmp_path / "plan.parquet"
    cmd = [str(Path(sys.executable).with_name("aspc"))] if script else [sys.executable, "-m", "aspc.cli"]
    proc = subprocess.Popen([*cmd, "compile", str(data), "-o", str(out), "-q"], cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
        proc.send_signal(signal.SIGINT)  # the terminal's Ctrl-C, again and again
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.is_file()


def converting_trainer(context):  # noqa: ARG001 - the --trainer factory's signature
    """A trainer whose step 1 takes a SIGTERM inside a library that turns aspc's Interrupted into a plain
    KeyboardInterrupt, as Ray's ``ray.get`` does."""
    import time

    from aspc.errors import Interrupted
    from aspc.runtime.backends.sim_cost import SimCostModel
    from aspc.runtime.trainers.sim import SimTrainer

    trainer = SimTrainer(SimCostModel())
    real = trainer.step

    def step(batch):
        if batch.step == 1:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
            except Interrupted:
                raise KeyboardInterrupt from None
        return real(batch)

    trainer.step = step
    return trainer


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_a_sigterm_under_an_inherited_ignored_sigint_still_marks_the_log_interrupted(tmp_path, sigint):
    """Reviewer: with SIGINT left ignored, the CLI's policy (which then holds SIGTERM only) read as inactive, so a
    SIGTERM that a library turned into a plain KeyboardInterrupt was logged as the trainer's failure (exit 2)."""
    import json

    from tests.conftest import invoke_cli

    data = _prompts(tmp_path)
    plan = tmp_path / "plan.parquet"
    assert invoke_cli("compile", data, "-o", plan, "-q").exit_code == 0
    log = tmp_path / "RUN"
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint == "ignored" else None
    r = _python(["-m", "aspc.cli", "run", str(plan), "--global-batch", "16", "--log", str(log), "-q", "--trainer",
                 "tests.test_hunt28_hosts:converting_trainer"], preexec_fn=ignore, timeout=120)  # fmt: skip
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    assert json.loads((log / "meta.json").read_text())["status"] == "interrupted"


def test_predictor_metadata_is_utf8_whatever_the_locale(tmp_path):
    """The hunt's minor finding: ``metadata.json`` was read and written in the locale's encoding
    (EncodingWarning under ``-X warn_default_encoding``)."""
    script = textwrap.dedent(f"""
        from pathlib import Path
        from aspc.predict.base import read_metadata, write_metadata
        d = Path({str(tmp_path)!r})
        write_metadata(d, "lexical", {{}})
        print(read_metadata(d, kind="lexical")["aspc_predictor"])
    """)
    r = _python(["-X", "warn_default_encoding", "-W", "error::EncodingWarning", "-c", script])
    assert r.returncode == 0 and r.stdout.strip() == "lexical", r.stderr[-2000:]
