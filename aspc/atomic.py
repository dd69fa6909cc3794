"""Atomic writes: an output appears whole or not at all.

Every file or directory aspc writes goes through here: the content is written
to a temporary sibling, fsynced, then renamed over the target, so a crash or a
failed command never leaves a partial output behind.

Only a regular file (or, for :func:`atomic_dir`, a directory) is ever
replaced; a symlink is written through (the link stays, the file it points to
is replaced), see :mod:`aspc.guards`. A full disk or a permission error
becomes one :class:`~aspc.errors.OutputError` naming the output, never the
temporary file, and the temporary file is removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from aspc.errors import OutputError
from aspc.file_modes import current_umask
from aspc.guards import check_not_cwd, check_replaceable
from aspc.interrupt import deferred, note_written

_FULL = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _stem(target: Path) -> str:
    """``target``'s name as its temporaries carry it: shortened (with a hash) where it is long.

    A temporary adds about 30 bytes to the name, so an output named near the
    file system's 255-byte limit failed with the temporary's name. A name that
    is not UTF-8 (legal on Linux) gives its temporaries a UTF-8 one: pyarrow
    writes only to paths it can encode.
    """
    raw = os.fsencode(target.name)
    name = raw.decode("utf-8", errors="replace")
    if len(name.encode()) <= 200:
        return name
    import hashlib

    head = name.encode()[:180].decode(errors="ignore")
    return f"{head}~{hashlib.sha256(raw).hexdigest()[:12]}"


def _tmp_prefix(target: Path) -> str:
    # The writer's pid is in the name so a later write can tell a temporary
    # left by a killed process (SIGKILL runs no cleanup) from a live one.
    return f".{_stem(target)}.{os.getpid()}."


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def remove_stale_temps(target: str | os.PathLike) -> list[Path]:
    """Remove temporaries of ``target`` whose writer process is gone; return them.

    Called before every write, so a compile killed with SIGKILL leaves its
    hidden ``.plan.parquet.<pid>.*.tmp`` only until the next write of the same
    output.
    """
    target = Path(target)
    # A temporary (.NAME.PID.X.tmp), or an earlier output a replaced directory left aside (.NAME.old-PID).
    pattern = re.compile(rf"^\.{re.escape(_stem(target))}\.(?:(\d+)\.[A-Za-z0-9_]+\.tmp|old-(\d+))$")
    removed = []
    try:
        siblings = list(target.parent.iterdir())
    except OSError:
        return removed
    # Newest first: where a writer was killed with the earlier output moved aside and the output itself
    # gone (SIGKILL while it checked that output), the earlier output goes back rather than away.
    found = [(p, m) for p in siblings if (m := pattern.match(p.name)) is not None]
    for p, m in sorted(found, key=lambda pm: _mtime(pm[0]), reverse=True):
        if pid_alive(int(m.group(1) or m.group(2))):
            continue
        if m.group(2) and not (target.exists() or target.is_symlink()):
            try:
                os.replace(p, target)
                continue
            except OSError:
                pass
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except OSError:
            continue
        removed.append(p)
    return removed


def _mtime(p: Path) -> float:
    try:
        return p.lstat().st_mtime
    except OSError:
        return 0.0


def _make_parents(parent: Path) -> list[Path]:
    """Create ``parent`` and its missing ancestors; return those this call made, outermost first.

    A failed write removes them again (:func:`_remove_made`): a full disk left ``a/b/c/`` behind.
    """
    missing = []
    here = parent
    while not here.is_dir() and here != here.parent:
        missing.append(here)
        here = here.parent
    made: list[Path] = []
    try:
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                if not d.is_dir():
                    raise
                continue  # another process made it at the same time: not ours to remove
            made.append(d)
    except BaseException:
        _remove_made(made)
        raise
    return made


def _remove_made(made: list[Path]) -> None:
    """After a failed write: remove the directories :func:`_make_parents` made, innermost first, if still empty."""
    for d in reversed(made):
        try:
            os.rmdir(d)
        except OSError:
            return  # not empty (someone else's file arrived), or gone: what is above it stays too


def _usable(tmp: Path) -> tuple[Path, int | None]:
    """``tmp`` as a path every library opens, and the descriptor to close after.

    pyarrow takes only paths it can encode as UTF-8; a temporary inside a directory
    whose name is not UTF-8 (legal on Linux) is reached through an open descriptor.
    """
    try:
        os.fspath(tmp).encode()
        return tmp, None
    except UnicodeEncodeError:
        pass
    # O_PATH where there is one: a folder one may write to but not list is still reached.
    fd = os.open(tmp.parent, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY)
    via = Path(f"/proc/self/fd/{fd}")
    if not via.is_dir():  # no /proc: the library's own error stands
        os.close(fd)
        return tmp, None
    return via / tmp.name, fd


def _resolve(target: str | os.PathLike, kind: str) -> Path:
    """The path to replace: symlinks followed, non-regular targets refused."""
    target = Path(target)
    check_replaceable(target, kind)  # follows links: a link to a pipe or device is refused here
    if target.is_symlink():
        if not target.exists():
            raise OutputError(f"{target} is a dangling symlink; remove it or point it at a regular file")
        target = Path(os.path.realpath(target))
        check_replaceable(target, kind)
    return target


def _is_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in _FULL:
        return True
    # pyarrow raises OSError("... No space left on device") with no errno.
    return isinstance(exc, OSError) and "no space left on device" in str(exc).lower()


def _translate(exc: OSError, target: Path, ours: bool, tmp: Path | None) -> OutputError | None:
    """An OutputError for a full disk or a denied write of ``target``, else None.

    ``ours``: the error came from aspc's own file operations (mkstemp,
    fsync, rename), not from the caller's code inside the block, whose
    permission errors may concern an input and are left alone.
    """
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:  # not a full disk: "free space" would not help
        return OutputError(f"{target} would pass this process's file-size limit (ulimit -f); raise the limit or "
                           "write a smaller output")  # fmt: skip
    if _is_full(exc):
        return OutputError(
            f"no space left on the device holding {target}; free space or write elsewhere"
        )
    # A directory that takes no new file may say "no such file" of the one being created (/proc
    # does): that message named aspc's temporary, a file the user never asked for.
    made_here = ours and tmp is None and exc.errno == errno.ENOENT and target.parent.is_dir()
    if exc.errno in _DENIED or made_here:
        names = {str(target), str(target.parent)} | ({str(tmp)} if tmp is not None else set())
        if ours or str(getattr(exc, "filename", "")) in names:
            why = f"{target.parent} takes no new files" if made_here else \
                f"{os.strerror(exc.errno).lower()} in {target.parent}"  # fmt: skip
            return OutputError(f"cannot write {target}: {why}; choose a writable output path")
    return None


def check_writable(target: str | os.PathLike) -> None:
    """Refuse, before any costly work, an output whose directory takes no new file.

    For a command that writes its output last, after minutes of generation or training (``aspc
    probe``, ``aspc predict train``): a read-only or denied directory is found now, by creating
    and removing an empty temporary where the output's would go (its nearest existing ancestor
    when the directory is still to be made). A full disk can only be found by the write itself.
    """
    target = Path(target)
    here = target.absolute().parent
    while not here.is_dir() and here != here.parent:
        here = here.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=_tmp_prefix(target), suffix=".tmp", dir=here))
    except OSError as exc:
        err = _translate(exc, target, True, None)
        if err is None:
            raise
        raise err from None


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary file path; on success fsync it and rename onto ``target``.

    On any exception the temporary file is removed and ``target`` is untouched.
    """
    target = _resolve(target, "file")
    tmp_path: Path | None = None
    made: list[Path] = []  # parent directories this write created: removed again if it fails
    fd_via: int | None = None
    ours = False
    try:
        # Held signals: SIGTERM between mkstemp and the cleanup below owning the
        # file would leave the temporary behind (it arrives once tmp_path is set).
        with deferred():
            try:
                made = _make_parents(target.parent)
                remove_stale_temps(target)
                fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(target), suffix=".tmp", dir=target.parent)
            except OSError as exc:
                err = _translate(exc, target, True, None)
                if err is None:
                    raise
                raise err from None
            tmp_path = Path(tmp)
            try:
                # mkstemp creates 0600; outputs are shared files (a trainer may run
                # as another user), so give them the mode a plain open() would.
                os.fchmod(fd, 0o666 & ~current_umask())
            finally:
                os.close(fd)
        usable, fd_via = _usable(tmp_path)
        yield usable
        ours = True
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        check_replaceable(target, "file")
        with deferred():  # a signal between the rename and its record said "nothing was written" of a replaced file
            os.replace(tmp_path, target)
            note_written(target)
        _fsync_dir(target.parent)
    except BaseException as exc:
        if tmp_path is not None:
            with contextlib.suppress(FileNotFoundError):
                tmp_path.unlink()
        _remove_made(made)
        if isinstance(exc, OSError):
            err = _translate(exc, target, ours, tmp_path)
            if err is not None:
                raise err from None
        raise
    finally:
        if fd_via is not None:
            os.close(fd_via)


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, *, refuse: Callable[[Path], str | None] | None = None) -> Iterator[Path]:
    """Yield a temporary directory; on success rename it onto ``target``.

    An existing ``target`` directory is replaced only after the new one is
    complete (moved aside, then removed), so readers never see a half-written
    directory. ``refuse(d)`` (the caller's check that ``target`` holds only an
    earlier output of its kind) is asked again of the earlier directory once it
    is moved aside, where nothing can be added to it under ``target``'s name:
    a file put there while the output was made (checked before, seconds ago)
    is never deleted; the earlier directory goes back and ``OutputError`` says why.
    """
    target = _resolve(target, "dir")
    check_not_cwd(target, str(target), "-o")
    tmp: Path | None = None
    made: list[Path] = []  # parent directories this write created: removed again if it fails
    fd_via: int | None = None
    old: Path | None = None  # the earlier output, moved aside until the new one is in place
    ours = False
    try:
        with deferred():  # as in atomic_path: no signal between mkdtemp and owning its cleanup
            try:
                made = _make_parents(target.parent)
                remove_stale_temps(target)
                tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(target), suffix=".tmp", dir=target.parent))
            except OSError as exc:
                err = _translate(exc, target, True, None)
                if err is None:
                    raise
                raise err from None
            os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp creates 0700
        usable, fd_via = _usable(tmp)
        yield usable
        ours = True
        # Libraries write some files private (safetensors' save_file: 0600); outputs are shared files
        # (a trainer under another uid reads the predictor), so every one gets the umask's mode.
        umask = current_umask()
        file_mode, dir_mode = 0o666 & ~umask, 0o777 & ~umask
        for root, dirs, files in os.walk(tmp):
            for name in dirs:
                os.chmod(os.path.join(root, name), dir_mode)
            for name in files:
                with open(os.path.join(root, name), "rb") as fh:
                    os.fchmod(fh.fileno(), file_mode)
                    os.fsync(fh.fileno())
        check_replaceable(target, "dir")
        # Held signals: one between the two renames left the earlier output moved aside for good.
        with deferred():
            if target.exists():
                aside = target.parent / f".{_stem(target)}.old-{os.getpid()}"
                os.replace(target, aside)
                old = aside  # only once moved: a failed move must not remove what is at that name
                if refuse is not None:
                    old = None  # never removed below until the check passes: it goes back, or stays aside, named
                    try:
                        why = refuse(aside)
                    except OSError as exc:  # the check could not read it (EACCES, EIO): nothing known, nothing deleted
                        why = (f"{target}: the earlier directory could not be checked before it is replaced "
                               f"({exc.strerror or exc}); nothing was replaced: make it readable, or pick a new "
                               "directory")  # fmt: skip
                    except BaseException:
                        _put_back(aside, target, None)
                        raise
                    if why is not None:
                        _put_back(aside, target, why)
                    old = aside
            try:
                os.replace(tmp, target)
            except OSError as exc:
                if old is not None and not target.exists():
                    os.replace(old, target)  # the earlier output stays
                    old = None
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):  # another writer's output took the place
                    raise OutputError(f"{target} was written by another process at the same time; this "
                                      "command's output was discarded: rerun it when that one ends") from None  # fmt: skip
                raise
            note_written(target)
        _fsync_dir(target.parent)
    except BaseException as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        _remove_made(made)
        if isinstance(exc, OSError):
            err = _translate(exc, target, ours, None)
            if err is not None:
                raise err from None
        raise
    finally:
        if fd_via is not None:
            os.close(fd_via)
        if old is not None:  # replaced (a signal after the swap still arrives here): the earlier output goes
            shutil.rmtree(old, ignore_errors=True)


def _put_back(old: Path, target: Path, why: str | None) -> None:
    """Return the earlier directory ``old`` to ``target`` and refuse with ``why`` (None: return, the caller raises)."""
    try:
        os.replace(old, target)
    except OSError:
        # Another writer's output took the place meanwhile: the earlier one stays aside, under a name the
        # next write's stale-temporary cleanup (.NAME.old-PID of a dead writer) does not take for its own.
        kept = _kept_aside(old, target)
        raise OutputError(f"{why or f'{target} was replaced meanwhile'} (the earlier {target.name} is kept at "
                          f"{kept})") from None  # fmt: skip
    if why is not None:
        raise OutputError(why)


def _kept_aside(old: Path, target: Path) -> Path:
    """Move ``old`` to a free ``NAME.kept-PID[-N]`` beside ``target`` (short enough for any name); its path."""
    for n in range(100):
        kept = target.parent / f"{_stem(target)}.kept-{os.getpid()}{f'-{n}' if n else ''}"
        if kept.exists() or kept.is_symlink():
            continue
        try:
            os.replace(old, kept)
            return kept
        except OSError:
            continue
    return old  # every name taken: it stays where it is (a dead writer's cleanup may then take it)


def atomic_write_bytes(target: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``target`` atomically."""
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)
