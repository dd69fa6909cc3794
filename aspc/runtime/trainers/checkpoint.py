"""Trainer checkpoints keyed by run and weights version, so that ``aspc run --resume`` trains on.

A resumed run restarts the trainer process; the run log says how many steps
are durable (``version``), and the trainer must continue from exactly the
state it had after that step, or the resumed run trains a different policy
than the one its logged samples came from. So a checkpoint is written after
every step, before the step returns (the log commits the step only after
that), and holds what the next step depends on: the weights, the optimiser
state, the running baseline, the step history and the torch RNG.

A checkpoint every N steps (``checkpoint_every``; verl's ``save_freq``)
costs 1/N of the disk writes; the runtime then keeps the logged samples of
the steps after the newest checkpoint the log has reached
(``Trainer.durable``), and ``--resume`` restores it and takes those steps
again (:mod:`aspc.runtime.record.replay`).

Each file names its run by a fingerprint of the plan the trainer was set up
with (prompt ids in dispatch order and minibatch sizes: ``aspc run --resume``
refuses a changed plan, so the fingerprint matches across a resume) and the
weights version it publishes: ``ckpt-<fingerprint>-v<version>.pt``. What
stays: the newest checkpoint at or before the steps the log holds (a resume
restores it; the trainer runs ahead of the log, so newer ones may exist)
and every newer one; before the log says anything, the newest two. Under
``--epochs`` each epoch's last stays too: ``--resume`` reads the completed
epochs back and the trainer restores the end of the last one before the
next epoch starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np

from aspc.atomic import atomic_path
from aspc.errors import RunError, short_reason

KEEP = 2  # checkpoints kept before the run log says how far it got: the newest two (see the module notes)
_NAME = re.compile(r"^ckpt-([0-9a-f]{16})-v(\d{8})\.pt$")


def plan_fingerprint(work: Any) -> str:
    """16 hex digits naming the plan ``work`` (None: an empty plan)."""
    h = hashlib.sha256()
    if work is not None:
        for pid in work.prompt_ids.tolist():
            h.update(str(pid).encode("utf-8", "surrogatepass") + b"\0")
        h.update(np.ascontiguousarray(work.minibatch_sizes, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def checked_dir(directory: str | Path) -> Path:
    """``directory``, created if absent; a one-line error if it cannot hold checkpoints."""
    import os

    from aspc.errors import ConfigError

    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"checkpoint_dir {d}: cannot create it ({os.strerror(exc.errno or 0).lower()}); "
                          "give a writable directory") from None  # fmt: skip
    if not os.access(d, os.W_OK | os.X_OK):
        raise ConfigError(f"checkpoint_dir {d}: not writable; give a writable directory")
    return d


def checkpoint_path(directory: Path, fingerprint: str, version: int) -> Path:
    return Path(directory) / f"ckpt-{fingerprint}-v{int(version):08d}.pt"


def save_checkpoint(directory: Path, fingerprint: str, version: int, state: dict[str, Any],
                    written: list[Path], keep: list[Path], mine: set[Path], logged: int | None) -> None:  # fmt: skip
    """Write ``state`` atomically as the checkpoint of ``version``, then :func:`prune`."""
    import torch

    target = checkpoint_path(directory, fingerprint, version)
    try:
        with atomic_path(target) as tmp:
            torch.save(state, tmp)
    except (OSError, RuntimeError) as exc:  # a full disk surfaced as torch's "[enforce fail at inline_container.cc]"
        import errno
        import shutil

        try:
            free: int | None = shutil.disk_usage(directory).free
        except OSError:
            free = None
        full = getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "inline_container" in str(exc) \
            or (free is not None and free < 2**26)  # fmt: skip
        room = "" if free is None else f"; {free / 2**20:.0f} MiB free there"
        fix = "free space there (its checkpoints are what --resume restores)" if full else "fix that"
        raise RunError(f"checkpoint_dir {directory}: cannot write the checkpoint of version {version} "
                       f"({short_reason(exc, limit=120)}{room}): {fix}, then rerun with --resume") from None  # fmt: skip
    if target in written:
        written.remove(target)
    written.append(target)
    mine.add(target)
    del written[:-KEEP]
    prune(directory, fingerprint, written, keep, mine, logged)


def versions(directory: Path, fingerprint: str) -> dict[int, Path]:
    """This plan's checkpoints in ``directory`` by weights version."""
    out = {}
    for p in Path(directory).iterdir():
        m = _NAME.match(p.name)
        if m and m.group(1) == fingerprint:
            out[int(m.group(2))] = p
    return out


def newest_at(directory: Path, fingerprint: str, logged: int) -> int:
    """The newest version ``<= logged`` with a checkpoint of this plan (0: none, the initial weights)."""
    return max((v for v in versions(directory, fingerprint) if v <= logged), default=0)


def prune(directory: Path, fingerprint: str, written: list[Path], keep: list[Path], mine: set[Path],
          logged: int | None) -> None:  # fmt: skip
    """Remove the checkpoints no resume can need.

    ``written`` lists the newest files this trainer wrote or loaded, oldest
    first; ``keep`` those to keep whatever their age (each earlier epoch's
    last); ``mine`` every file this trainer ever wrote or loaded;
    ``logged`` the steps the run log holds (None: not known yet). With
    ``logged``, a file older than the newest one at or before it goes (a
    file being written is newer than the log, so never); without, any but
    ``written``. Only this plan's files (also those a killed process wrote
    before a resume) and ``mine`` go; another run's in the same directory stay.
    """
    floor = None if logged is None else newest_at(directory, fingerprint, logged)
    for p in Path(directory).iterdir():
        m = _NAME.match(p.name)
        if not m or not (m.group(1) == fingerprint or p in mine) or p in keep:
            continue
        if (p not in written) if floor is None else (m.group(1) != fingerprint or int(m.group(2)) < floor):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def find_checkpoint(directory: Path, fingerprint: str, version: int) -> Path | None:
    p = checkpoint_path(directory, fingerprint, version)
    return p if p.is_file() else None


def available(directory: Path) -> list[str]:
    """The checkpoints in ``directory`` as ``<fingerprint> v<version>``, for an error message."""
    if not Path(directory).is_dir():
        return []
    out = []
    for p in sorted(Path(directory).iterdir()):
        m = _NAME.match(p.name)
        if m:
            out.append(f"{m.group(1)} v{int(m.group(2))}")
    return out


def load_checkpoint(path: Path) -> dict[str, Any]:
    import torch

    # Tensors, numbers, strings, lists and dicts only: no pickled code runs on load.
    return torch.load(path, map_location="cpu", weights_only=True)
