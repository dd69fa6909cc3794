"""Earlier observed response lengths by prompt id: the one reader behind ``--history`` and ``--actual-lengths``.

A source is a dataset with an id field and a length field (a number, or a
list of sampled lengths), or an aspc run log directory (its ``samples/``
parts; see :func:`aspc.io.read_lengths`). Several sources merge: a prompt seen
in several accumulates every length, in the order the sources are given.
``compile --history`` and ``predict --history`` blend them into a predictor;
``run`` and ``simulate --actual-lengths`` replay them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence

import numpy as np

from aspc.io.lengths import read_lengths
from aspc.io.prompts import file_hash

__all__ = ["history_hashes", "read_history", "source_hash"]


def read_history(
    sources: str | os.PathLike | Sequence[str | os.PathLike], *, id_field: str = "id", length_field: str = "length"
) -> dict[str, np.ndarray]:
    """Prompt id -> every observed length (float64) over ``sources``.

    Parameters
    ----------
    sources
        One source or several (datasets or run log directories).
    id_field, length_field
        Fields of the datasets (run logs have their own).

    Raises
    ------
    InputError
        An unreadable source, a row without id or length, an empty dataset.
    """
    paths = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    merged: dict[str, list[np.ndarray]] = {}
    for path in paths:
        for pid, lens in read_lengths(path, id_field=id_field, length_field=length_field).items():
            merged.setdefault(pid, []).append(lens)
    return {k: np.concatenate(v) for k, v in merged.items()}


def source_hash(path: str | os.PathLike) -> str:
    """Content hash of one source: the file's, or for a run log the hash of its Parquet parts' hashes."""
    if os.path.isdir(path):
        h = hashlib.sha256()
        for root, _dirs, files in sorted(os.walk(path)):
            for name in sorted(files):
                if name.endswith(".parquet"):
                    h.update(file_hash(os.path.join(root, name)).encode())
        return h.hexdigest()
    return file_hash(path)


def history_hashes(sources: Iterable[str | os.PathLike]) -> list[str]:
    """:func:`source_hash` of each source, in order (a plan records them as its history's identity)."""
    return [source_hash(p) for p in sources]
