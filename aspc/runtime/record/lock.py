"""One writer per run log: an exclusive ``flock`` on ``RUN/.lock``.

Two ``aspc run --log RUN`` at once (typically two ``--resume``) used to
interleave their parts and commits: both ended ``complete`` with samples
missing or duplicated. The lock is taken before the log's status is read
(so the second process never even decides what to resume) and held until
the run's last commit; the kernel releases it when the process dies, so a
crash or SIGKILL never leaves a stale lock behind.

The lock file holds the holder's pid, for the message the second writer
gets. It is removed on release *before* the descriptor is closed, and a
writer that locked a file checks it is still the one at the path (else it
retries), so a process that opened the old file just before its removal
can never hold a lock on a file no longer in the directory.

It also names its directory (its inode). A hard-linked copy of a log
(``cp -al``, ``rsync --link-dest`` snapshots) shares the lock file's inode:
refused while the original's writer holds it, the copy's writer is told so and
how to give the copy a lock of its own (remove the link), rather than to stop
a process that is writing another log. aspc never replaces the file itself:
a check-then-rename cannot be made atomic against a second writer (on a
network file system not even under a directory lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from aspc.errors import LockError, RunError

LOCK_FILE = ".lock"


class RunLogLock:
    """An exclusive, non-blocking writer lock on the run directory ``path``."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.file = self.path / LOCK_FILE
        self._fd: int | None = None
        self._created_dir = False  # we made the directory: remove it if nothing else was written

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock (creating the directory if needed) or raise :class:`LockError` at once."""
        if self._fd is not None:
            return
        try:
            if not self.path.exists():
                self.path.mkdir(parents=True, exist_ok=True)
                self._created_dir = True
        except OSError as exc:
            raise RunError(
                f"--log {self.path}: cannot create the run directory ({exc.strerror}); choose a writable path"
            ) from None
        while True:
            try:
                fd = os.open(self.file, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as exc:
                raise RunError(
                    f"--log {self.path}: cannot create its lock file ({exc.strerror}); choose a writable path"
                ) from None
            try:
                _lock_now_or_soon(fd)
            except BlockingIOError:
                holder, shared = _read_pid(fd), _foreign(fd, self.path)
                os.close(fd)
                raise (_shared(self.path, holder) if shared else _locked(self.path, holder)) from None
            except BaseException:
                os.close(fd)
                raise
            # The file may have been replaced between open and flock (a
            # writer removing the directory it created); lock the current one.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.file).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n{_identity(self.path)}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (file removed first); a directory this lock created and nothing else used goes too."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            self.file.unlink()
        if self._created_dir:
            with contextlib.suppress(OSError):
                self.path.rmdir()  # only if empty: no log was started
        os.close(fd)  # closing the descriptor releases the flock

    def __enter__(self) -> RunLogLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _lock_now_or_soon(fd: int) -> None:
    """The exclusive lock, tried twice 50 ms apart: :func:`refuse_if_locked` holds a shared one for a moment.

    A writer holds it for its whole run, so the second try fails the same way
    for a real holder; it only spares a writer that met another command's probe.
    """
    import time

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        time.sleep(0.05)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def refuse_if_locked(path: str | os.PathLike) -> None:
    """Raise the second writer's :class:`LockError` if an aspc run is writing the log at ``path`` now.

    For a command about to refuse ``path`` for what it holds: a log another
    run is still writing is worded as such, not as a directory to pass
    ``--overwrite`` or ``--resume`` for. The probe takes a shared lock for a
    moment, so call it only on the way to an error.
    """
    try:
        fd = os.open(Path(path) / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return  # no lock file: no writer
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            shared = _foreign(fd, Path(path))
            raise (_shared if shared else _locked)(Path(path), _read_pid(fd)) from None
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _shared(path: Path, holder: int | None) -> LockError:
    """The lock file of ``path`` is a hard link to another run log's, which that log's writer holds."""
    who = f"pid {holder}" if holder else "another process"
    return LockError(
        f"--log {path}: its lock file {path / LOCK_FILE} is a hard link to another run log's (a copy made with "
        f"cp -al or rsync --link-dest), which an aspc run ({who}) holds while it writes that log, not this one; "
        f"remove the link (rm {path / LOCK_FILE}: the other log keeps its own) and rerun"
    )


def _locked(path: Path, holder: int | None) -> LockError:
    who = f"pid {holder}" if holder else "another process"
    stop = f"kill -TERM {holder}" if holder else "stop it"
    return LockError(
        f"--log {path} is locked by another aspc run ({who}, lock file {path / LOCK_FILE}); "
        f"wait for it to finish, or stop it ({stop}) and rerun with --resume"
    )


def _read_pid(fd: int) -> int | None:
    text = _lines(fd)[0]
    return int(text) if text.isdigit() else None


def _lines(fd: int) -> list[str]:
    """The lock file's lines: the holder's pid, its directory's identity (none in locks of older aspc)."""
    try:
        text = os.pread(fd, 96, 0).decode(errors="replace")
    except OSError:
        return [""]
    return [ln.strip() for ln in text.splitlines()] or [""]


def _identity(path: Path) -> str:
    # The inode alone: a hard-linked copy is on the same file system, and a network file system gives each
    # client its own st_dev for the same directory (a writer on another node must still be seen).
    try:
        return f"ino:{os.stat(path).st_ino}"
    except OSError:  # written after the flock is taken: never a reason to fail there
        return ""


def _foreign(fd: int, path: Path) -> bool:
    """The open lock file came with a hard-linked copy: it has other links, and names another directory.

    Both, so that a live writer's own lock file (one link) is never taken for another's, whatever inode
    numbers a file system hands out to its clients.
    """
    lines = _lines(fd)
    try:
        return os.fstat(fd).st_nlink > 1 and len(lines) > 1 and bool(lines[1]) and lines[1] != _identity(path)
    except OSError:
        return False
