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

It also names its directory (its inode): a hard-linked copy of a log
(``cp -al``, ``rsync --link-dest`` snapshots) shares the lock file's inode,
so without that the copy read as locked by the original's writer, and a
writer of the copy wrote into the original's lock file. A lock file naming
another directory is replaced by a fresh one (by a rename, which leaves the
original's alone) before it is locked.
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
            if _foreign(fd, self.path):  # a hard-linked copy's: another log's lock, not this one's
                ino = os.fstat(fd).st_ino
                if _replace_lock_file(self.path, ino):
                    os.close(fd)
                    continue
            try:
                _lock_now_or_soon(fd)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                raise _locked(self.path, holder) from None
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
        if _foreign(fd, Path(path)):  # a hard-linked copy's: its writer writes another log
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _locked(Path(path), _read_pid(fd)) from None
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


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
    return f"ino:{os.stat(path).st_ino}"


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


def _replace_lock_file(path: Path, ino: int) -> bool:
    """Put a fresh, empty lock file at ``path / LOCK_FILE`` in place of the foreign one (inode ``ino``), by a
    rename (the original's file is left as it is). False where that cannot be done safely: the caller then
    locks the foreign file as it is (the original's writer, if alive, refuses this one, as before).

    Two writers of the copy replacing it at once could each lock a file of their own: the swap is made under
    an exclusive ``flock`` on the directory, and only while the foreign file is still the one in place.
    """
    try:
        dfd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return False
    tmp = path / f"{LOCK_FILE}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)  # held for a stat and a rename: other swappers wait that long
        if os.stat(path / LOCK_FILE).st_ino == ino:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask's mode, as the lock's
            os.replace(tmp, path / LOCK_FILE)
        return True  # replaced, by this writer or by one before it
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    finally:
        os.close(dfd)  # releases the directory's flock
