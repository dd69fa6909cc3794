"""Trainer checkpoints keyed by run and weights version, so that ``aspc run --resume`` trains on.

A resumed run restarts the trainer process; the run log says how many steps
are durable (``version``), and the trainer must continue from exactly the
state it had after that step, or the resumed run trains a different policy
than the one its logged samples came from. So a checkpoint is written after
every step, before the step returns (the log commits the step only after
that), and holds what the next step depends on: the weights, the optimiser
state, the running baseline, the step history and the torch RNG.

Each file names its run by a fingerprint of the plan the trainer was set up
with (prompt ids in dispatch order and minibatch sizes: ``aspc run --resume``
refuses a changed plan, so the fingerprint matches across a resume) and the
weights version it publishes: ``ckpt-<fingerprint>-v<version>.pt``. The
newest two written stay: a kill between the checkpoint and the log's commit
leaves the log one version behind the newest file. Under ``--epochs`` each
epoch's last stays too: ``--resume`` reads the completed epochs back and the
trainer restores the end of the last one before the next epoch starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np

from aspc.atomic import atomic_path

KEEP = 2  # checkpoints kept: the newest, and the one before it (see the module notes)
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
                    written: list[Path], keep: list[Path], mine: set[Path]) -> None:  # fmt: skip
    """Write ``state`` atomically as the checkpoint of ``version``; keep the newest :data:`KEEP` of ``written``.

    ``written`` lists the files this trainer wrote or loaded, oldest first;
    ``keep`` those to keep whatever their age (each earlier epoch's last);
    ``mine`` every file this trainer ever wrote or loaded. Once this one is
    durable, the others of this run's plan (also those a killed process
    wrote before a resume) and of ``mine`` are removed; another run's
    checkpoints in the same directory are left alone.
    """
    import torch

    target = checkpoint_path(directory, fingerprint, version)
    with atomic_path(target) as tmp:
        torch.save(state, tmp)
    if target in written:
        written.remove(target)
    written.append(target)
    mine.add(target)
    del written[:-KEEP]
    for p in Path(directory).iterdir():
        m = _NAME.match(p.name)
        if m and (m.group(1) == fingerprint or p in mine) and p not in written and p not in keep:
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
