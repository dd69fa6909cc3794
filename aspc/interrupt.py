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

import _weakrefset
import contextlib
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from types import FrameType
from typing import Any

from aspc.errors import Interrupted

# SIGHUP too: a closed terminal or a dropped ssh session ended a command with its temporaries left
# and a run log still "running", without a word. Under nohup (SIGHUP ignored) it stays ignored.
SIGNALS = (signal.SIGTERM, signal.SIGINT) + ((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())


def _ours(s: int) -> bool:
    """Whether aspc takes signal ``s``: every one of :data:`SIGNALS`, but an ignored SIGHUP (nohup) or SIGINT.

    A shell starts ``aspc ... &`` of a script with SIGINT ignored, so that a Ctrl-C meant for the
    foreground job leaves it running; Python keeps such a SIGINT ignored, and so does aspc.
    """
    return not (s in _KEPT_IGNORED and signal.getsignal(s) is signal.SIG_IGN)


_KEPT_IGNORED = (signal.SIGINT,) + ((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())

# Re-entrant: the handler takes it, and runs in the main thread between any two bytecodes, also
# while the main thread holds it (in deferred()); a plain Lock would deadlock there.
_lock = threading.RLock()
_depth = 0  # open deferred() blocks, any thread
_pending: int | None = None  # a signal that arrived inside one
_written: list[str] = []  # outputs put in place, whole, since handlers() was entered
_last: int | None = None  # the signal _handler last raised as Interrupted
_runs: dict[int, int] = {}  # signal -> calls of _handler for it
_forwarded: set[int] = set()  # signals _Wakeup sent on to the main thread, not yet handled there
_raised: set[int] = set()  # signals raised as Interrupted since handlers() was entered


def _handler(signum: int, frame: FrameType | None) -> None:
    global _pending
    _runs[signum] = _runs.get(signum, 0) + 1
    if signum in _forwarded:
        _forwarded.discard(signum)
        if signum in _raised:
            return  # the watcher's copy of a signal the main thread had already taken: raised once is enough
    with _lock:
        if _depth > 0:
            _pending = signum
            _mark_raised(signum)  # raised at the block's end: a watcher's copy must not raise it again
            return
    if _in_finalizer(frame):
        # Raised here it would be printed and dropped, or cut Numba's state in
        # half (an llvmlite object stopped in its disposal is freed twice: a
        # segfault). The signal is sent again in a moment, until it lands
        # outside such code.
        timer = threading.Timer(_RETRY_SECONDS, _resend, (signum,))
        timer.daemon = True
        timer.start()
        return
    _mark_raised(signum)
    raise Interrupted(signum)


def _mark_raised(signum: int) -> None:
    global _last
    _last = signum
    _raised.add(signum)
    if _escapes:
        _escapes[-1].raised(signum)


_RETRY_SECONDS = 0.005
_escapes: list[Any] = []  # open aspc.interrupt_libraries.must_escape() blocks, innermost last


def _resend(signum: int) -> None:
    """Deliver ``signum`` to the main thread again, as a real signal.

    ``_thread.interrupt_main`` only sets Python's flag, which a main thread
    blocked in a C call never looks at: a Ctrl-C that first landed in an
    import while vLLM's engine started then waited out zmq's poll (up to 10
    minutes) and was lost. A real signal interrupts the call (EINTR), and the
    handler runs. Nothing is sent once the policy is gone (the command ended).
    """
    if signal.getsignal(signum) is _handler:
        signal.pthread_kill(threading.main_thread().ident, signum)


# Code an exception must not cut in half: finalizers (Python prints and drops
# the exception) and Numba's compiler, loader and type registry (their weakref
# callbacks and llvmlite object disposal are not exception-safe).
_UNSAFE_DIRS = (f"{os.sep}numba{os.sep}", f"{os.sep}llvmlite{os.sep}")
# The import system: its module-lock weakref callback drops the exception and leaves the lock held,
# so a thread importing the same module (the plan preload's) waits for ever, and so does the main
# thread joining it. Seen as a traceback, then a hang, on a signal during `aspc run`'s start. So a
# signal waits while an import runs, except in a raising_in_imports() block (a user's --trainer
# module: held, a Ctrl-C waited out its whole import, then its factory's error ended the command
# and the Ctrl-C was lost); there it waits only while the import system's own code runs.
_IMPORT_FILES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
# A weakref callback (WeakKeyDictionary's ``remove``, WeakSet's ``_remove``, ``weakref.finalize``
# calling its function): Python prints the exception as "Exception ignored in" and drops it, and
# the command went on to exit 0.
_UNSAFE_FILES = (weakref.__file__, _weakrefset.__file__)
_imports_raise = 0  # open raising_in_imports() blocks


@contextlib.contextmanager
def raising_in_imports() -> Iterator[None]:
    """A signal lands in the top-level code of a module being imported, not after its import.

    Raised there, it unwinds as any error at import does (the import system takes the module out of
    sys.modules and releases its lock). Only around an import whose own code may run long, and inside
    :func:`aspc.interrupt_libraries.must_escape`: module code that catches everything would swallow it.
    """
    global _imports_raise
    _imports_raise += 1
    try:
        yield
    finally:
        _imports_raise -= 1


def _in_finalizer(frame: FrameType | None) -> bool:
    """Whether the main thread is inside a ``__del__``, a weakref callback, Numba/llvmlite code or the import
    system (in a :func:`raising_in_imports` block: only while the import system's own code runs)."""
    if frame is not None and frame.f_code.co_filename in _IMPORT_FILES:
        return True
    held = _UNSAFE_FILES if _imports_raise else _UNSAFE_FILES + _IMPORT_FILES
    while frame is not None:
        code = frame.f_code
        name = code.co_filename
        if code.co_name == "__del__" or name in held or any(d in name for d in _UNSAFE_DIRS):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def handlers(restore: bool = True) -> Iterator[None]:
    """Install the policy for the duration of a command (main thread only).

    ``restore=False`` keeps whatever handler the block installed last (the
    command-line process hands over to :func:`exit_on_signal`, with no moment
    under the default action in between).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    global _last
    previous = {s: signal.signal(s, _handler) for s in SIGNALS if _ours(s)}
    _written.clear()
    _raised.clear()
    _last = None
    wakeup = _Wakeup() if restore else _Wakeup.for_process()
    try:
        yield
    finally:
        if restore:
            wakeup.close()  # first: nothing is sent on once the handlers are back
            for s, h in previous.items():
                signal.signal(s, h)


class _Wakeup:
    """Signals that land in another thread while the main one waits in a C call, sent on to the main thread.

    Python runs a handler only in the main thread, between bytecodes. A
    signal the kernel hands to a library's thread (zmq's, torch's) only sets
    a flag, and a main thread waiting in a C call that never returns to
    Python does not see it: a Ctrl-C while vLLM's engine started waited out
    zmq's poll (up to 10 minutes). Python's C handler also writes the signal
    number to the wakeup fd; this thread reads it and, when the main thread
    has not run the handler a moment later, sends the signal to the main
    thread itself, which interrupts its call (EINTR) so the handler runs.
    """

    WAIT = 0.2  # seconds the main thread has to run the handler on its own
    TRIES = 50
    _process: _Wakeup | None = None  # the command-line process's own, kept to its end

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        try:
            self._old = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        except ValueError:  # not the main thread of the main interpreter
            self._old = None
            os.close(self._w)
            os.close(self._r)
            return
        self._main = threading.main_thread().ident
        _Wakeup._pipes.add((self._r, self._w))
        if not _Wakeup._fork_hook:
            os.register_at_fork(after_in_child=_Wakeup._after_fork)
            _Wakeup._fork_hook = True
        self._echoes: dict[int, int] = {}  # signals this thread sent, whose bytes come back too
        self._closed = False
        self._send = threading.Lock()  # close() waits for a send under way: none lands after it
        threading.Thread(target=self._watch, name="aspc-signal-wakeup", daemon=True).start()

    _pipes: set[tuple[int, int]] = set()  # (read, write) ends of the watchers' pipes, open now
    _fork_hook = False

    @staticmethod
    def _after_fork() -> None:
        # A forked child (a fork-started worker) inherits the wakeup fd, not the watcher: its own signals
        # would be read by the parent's watcher and sent on to the parent, interrupting it.
        with contextlib.suppress(ValueError, OSError):
            old = signal.set_wakeup_fd(-1)
            if old not in {w for _, w in _Wakeup._pipes}:
                signal.set_wakeup_fd(old)  # not ours: the child keeps it
        for fds in _Wakeup._pipes:  # the child's copies: the parent's watcher then reads end of file on close
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        _Wakeup._pipes.clear()

    @classmethod
    def for_process(cls) -> _Wakeup:
        if cls._process is None:
            cls._process = cls()
        return cls._process

    def _watch(self) -> None:
        try:
            while (data := os.read(self._r, 64)) and not self._closed:
                for signum in data:
                    if signum not in SIGNALS:
                        continue
                    if self._echoes.get(signum):
                        self._echoes[signum] -= 1
                        continue
                    self._forward(signum, _runs.get(signum, 0))
        except OSError:
            pass
        finally:
            os.close(self._r)

    def _forward(self, signum: int, runs: int) -> None:
        # The handler may have run just before the byte was read: then the copy sent on is
        # dropped by the handler (_forwarded), so it is never raised twice.
        for _ in range(self.TRIES):
            time.sleep(self.WAIT)
            with self._send:
                if self._closed or _runs.get(signum, 0) != runs or signal.getsignal(signum) is not _handler:
                    return
                self._echoes[signum] = self._echoes.get(signum, 0) + 1
                _forwarded.add(signum)
                signal.pthread_kill(self._main, signum)

    def close(self) -> None:
        if self._old is None:
            return
        with self._send:
            self._closed = True
        _Wakeup._pipes.discard((self._r, self._w))
        with contextlib.suppress(ValueError):
            prev = signal.set_wakeup_fd(self._old)
            if prev != self._w:
                signal.set_wakeup_fd(prev)  # another's since (an asyncio loop's): theirs stays
        os.close(self._w)  # the watcher reads end of file and ends


@contextlib.contextmanager
def deferred(drop: bool = False) -> Iterator[None]:
    """Hold SIGTERM/SIGINT until the block ends (a commit must finish whole).

    ``drop``: a signal that came is dropped, not raised: for the last line a command writes
    before it exits with that line's code (:func:`aspc.cli.error_line.error_line`).
    """
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
        if signum is not None and not drop:
            if threading.current_thread() is threading.main_thread():
                raise Interrupted(signum)
            # Deliver it where the handler can raise: the main thread.
            _resend(signum)


def policy_active() -> bool:
    """Whether :func:`handlers` holds SIGINT now: a command of the CLI runs, not a caller of the Python API."""
    return _held_by_policy()


def signal_taken() -> int | None:
    """The signal aspc's handler last raised as :class:`Interrupted`, while its policy is in force (else None:
    a signal an earlier in-process command took says nothing of a KeyboardInterrupt now)."""
    return _last if _held_by_policy() else None


def _held_by_policy() -> bool:
    # SIGTERM too: under an inherited ignored SIGINT (`aspc ... &` in a script) the policy holds SIGTERM only.
    return any(signal.getsignal(s) is _handler for s in (signal.SIGINT, signal.SIGTERM))


def interrupted_exit(code: int) -> bool:
    """Whether ``code`` is the exit code of the signal this command was interrupted by."""
    return _last is not None and code == 128 + _last


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def note_written(path: str | os.PathLike) -> None:
    """An output is in place, whole (called by :mod:`aspc.atomic` after its rename)."""
    with _lock:
        _written.append(os.fspath(path))


def written() -> list[str]:
    """The outputs this command has written whole and that are still there, in the order written."""
    with _lock:
        names = list(dict.fromkeys(_written))
    # A run log compacts its parts (and a resume replaces them): a file written whole and since
    # removed is not left behind.
    return [n for n in names if os.path.lexists(n)]


def outcome() -> str:
    """What an interrupted command left: nothing, or the outputs it had already written whole.

    A signal can land after the last rename (the output complete, the command
    not yet returned); the message must not then say nothing was written.
    """
    names = written()
    if not names:
        return "nothing was written"
    return f"{', '.join(names)} had already been written in full"


def exit_on_signal(code: int) -> None:
    """From now on SIGTERM/SIGINT end the process at once with exit ``code``.

    For the command-line process only, once its command has finished: every
    output is already in place and synced, so a signal during the interpreter's
    teardown (library thread pools, atexit hooks, which can also hang) exits
    with the command's own code instead of a silent kill by signal.
    """
    global _exit_code
    if threading.current_thread() is not threading.main_thread():
        return
    _exit_code = code
    for s in SIGNALS:
        if _ours(s):
            signal.signal(s, _exit_now)


_exit_code: int | None = None


def _exit_now(_signum: int = 0, _frame: object = None) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(_exit_code if _exit_code is not None else 1)


def end_process(code: int) -> None:
    """End the finished command-line process now: atexit hooks, flushed streams, ``os._exit(code)``.

    What is skipped is the interpreter's teardown of a million-prompt heap
    (every module's objects freed one by one: 0.25-0.34 s of a 3-4 s
    compile); the kernel frees the memory at exit in a few ms. Only for
    commands that leave no thread of their own behind (the caller decides).
    """
    import atexit

    global _exit_code
    atexit._run_exitfuncs()
    _exit_code = code
    _exit_now()


def exit_at_teardown() -> None:
    """Hold SIGTERM/SIGINT through the last of interpreter teardown, once :func:`exit_on_signal` ran.

    Registered before anything else, so it runs after every other atexit hook
    registered later (Ray's, vLLM's shutdowns). What teardown does after the
    atexit hooks resets Python-level handlers to the default action, so a
    SIGTERM there would kill the finished process with no message. Ignored
    (the one disposition teardown keeps, and process-wide: library threads
    would take a signal their own thread's mask lets through), it is dropped.
    """
    import atexit

    def _hold() -> None:
        if _exit_code is not None and threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                if _ours(s):
                    signal.signal(s, signal.SIG_IGN)

    atexit.register(_hold)
