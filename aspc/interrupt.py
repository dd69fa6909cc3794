"""One signal policy for every long command: SIGTERM and SIGINT behave alike.

While :func:`handlers` is active, either signal raises :class:`Interrupted`
in the main thread, so ``finally`` blocks and ``except BaseException``
cleanups run: :mod:`aspc.atomic` removes its temporary file, the run log
finishes the commit in progress and marks itself ``interrupted``. A signal
arriving inside :func:`deferred` (a commit: part files, then ``meta.json``)
waits until the block ends, so a commit is never cut in half by a signal we
can catch. SIGKILL cannot be caught; the run log's commit protocol covers it.

The library never installs handlers itself; the CLI does, around a command.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import threading
from collections.abc import Iterator

from aspc.errors import Interrupted

SIGNALS = (signal.SIGTERM, signal.SIGINT)

_lock = threading.Lock()
_depth = 0  # open deferred() blocks, any thread
_pending: int | None = None  # a signal that arrived inside one


def _handler(signum: int, _frame: object) -> None:
    global _pending
    with _lock:
        if _depth > 0:
            _pending = signum
            return
    raise Interrupted(signum)


@contextlib.contextmanager
def handlers() -> Iterator[None]:
    """Install the policy for the duration of a command (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGTERM/SIGINT until the block ends (a commit must finish whole)."""
    global _depth, _pending
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            signum = _pending if _depth == 0 else None
            if signum is not None:
                _pending = None
        if signum is not None:
            if threading.current_thread() is threading.main_thread():
                raise Interrupted(signum)
            # Deliver it where the handler can raise: the main thread.
            _thread.interrupt_main(signum)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
