"""The ``aspc`` console script: the signal policy from the first moment the process runs aspc code.

The command line (:mod:`aspc.cli`) takes 30-60 ms to import (click, rich's
pieces, the error types) before its own handlers are in place; a Ctrl-C or a
SIGTERM in that window printed a KeyboardInterrupt traceback or killed the
process without a word. This module imports nothing heavy, so its handler is in
place within a few milliseconds of the interpreter's start. Nothing has been
written by then, so the handler can exit at once.
"""

from __future__ import annotations

import os
import signal
import sys


def _before_the_command(signum: int, _frame: object) -> None:
    name = signal.Signals(signum).name
    try:
        os.write(2, f"Error: interrupted by {name}; nothing was written\n".encode())
    except OSError:
        pass  # stderr closed or full: the exit code still says it
    os._exit(128 + signum)


def refuse_a_small_address_space() -> None:
    """Exit 2 with one line where ``ulimit -v`` is too small to load aspc's libraries (:mod:`aspc.address_space`).

    Help and version load no numerical library, so they still answer. (An option value spelled
    ``--help``, as in ``-o --help``, counts as help: the check is skipped, not the command.)
    """
    from aspc.address_space import too_small

    if (refusal := too_small()) is not None and not {"-h", "--help", "--version"} & set(sys.argv[1:]):
        try:
            os.write(2, f"Error: {refusal}\n".encode())
        except OSError:
            pass  # stderr closed or full: the exit code still says it
        sys.exit(2)


def main() -> None:
    """Install the early handler, then hand over to the command line (whose own policy replaces it)."""
    for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)):
        # An ignored SIGHUP (nohup) or SIGINT (`aspc ... &` in a script) stays ignored, as aspc.interrupt keeps it.
        if s is not None and not (s != signal.SIGTERM and signal.getsignal(s) is signal.SIG_IGN):
            signal.signal(s, _before_the_command)
    refuse_a_small_address_space()
    from aspc.cli import main as command_line

    sys.exit(command_line())
