"""Earlier observed response lengths by prompt id: the one reader behind ``--history`` and ``--actual-lengths``.

A source is a dataset with an id field and a length field (a number, or a
list of sampled lengths), an aspc run log directory (its ``samples/``
parts; see :func:`aspc.io.read_lengths`), or a verl rollout directory
(``trainer.rollout_data_dir``: one ``N.jsonl`` per step, matched to the
prompts by content, see :mod:`aspc.io.verl_rollouts`). Several sources merge: a prompt seen
in several accumulates every length, in the order the sources are given.
``compile --history`` and ``predict --history`` blend them into a predictor;
``run`` and ``simulate --actual-lengths`` replay them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np

from aspc.errors import InputError
from aspc.io.lengths import committed_sample_parts, read_lengths, run_log_groups
from aspc.io.prompts import file_hash
from aspc.io.verl_rollouts import is_rollout_dir, read_rollout_lengths, rollout_dir_hash

__all__ = ["history_groups", "history_hashes", "read_history", "source_hash"]


def read_history(
    sources: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    id_field: str = "id",
    length_field: str = "length",
    prompts: tuple[Sequence[str], Sequence[str]] | None = None,
    tokenizer: Any | None = None,
    verl_stats: list[dict[str, Any]] | None = None,
    keep: Collection[str] | None = None,
    option: str = "--history-length-field",
    own_id_field: bool = False,
) -> dict[str, np.ndarray]:
    """Prompt id -> every observed length (float64) over ``sources``.

    Parameters
    ----------
    sources
        One source or several (datasets or run log directories).
    id_field, length_field
        Fields of the datasets (run logs have their own).
    prompts
        ``(ids, stored prompts)`` being compiled: what verl rollout dumps are
        matched against (they carry no prompt id).
    tokenizer
        Counts verl responses' tokens (a ``load_tokenizer`` spec or a loaded
        one); ``None``: estimated from UTF-8 bytes.
    verl_stats
        When given, one dict per verl rollout source is appended (files,
        samples, matched, counted_with), for the plan metadata and notes.
    keep
        The ids of ``prompts`` a plan keeps; verl rollout samples matched to the
        others (left out by a prompt limit) are dropped, not credited to a kept
        prompt. ``None``: all of ``prompts``.
    option
        The flag a missing length field's error tells the user to pass
        (``--length-field`` where the source is ``--actual-lengths``).
    own_id_field
        ``id_field`` is these sources' alone (``aspc run --id-field``), so a missing one is
        fixed by passing ``--id-field``; else it is also the input's, fixed in the source.

    Raises
    ------
    InputError
        An unreadable source, a row without id or length, an empty dataset.
    """
    paths = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    merged: dict[str, list[np.ndarray]] = {}
    for path in paths:
        if is_rollout_dir(path):
            if prompts is None:
                raise InputError(
                    f"{path}: a verl rollout directory; its samples are matched to prompts by content, "
                    "so use it with 'aspc compile --history'"
                )
            got = read_rollout_lengths(path, list(prompts[0]), list(prompts[1]), tokenizer=tokenizer, keep=keep)
            if verl_stats is not None:
                verl_stats.append(
                    {"files": got.n_files, "samples": got.n_samples, "matched": got.n_matched, "counted_with": got.counted_with}
                )
            found = got.lengths
        else:
            found = read_lengths(path, id_field=id_field, length_field=length_field, option=option,
                                 own_id_field=own_id_field)  # fmt: skip
            if len(paths) == 1:  # float64 arrays already: a copy of each again cost a second at 300,000 prompts
                return dict(found)
        for pid, lens in found.items():
            merged.setdefault(pid, []).append(lens)
    return {k: np.concatenate(v) for k, v in merged.items()}


def history_groups(source: str | os.PathLike) -> tuple[list[str], np.ndarray, np.ndarray]:
    """:func:`read_history` of one source (default fields) as ``(ids, values, offsets)``: the lengths of
    ``ids[i]`` are ``values[offsets[i]:offsets[i + 1]]``. A run log is grouped without a dict of arrays."""
    if os.path.isdir(source) and not is_rollout_dir(source):
        return run_log_groups(source)
    found = read_history(source)
    arrays = [np.asarray(v, dtype=np.float64).reshape(-1) for v in found.values()]
    sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    values = np.concatenate(arrays) if arrays else np.empty(0)
    return list(found), values, np.r_[0, np.cumsum(sizes)].astype(np.int64)


def source_hash(path: str | os.PathLike) -> str:
    """Content hash of one source: the file's, a verl rollout directory's step files, or for a run log
    the hash of its committed sample parts' hashes."""
    if is_rollout_dir(path):
        return rollout_dir_hash(path)
    if os.path.isdir(path):
        # Only what read_history reads: the committed sample parts.
        h = hashlib.sha256()
        for f in committed_sample_parts(path):
            h.update(file_hash(f).encode())
        return h.hexdigest()
    return file_hash(path)


def history_hashes(sources: Iterable[str | os.PathLike]) -> list[str]:
    """:func:`source_hash` of each source, in order (a plan records them as its history's identity)."""
    return [source_hash(p) for p in sources]
