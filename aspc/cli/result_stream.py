"""stdout for the command's result only: what code that is not aspc's prints goes to stderr.

A trainer that printed (verl's and OpenRLHF's code prints freely), model
libraries, Ray's forwarded worker logs and their shutdown hooks at exit wrote
to the descriptor a ``--json`` result goes to, and the JSON could not be read.
While :func:`results_only_on_stdout` holds, ``sys.stdout`` and descriptor 1
point at stderr (at /dev/null when stderr is closed), and aspc's own results
go to :func:`real_stdout`, a stream on the descriptor the command was given.
Imports nothing heavy: the command line's entry marks its own process
(:func:`for_the_process`) before any command module loads.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

_results: Any = None  # the result stream while foreign output is sent away; None: sys.stdout
_process = False  # the console script's own process: the redirection holds until it exits


def real_stdout() -> Any:
    """The stream the command's result goes to."""
    return _results if _results is not None else sys.stdout


def for_the_process() -> None:
    """This process is the ``aspc`` command itself: keep foreign output off stdout until it exits.

    Atexit hooks (Ray's and vLLM's shutdown) and library threads print after the command has
    returned; restoring stdout then put their lines after the JSON result.
    """
    global _process
    _process = True


@contextlib.contextmanager
def results_only_on_stdout() -> Iterator[None]:
    """Send what foreign code prints to stderr, in Python and at descriptor 1, for the block (in the console
    script's process: until it exits); aspc's results still go to the real stdout through :func:`real_stdout`."""
    global _results
    real = sys.stdout
    if _results is not None or real is None:  # nested, or started with stdout closed (>&-): nothing to keep clean
        yield
        return
    null = open(os.devnull, "w") if sys.stderr is None else None  # noqa: SIM115 - closed below
    sink = sys.stderr if null is None else null  # stderr closed (2>&-): dropped, never mixed into the result
    fd = saved = None
    try:
        fd = real.fileno()
        real.flush()
        saved = os.dup(fd)
        os.dup2(sink.fileno(), fd)
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's capture): Python's stdout only
        if saved is not None:
            os.close(saved)
        fd = saved = None
    # Line-buffered as a terminal's stdout is; it writes to the descriptor the command was given.
    _results = real if saved is None else os.fdopen(saved, "w", encoding=real.encoding, errors=real.errors,
                                                    buffering=1, closefd=False)  # fmt: skip
    sys.stdout = sink
    try:
        yield
    finally:
        if _process and saved is not None:
            with contextlib.suppress(OSError):
                _results.flush()  # the process ends with os._exit, which flushes nothing
        else:
            _restore(real, fd, saved, null)


def _restore(real: Any, fd: int | None, saved: int | None, null: Any) -> None:
    global _results
    sys.stdout = real
    try:
        if saved is not None:
            with contextlib.suppress(OSError):
                _results.close()  # flushes; closefd=False leaves the descriptor to the line below
            os.dup2(saved, fd)
            os.close(saved)
    finally:
        _results = None
        if null is not None:
            null.close()
