"""The ``aspc`` command line: a thin skin over the library.

Commands are loaded lazily so that ``aspc --help`` and ``aspc compile`` never
import torch, transformers, ray or matplotlib.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from aspc import __version__
from aspc.cli.error_line import LineError, error_line
from aspc.errors import Interrupted

# command name -> (module under aspc.cli, attribute)
_COMMANDS = {
    "compile": ("compile", "compile_cmd"),
    "check": ("check", "check_cmd"),
    "inspect": ("inspect", "inspect_cmd"),
    "predict": ("predict", "predict_group"),
    "probe": ("probe", "probe_cmd"),
    "run": ("run", "run_cmd"),
    "simulate": ("simulate", "simulate_cmd"),
    "calibrate": ("calibrate", "calibrate_cmd"),
    "report": ("report", "report_cmd"),
    "export": ("export", "export_cmd"),
}
# Commands whose process skips the interpreter's teardown once they succeed:
# offline work, no threads or engines of their own left (interrupt.end_process).
_LEAN_EXIT = frozenset({"compile", "simulate", "check", "inspect"})


class _UsageLine(LineError):
    """A click usage error shown as one line (click's own form is four: usage, hint, blank, error)."""

    exit_code = 2

    def __init__(self, exc: click.UsageError) -> None:
        super().__init__(" ".join(exc.format_message().split()))
        self.command_path = exc.ctx.command_path if exc.ctx is not None else "aspc"

    def show(self, file=None) -> None:  # noqa: ANN001, ARG002 - click's signature; always stderr
        error_line(f"Error: {self.message} (see '{self.command_path} --help')")


def _from_click_echo(exc: OSError) -> bool:
    """``exc`` came from click writing help, a version or a usage line (``aspc --help > /dev/full``)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code if tb is not None else None
    return code is not None and code.co_name == "echo" and code.co_filename.endswith(("click/utils.py", "click\\utils.py"))


def _output_line(exc: OSError) -> click.ClickException:
    """click's own output failed: one line (exit 2), or a silent exit 141 when the reader closed the pipe."""
    from aspc.cli.common import stdout_failure

    err = stdout_failure(exc, "the help or version text")
    if err.pipe_closed:
        sys.exit(128 + 13)
    line = LineError(str(err))
    line.exit_code = err.exit_code
    return line


class _InterruptLine(LineError):
    """SIGTERM/SIGINT outside a command's own handling: one line, exit 128 + signal."""

    def __init__(self, exc: Interrupted) -> None:
        from aspc import interrupt

        super().__init__(f"interrupted by {interrupt.signal_name(exc.signum)}; {interrupt.outcome()}")
        self.exit_code = exc.exit_code


class _LazyGroup(click.Group):
    _ran: str | None = None  # the command this process resolved

    def main(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - click's signature
        # The signal policy holds from the first moment, not only inside a
        # command: a SIGINT while the command module imports is one line too.
        from aspc import interrupt

        # Reading sys.argv means this is the process's own command line (not an
        # in-process caller such as click's test runner). Once its exit code is
        # decided, a signal during teardown (library thread pools, atexit) ends
        # the process at once with that code, not as a silent kill by signal.
        process = (args[0] if args else kwargs.get("args")) is None
        if process and sys.stdout is None and {"-h", "--help", "--version"} & set(sys.argv[1:]):
            # Started with stdout closed (>&-): click drops its help and version text without a word, exit 0.
            from aspc.cli.common import StdoutError, _Stdout

            try:
                _Stdout._call("flush")  # the commands' own line for a closed stdout
            except StdoutError as exc:
                error_line(f"Error: {exc}")
                sys.exit(exc.exit_code)
        if process:
            interrupt.exit_at_teardown()
            from aspc.cli.result_stream import for_the_process

            for_the_process()  # foreign output stays off stdout through the exit (atexit hooks print)
        try:
            with interrupt.handlers(restore=not process):
                code = 1
                try:
                    value = super().main(*args, **kwargs)
                    code = 0
                    return value
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
                    raise
                finally:
                    if process:
                        interrupt.exit_on_signal(code)
                        if code == 0 and self._ran in _LEAN_EXIT:
                            interrupt.end_process(code)
                        if interrupt.interrupted_exit(code):
                            # Outputs are whole or gone; the atexit hooks run, the interpreter's teardown
                            # is skipped: with Ray's core worker stopped mid-start it crashed (exit -11).
                            interrupt.end_process(code)
        except Interrupted as exc:
            error_line(f"Error: interrupted by {interrupt.signal_name(exc.signum)}; {interrupt.outcome()}")
            if process:
                interrupt.end_process(exc.exit_code)  # as in the finally above
            sys.exit(exc.exit_code)

    def make_context(self, info_name, args, parent=None, **extra):  # noqa: ANN001, ANN201 - click's signature
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise _UsageLine(exc) from None
        except Interrupted as exc:
            # click would print "Aborted!" and exit 1; keep the policy's line and code.
            raise _InterruptLine(exc) from None
        except OSError as exc:
            if not _from_click_echo(exc):
                raise
            raise _output_line(exc) from None

    def invoke(self, ctx: click.Context):  # noqa: ANN201 - click's signature
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise _UsageLine(exc) from None
        except Interrupted as exc:
            # click would print "Aborted!" and exit 1; keep the policy's line and code.
            raise _InterruptLine(exc) from None
        except OSError as exc:
            if not _from_click_echo(exc):
                raise
            raise _output_line(exc) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [
            name
            for name, (mod, _attr) in _COMMANDS.items()
            if importlib.util.find_spec(f"aspc.cli.{mod}") is not None
        ]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in _COMMANDS:
            return None
        mod, attr = _COMMANDS[name]
        if importlib.util.find_spec(f"aspc.cli.{mod}") is None:
            return None
        self._ran = name
        return _with_help(getattr(importlib.import_module(f"aspc.cli.{mod}"), attr))


def _with_help(cmd: click.Command) -> click.Command:
    """``cmd`` (and its subcommands) with the help text its docstring gives, under ``python -OO`` too.

    click takes a command's description from its function's ``__doc__``, which ``-OO`` (``PYTHONOPTIMIZE=2``,
    as production images set) discards: ``--help`` lost what each command does and what its exit codes mean.
    The docstring is then read from the source. Without ``-OO`` nothing is done.
    """
    if sys.flags.optimize < 2:
        return cmd
    for sub in [cmd, *getattr(cmd, "commands", {}).values()]:
        if sub.help is None and sub.callback is not None:
            sub.help = _docstring(sub.callback)
    return cmd


def _docstring(fn: object) -> str | None:
    import ast
    import inspect
    import textwrap

    fn = inspect.unwrap(fn)  # click's pass_context and the like
    try:
        node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):  # no source installed: the options still show
        return None
    return ast.get_docstring(node) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="aspc")
def main() -> None:
    """aspc: compile generation schedules for LLM reinforcement learning.

    \b
    aspc compile prompts.jsonl -o plan.parquet
    aspc check plan.parquet --max-imbalance 0.01
    aspc run plan.parquet
    """


_with_help(main)
