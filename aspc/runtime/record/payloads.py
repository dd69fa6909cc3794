"""Backend outputs (payloads) of samples generated and not yet consumed, kept so that ``--resume`` hands them on.

A real trainer (the GRPO example, a user's) learns from each sample's tokens,
which the ``hf`` and ``vllm`` backends return as a payload; the run log's
rows hold only lengths. Samples generated before an interruption and not yet
consumed durably wait for the trainer in the resumed run, and without their
payloads a trainer that needs tokens could not take them.

So the recorder keeps each returned sample's payload (:class:`PendingPayloads`)
until its consumption is committed, and each commit first replaces
``RUN/payloads.parquet`` with those of every finished minibatch, then writes
``meta.json``. The file is written before the commit and emptied of a
sample only at the commit after the one that made its consumption durable,
so whichever commit a crash leaves in place, every sample that resume finds
waiting has its payload in the file. Its size is bounded by the queue (plus
one flush's worth of samples), not by the run.

A trainer that checkpoints every N steps (``Trainer.durable`` names its
newest checkpoint, older than the log) needs more: a resume restores that
checkpoint and replays the logged steps after it, on their samples' tokens.
So a consumed sample is kept, and stays in the file, until the trainer names
a checkpoint at or after the step that consumed it: the file then also holds
up to N global batches of consumed samples.

Payloads are stored as JSON, one string per sample (the hf and vllm
backends' dicts of token ids, text and flags are JSON); a payload that is not
JSON (a custom backend's tensors) is not stored, and a resumed run says how
many waiting samples come back without one. A complete run deletes the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from aspc.atomic import atomic_path
from aspc.errors import RunError

PAYLOAD_FILE = "payloads.parquet"
_SCHEMA = pa.schema([("prompt_id", pa.string()), ("sample_index", pa.int32()), ("payload", pa.large_string())])


class PendingPayloads:
    """Payloads by sample id, each encoded once, from its return until its consumption is durable."""

    def __init__(self) -> None:
        self._held: dict[int, Any] = {}  # sample id -> payload, then its JSON text once written (None: not JSON)
        self._encoded: set[int] = set()  # ids whose entry is already JSON text (or None)
        self._written: frozenset[int] | None = None  # the ids in the file as last written
        self._replay: dict[int, int] = {}  # consumed sample id -> its step, while a resume would replay that step
        # The trainer's Trainer.durable: committed steps -> the newest version it can restore.
        self.durable: Callable[[int], int] = lambda version: version

    def __len__(self) -> int:
        return len(self._held)

    def add(self, ids: np.ndarray, payload: list[Any] | None) -> None:
        if payload is None:
            return
        for i, p in zip(ids.tolist(), payload, strict=True):
            if p is not None:
                self._held[int(i)] = p

    def release(self, ids: np.ndarray, steps: np.ndarray | None = None, version: int | None = None) -> None:
        """Forget samples whose consumption a commit made durable, but those a resume would replay.

        ``steps``: the step that consumed each of ``ids``; ``version``: the
        steps the log now holds, which :attr:`durable` turns into the newest
        version the trainer can restore. Samples of steps at or after it are
        kept (a resume replays those steps) until a later call passes them.
        """
        gone = ids.tolist()
        if version is not None:
            floor = int(self.durable(int(version)))
            if steps is not None:
                keep = steps >= floor
                self._replay.update(zip(ids[keep].tolist(), steps[keep].tolist(), strict=True))
                gone = ids[~keep].tolist()
            passed = [i for i, s in self._replay.items() if s < floor]
            for i in passed:
                del self._replay[i]
            gone += passed
        for i in gone:
            self._held.pop(int(i), None)
            self._encoded.discard(int(i))

    def hold(self, ids: np.ndarray, steps: np.ndarray, payload: list[Any]) -> None:
        """Keep a resumed run's replayed samples (consumed at ``steps``) as a commit would have."""
        self.add(ids, payload)
        self._replay.update(zip(ids.tolist(), steps.tolist(), strict=True))

    @property
    def idle(self) -> bool:
        """Nothing held and no file written: a run whose backend returns no payloads (sim)."""
        return not self._held and not self._written

    def write(self, run_dir: Path, finished_sample: np.ndarray, work: Any) -> None:
        """Replace ``run_dir/payloads.parquet`` with the held payloads of finished minibatches' samples.

        ``finished_sample`` is a bool per sample id (its minibatch finished: its
        rows are in the log once this commit is); ``work`` (a ``WorkPlan``) names
        each sample as the log does. Unchanged since the last write: nothing is written.
        """
        for i in [i for i in self._held if i not in self._encoded and finished_sample[i]]:
            self._held[i] = _encode(self._held[i])  # once per sample, at its first write
            self._encoded.add(i)
        ids = sorted(i for i in self._encoded if self._held[i] is not None)
        key = frozenset(ids)
        if key == self._written:
            return
        target = run_dir / PAYLOAD_FILE
        if not ids:
            target.unlink(missing_ok=True)
        else:
            arr = np.asarray(ids, dtype=np.int64)
            table = pa.table(
                {
                    "prompt_id": pa.array(work.prompt_ids[work.sample_row[arr]].tolist(), pa.string()),
                    "sample_index": pa.array(work.sample_index[arr], pa.int32()),
                    "payload": pa.array([self._held[i] for i in ids], pa.large_string()),
                },
                schema=_SCHEMA,
            )
            with atomic_path(target) as tmp:
                pq.write_table(table, tmp, compression="zstd")
        self._written = key


def read_payloads(run_dir: Path) -> dict[tuple[str, int], Any]:
    """The payloads a run log stored, by (prompt id, sample index); empty when it stored none."""
    path = run_dir / PAYLOAD_FILE
    if not path.is_file():
        return {}
    try:
        table = pq.read_table(path, schema=_SCHEMA)
        return {
            (str(p), int(i)): json.loads(text)
            for p, i, text in zip(table.column("prompt_id").to_pylist(), table.column("sample_index").to_pylist(),
                                  table.column("payload").to_pylist(), strict=True)  # fmt: skip
        }
    except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
        reason = " ".join(str(exc).split())[:160]
        raise RunError(f"{path}: cannot read the waiting samples' payloads ({reason}); delete the file to resume "
                       "without them (a trainer that needs their tokens then stops)") from None


def _encode(payload: Any) -> str | None:
    try:
        return json.dumps(payload, allow_nan=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return None


def restore_payloads(run_dir: Path, work: Any, queued: np.ndarray, batches: Any, recorder: Any,
                     expected: bool) -> list[str]:  # fmt: skip
    """Hand a resumed run's waiting samples their stored payloads; notes for the run's stderr.

    ``batches`` (the run's ``BatchBuilder``) gives them to the trainer with
    their samples; ``recorder`` keeps holding them, so the next commits write
    them again until their consumption is durable. ``expected``: the backend
    returns payloads (hf, vllm), so a waiting sample without one is worth a note.
    """
    if queued.size == 0:
        return []
    stored = read_payloads(run_dir)
    names = zip(work.prompt_ids[work.sample_row[queued]].tolist(), work.sample_index[queued].tolist(), strict=True)
    payload = [stored.get((str(p), int(i))) for p, i in names]
    batches.restore_payloads(queued, payload)
    recorder.payloads.add(queued, payload)
    missing = sum(p is None for p in payload)
    if not missing or not (expected or stored):
        return []
    return [f"{missing} of the {queued.size} samples waiting for the trainer have no stored payload (a log "
            "written before aspc stored them, or a backend whose payloads are not JSON): a trainer that needs "
            "their tokens stops at the first of them"]
