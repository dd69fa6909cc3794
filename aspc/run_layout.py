"""What a ``--log`` directory holds, checked before a run writes there.

Four kinds of run write a run directory: one run (its log at the root:
``RUN/meta.json``, ...), epochs (``aspc run --epochs N``: ``RUN/epoch-K/``
logs and ``RUN/plans/epoch-K.parquet``), epochs after a length scout
(``--scout``: also ``RUN/scout/``), and epochs whose first is a rolling
scout's (``--scout --scout-roll``: laid out as epochs, told apart by epoch 1's
plan). Each kind's writer only looked for its
own files, so a run of another kind went into the same directory: ``--epochs
2`` without ``--overwrite`` wrote its epochs beside a finished single run;
``--resume --epochs 2`` on a single run's log started epochs inside it;
``--resume --scout`` on epochs ran a scout and only then failed; and
resuming epochs without ``--epochs`` said "not an aspc run log".
:func:`check_log_layout` refuses all of these in one line before anything
is written, and :func:`clear_run_dir` is what ``--overwrite`` does to a
directory of another kind (or to stale epochs beyond the new count).

This module sits above the runtime (it reads run-log markers) and below the
CLI and :mod:`aspc.epochs`, which call it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from aspc.errors import ConfigError, LockError
from aspc.runtime.record.lock import LOCK_FILE, RunLogLock, refuse_if_locked
from aspc.runtime.record.runlog import is_run_log, never_started

SINGLE, EPOCHS, SCOUT, ROLL = "single", "epochs", "scout", "roll"
_EPOCH_DIR = re.compile(r"^epoch-\d+$")
# How each kind is resumed, for the message that names the other kind.
_STARTED = {
    SINGLE: "without --epochs or --scout",
    EPOCHS: "with --epochs and without --scout",
    SCOUT: "with --scout",
    ROLL: "with --scout --scout-roll",
}


def log_layout(root: str | os.PathLike) -> str | None:
    """The kind of run ``root`` holds (:data:`SINGLE`, :data:`EPOCHS`, :data:`SCOUT`), or None for none of aspc's."""
    p = Path(root)
    if not p.is_dir():
        return None
    if (p / "scout").is_dir():
        return SCOUT
    if any(e.is_dir() and _EPOCH_DIR.match(e.name) for e in p.iterdir()) or any((p / "plans").glob("epoch-*.parquet")):
        return ROLL if _rolled(p / "plans" / "epoch-1.parquet") else EPOCHS
    return SINGLE if is_run_log(p) else None


def _rolled(plan_path: Path) -> bool:
    """Whether epoch 1's plan is a rolling scout's (``--scout --scout-roll`` keeps no ``RUN/scout/``)."""
    import json

    import pyarrow.parquet as pq

    from aspc.arrow_files import arrow_file

    try:
        with arrow_file(plan_path) as f:  # a --log whose name is not UTF-8: pyarrow refused the str path
            config = json.loads(pq.read_schema(f).metadata[b"aspc.config"])
    except Exception:  # unreadable or not a plan: the resume's own checks word it
        return False
    return isinstance(config, dict) and "scout_roll" in config


def logged_epochs(root: str | os.PathLike) -> int:
    """The highest K of the ``epoch-K`` logs and ``plans/epoch-K.parquet`` plans under ``root`` (0: none)."""
    p = Path(root)
    names = [e.name for e in p.iterdir() if e.is_dir()] if p.is_dir() else []
    names += [f.stem for f in (p / "plans").glob("epoch-*.parquet")]
    return max((int(n[6:]) for n in names if _EPOCH_DIR.match(n)), default=0)


def check_log_layout(
    root: str | os.PathLike | None, *, epochs: bool, scout: bool, resume: bool, overwrite: bool,
    n_epochs: int | None = None, scout_roll: bool = False,
) -> str | None:  # fmt: skip
    """Refuse a ``--log`` that holds another kind of run than this one (``epochs``: the epochs layout).

    Returns the layout found (None for an absent or empty directory).

    ``n_epochs``: the epochs this run asks for, where known; a resume that
    asks for fewer than the log holds is refused (it would leave the later
    epochs out and still exit 0).

    Raises
    ------
    ConfigError
        ``--resume`` on another kind of run, or of fewer epochs; without ``--resume`` and
        ``--overwrite``, a directory that already holds anything; and a
        directory of files that are not an aspc run (resumed, overwritten or
        not), in the single-run writer's words.
    """
    if root is None:
        return None
    _refuse_a_part_of_another_run(Path(root))
    try:
        return _check_log_layout(Path(root), epochs, scout, resume, overwrite, n_epochs, scout_roll)
    except ConfigError:
        refuse_if_locked(root)  # a log still being written: say so, not what it holds
        raise


def _check_log_layout(
    p: Path, epochs: bool, scout: bool, resume: bool, overwrite: bool, n_epochs: int | None, scout_roll: bool
) -> str | None:
    layout = log_layout(p)
    if layout is None:
        if _holds_files(p):  # the run log writers' own words, for every kind of run
            if resume:
                raise ConfigError(f"--log {p}: not an aspc run log, nothing to resume; pick the run's directory")
            if overwrite:
                raise ConfigError(f"--log {p}: not an aspc run log, refusing to overwrite it; pick a new path")
            # Not "--overwrite or --resume": both refuse a folder that is not a run log.
            raise ConfigError(f"--log {p}: directory exists and is not empty, and holds no aspc run log; pick a new path")
        return None
    want = SCOUT if scout else (ROLL if scout_roll else (EPOCHS if epochs else SINGLE))
    logged = logged_epochs(p) if layout != SINGLE else 0
    if resume and layout != want:
        if want == SINGLE and logged:  # --epochs left at 1: name the options that resume it
            how = f"--epochs {max(logged, 2)}"
            if layout in (SCOUT, ROLL):
                flags = "--scout" if layout == SCOUT else "--scout --scout-roll"
                how = f"--epochs {logged} {flags}" if logged > 1 else flags
            raise ConfigError(
                f"--log {p} holds a run of {logged} epoch{'s' if logged != 1 else ''} started {_STARTED[layout]}: "
                f"resume it with {how} (or more epochs to go on), or pick a new --log"
            )
        raise ConfigError(
            f"--log {p} holds a run started {_STARTED[layout]}: resume it the same way, or pick a new --log"
        )
    if resume and n_epochs is not None and logged > n_epochs:
        raise ConfigError(
            f"--log {p} holds {logged} epochs, more than --epochs {n_epochs}: resume it with --epochs {logged} "
            "(or more to go on), or pass --overwrite to start again"
        )
    if not (resume or overwrite):
        if layout == want and layout != SINGLE:
            what = "epoch plans" if any((p / "plans").glob("epoch-*.parquet")) else "a length scout"
            raise ConfigError(
                f"{p} already holds {what}; pass --resume to continue them, --overwrite to replace them, "
                "or another --log"
            )
        raise ConfigError(
            f"--log {p}: directory exists and is not empty; pick a new path, pass --overwrite, "
            "or --resume to continue it"
        )
    return layout


def _refuse_a_part_of_another_run(p: Path) -> None:
    """Refuse ``RUN/epoch-K`` or ``RUN/scout`` of an epochs or scout run as a ``--log`` of its own.

    A run there replaced an epoch the epochs run had finished (or took the
    name of one it had yet to run), even while that run held ``RUN``'s lock:
    the epochs run then failed, and could no longer be resumed.
    """
    for q in dict.fromkeys((p, p.resolve())):  # a symlink to RUN/epoch-K too
        if _EPOCH_DIR.match(q.name) or q.name == "scout":
            _refuse_inside(p, q.parent)


def _refuse_inside(p: Path, parent: Path) -> None:
    try:
        refuse_if_locked(parent)
    except LockError as exc:
        raise LockError(f"--log {p} is a part of the run in {parent}, which another aspc run is writing: {exc}") from None
    if any((parent / "plans").glob("epoch-*.parquet")):  # aspc's epochs: a user's own epoch-K folders have none
        raise ConfigError(
            f"--log {p} is a part of the --epochs/--scout run in {parent}; continue or replace that run with "
            f"--log {parent}, or give this run another --log"
        )


def _holds_files(p: Path) -> bool:
    """Anything in ``p`` but what a writer makes first (a lock file, temporaries, an empty ``plans/``, ...)."""
    return p.is_dir() and not never_started(p)


def clear_run_dir(root: str | os.PathLike, *, root_held: bool = False) -> None:
    """Empty a run directory for ``--overwrite``, taking each of its logs' writer locks first.

    ``root_held``: the caller holds ``root``'s own lock (an epochs run does,
    for its whole length). Raises :class:`~aspc.errors.LockError` (nothing
    removed) when another aspc run is writing any of them.
    """
    p = Path(root)
    logs = [e for e in sorted(p.iterdir()) if e.is_dir() and not e.is_symlink() and (e.name == "scout" or _EPOCH_DIR.match(e.name))]
    locks = [RunLogLock(d) for d in ([] if root_held else [p]) + logs]
    held: list[RunLogLock] = []
    try:
        for lock in locks:
            lock.acquire()
            held.append(lock)
        for entry in p.iterdir():
            if entry.name == LOCK_FILE:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    finally:
        for lock in reversed(held):
            lock.release()


def meta_stamps(root: str | os.PathLike | None) -> dict[str, tuple[int, int, int]]:
    """Each ``meta.json`` of the run at ``root`` (its own, its epochs', its scout's) as found now: inode,
    mtime and size.

    aspc replaces a ``meta.json`` by renaming a new file over it, so one that still has its stamp later
    was not written since: an earlier run's. Not its mtime against this host's clock: a log copied with
    its mtimes from a node whose clock differs (``cp -a``, ``tar``, a file server's clock) misread.
    """
    if root is None:
        return {}
    out = {}
    for m in [Path(root) / "meta.json", Path(root) / "scout" / "meta.json", *Path(root).glob("epoch-*/meta.json")]:
        if (stamp := _stamp(m)) is not None:
            out[str(m)] = stamp
    return out


def unchanged_since(meta: Path, stamps: dict[str, tuple[int, int, int]] | None) -> bool:
    """``meta`` is the very file :func:`meta_stamps` found (no run wrote it since)."""
    return stamps is not None and (stamp := _stamp(meta)) is not None and stamps.get(str(meta)) == stamp


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)
