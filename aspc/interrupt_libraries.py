"""aspc's signal policy through libraries that take signals for themselves.

:mod:`aspc.interrupt` raises :class:`~aspc.errors.Interrupted` in the main
thread. Some libraries get in its way: Ray installs its own SIGTERM handler
and its C++ side changes SIGTERM behind Python's back
(:func:`kept`), Ray's ``ray.get`` turns the Interrupted into a plain
KeyboardInterrupt (:func:`ours_again`), and vLLM swallows KeyboardInterrupt
while its engine starts (:func:`must_escape`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from aspc import interrupt
from aspc.errors import Interrupted

INSIST_SECONDS = 1.0  # how often a swallowed interrupt is raised again


class _MustEscape:
    """One :func:`must_escape` block: the signal raised inside it, raised again until the block is left."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def raised(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum
            timer = threading.Timer(INSIST_SECONDS, self._insist)
            timer.daemon = True
            timer.start()

    def _insist(self) -> None:
        # Still inside: the Interrupted was swallowed. Raise it again where the main thread is now.
        ours = self.signum is not None and signal.getsignal(self.signum) is interrupt._handler
        if self in interrupt._escapes and ours:
            signal.pthread_kill(threading.main_thread().ident, self.signum)
            timer = threading.Timer(INSIST_SECONDS, self._insist)
            timer.daemon = True
            timer.start()


@contextlib.contextmanager
def must_escape() -> Iterator[None]:
    """An :class:`Interrupted` raised inside must leave the block, even through a library that swallows it.

    vLLM's ``zmq_socket_ctx`` catches KeyboardInterrupt while its engine
    starts and goes on to wait up to 10 minutes for an engine that may be
    dead: a Ctrl-C then hung ``aspc run``. While the block is still open after
    a raise, the signal is raised again every second; a block that ends
    normally after one raises it at its end.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    block = _MustEscape()
    interrupt._escapes.append(block)
    try:
        yield
    except Interrupted:
        raise
    except BaseException:
        if block.signum is None:
            raise
        # Swallowed, then another error (vLLM: "Engine core initialization failed" once the engine died
        # of the same Ctrl-C): the signal is what happened.
        raise Interrupted(block.signum) from None
    finally:
        interrupt._escapes.remove(block)
    if block.signum is not None:
        raise Interrupted(block.signum)


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """Put aspc's handlers back after a library call that installs its own (``ray.init`` takes SIGTERM).

    Ray's handler ends the process with ``sys.exit(15)``: no run log marked
    interrupted, no resume command, exit 15. Only handlers of an active
    :func:`handlers` block are put back; a library user's own stay Ray's.
    They are put back even where Python's table still names ours: a C
    library's ``sigaction`` changes the process's disposition behind it
    (``ray.shutdown`` left SIGTERM at the default action, and a SIGTERM then
    killed the run with no message and its log still "running").
    """
    main = threading.current_thread() is threading.main_thread()
    before = {s: signal.getsignal(s) for s in interrupt.SIGNALS} if main else {}
    try:
        yield
    finally:
        for s, h in before.items():
            if h is interrupt._handler:
                signal.signal(s, interrupt._handler)


def no_ray_failure_handler(ray: Any) -> None:
    """Keep Ray's C++ crash handler (absl's) out of a driver whose signals aspc handles; ``ray`` the module.

    It takes SIGTERM from inside ``ray.init`` (a SIGTERM then killed the run
    with no message) and sets it to the default action at ``ray.shutdown``.
    Only this process's driver: the workers the raylet starts keep it.
    """
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)  # read when the CoreWorker is made
    if constants is not None and signal.getsignal(signal.SIGTERM) is interrupt._handler:
        constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True  # another Ray: kept() puts the handlers back


@contextlib.contextmanager
def ours_again() -> Iterator[None]:
    """A plain KeyboardInterrupt from inside the block becomes the :class:`Interrupted` it stands for.

    Ray's ``ray.get`` checks for signals while it waits and raises a plain
    KeyboardInterrupt in place of the :class:`Interrupted` our handler raised,
    losing the signal: click then printed "Aborted!" and exited 1.
    """
    try:
        yield
    except Interrupted:
        raise
    except KeyboardInterrupt:
        raise Interrupted(interrupt._last if interrupt._last is not None else signal.SIGINT) from None
