"""Backend outputs (payloads) of samples not yet consumed for good, kept so that ``--resume`` hands them on.

A real trainer (the GRPO example, a user's) learns from each sample's tokens,
which the ``hf`` and ``vllm`` backends return as a payload; the run log's
rows hold only lengths. Samples generated before an interruption and not yet
consumed durably wait for the trainer in the resumed run, and without their
payloads a trainer that needs tokens could not take them.

So the recorder keeps each returned sample's payload (:class:`PendingPayloads`)
until its consumption is committed. Each commit first writes the payloads of
the samples whose minibatch it commits as one new part,
``RUN/payloads/part-NNNNNN.parquet``, then writes ``meta.json``; a part is
deleted once every sample in it has been released, after a later commit. So
whichever commit a crash leaves in place, every sample that resume finds
waiting has its payload in a part, and each payload is written once. The
parts on disk hold the queue (plus one flush's worth of samples), not the run.

A trainer that checkpoints every N steps (``Trainer.durable`` names its
newest checkpoint, older than the log) needs more: a resume restores that
checkpoint and replays the logged steps after it, on their samples' tokens.
So a consumed sample is kept until the trainer names a checkpoint at or
after the step that consumed it: the parts then also hold up to N global
batches of consumed samples.

Payloads are stored as JSON, one string per sample (the hf and vllm
backends' dicts of token ids, text and flags are JSON); a payload that is not
JSON (a custom backend's tensors) is not stored, and a resumed run says how
many waiting samples come back without one. A complete run deletes the parts
(and the single ``RUN/payloads.parquet`` that logs before the parts kept).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from aspc.arrow_files import arrow_file
from aspc.atomic import atomic_path
from aspc.errors import RunError
from aspc.runtime.contracts import durable_version

PAYLOAD_DIR = "payloads"
PAYLOAD_FILE = "payloads.parquet"  # the one file of logs written before the parts: read, and deleted at the end
_PART = re.compile(r"^part-(\d{6,})\.parquet$")
_SCHEMA = pa.schema([("prompt_id", pa.string()), ("sample_index", pa.int32()), ("payload", pa.large_string())])


class PendingPayloads:
    """Payloads by sample id, from their return until no resume can need them."""

    def __init__(self) -> None:
        self._new: dict[int, Any] = {}  # returned, not written yet
        self._part_of: dict[int, int] = {}  # written: sample id -> its part
        self._live: dict[int, set[int]] = {}  # part -> its samples not released yet
        self._next = 0  # the next part's number
        self._dir: Path | None = None  # where the parts are
        self._replay: dict[int, int] = {}  # consumed sample id -> its step, while a resume would replay that step
        self._adopted = False  # a resume took over parts and its trainer is not restored yet: release nothing
        # The trainer's Trainer.durable: committed steps -> the newest version it can restore.
        self.durable: Callable[[int], int] = lambda version: version

    def __len__(self) -> int:
        return len(self._new) + len(self._part_of)

    def add(self, ids: np.ndarray, payload: list[Any] | None) -> None:
        if payload is None:
            return
        for i, p in zip(ids.tolist(), payload, strict=True):
            if p is not None and i not in self._part_of:
                self._new[int(i)] = p

    @property
    def idle(self) -> bool:
        """Nothing held and no part live: a run whose backend returns no payloads (sim)."""
        return not self._new and not self._live

    def write(self, run_dir: Path, finished_sample: np.ndarray, work: Any) -> None:
        """Write the held payloads of finished minibatches' samples not written yet, as one new part.

        ``finished_sample`` is a bool per sample id (its minibatch finished: its
        rows are in the log once this commit is); ``work`` (a ``WorkPlan``) names
        each sample as the log does. Nothing new: nothing is written.
        """
        self._dir = Path(run_dir) / PAYLOAD_DIR
        ids = sorted(i for i in self._new if finished_sample[i])
        texts = [_encode(self._new.pop(i)) for i in ids]  # once per sample
        kept = [(i, t) for i, t in zip(ids, texts, strict=True) if t is not None]
        if not kept:
            return
        arr = np.asarray([i for i, _ in kept], dtype=np.int64)
        table = pa.table(
            {
                "prompt_id": pa.array(work.prompt_ids[work.sample_row[arr]].tolist(), pa.string()),
                "sample_index": pa.array(work.sample_index[arr], pa.int32()),
                "payload": pa.array([t for _, t in kept], pa.large_string()),
            },
            schema=_SCHEMA,
        )
        self._dir.mkdir(exist_ok=True)
        part = self._next
        with atomic_path(self._dir / f"part-{part:06d}.parquet") as tmp:
            with arrow_file(tmp, "wb") as fh:  # tmp is not UTF-8 where atomic_path found no /proc to reach it by
                pq.write_table(table, fh, compression="zstd")
        self._next += 1
        self._live[part] = set(arr.tolist())
        self._part_of.update(dict.fromkeys(arr.tolist(), part))

    def release(self, ids: np.ndarray, steps: np.ndarray | None = None, version: int | None = None) -> None:
        """Forget samples whose consumption a commit made durable, but those a resume would replay.

        ``steps``: the step that consumed each of ``ids``; ``version``: the
        steps the log now holds, which :attr:`durable` turns into the newest
        version the trainer can restore. Samples of steps at or after it are
        kept (a resume replays those steps) until a later call passes them.
        A part whose samples are all released is deleted (the commit that
        released them is written).
        """
        if self._adopted:
            return  # a resume refused before its trainer is restored keeps every part it found
        gone = ids.tolist()
        if version is not None:
            floor = durable_version(self.durable, int(version))
            if steps is not None:
                keep = steps >= floor
                self._replay.update(zip(ids[keep].tolist(), steps[keep].tolist(), strict=True))
                gone = ids[~keep].tolist()
            passed = [i for i, s in self._replay.items() if s < floor]
            for i in passed:
                del self._replay[i]
            gone += passed
        for i in gone:
            self._new.pop(int(i), None)
            part = self._part_of.pop(int(i), None)
            if part is None:
                continue
            live = self._live[part]
            live.discard(int(i))
            if not live:
                del self._live[part]
                assert self._dir is not None
                with contextlib.suppress(FileNotFoundError):
                    (self._dir / f"part-{part:06d}.parquet").unlink()

    def adopt(self, run_dir: Path, parts: dict[int, np.ndarray], generated: np.ndarray,
              consumed_step: np.ndarray) -> None:  # fmt: skip
        """Take over a resumed run's parts (sample ids by part): each stays until its samples are released.

        Only samples the log holds (``generated``) count: a part written by a
        flush whose commit a crash cut off names samples generated again, and
        goes now. A consumed sample's payload is kept as one a resume would
        replay (the first commit's :meth:`release` drops those the trainer's
        newest checkpoint has passed); a waiting one until its consumption is
        durable.
        """
        self._dir = Path(run_dir) / PAYLOAD_DIR
        self._adopted = True
        for part, ids in parts.items():
            self._next = max(self._next, part + 1)
            ids = ids[(ids >= 0) & (generated[np.maximum(ids, 0)] > 0)]
            if ids.size == 0:
                with contextlib.suppress(FileNotFoundError):
                    (self._dir / f"part-{part:06d}.parquet").unlink()
                continue
            self._live[part] = set(ids.tolist())
            self._part_of.update(dict.fromkeys(ids.tolist(), part))
            for i, s in zip(ids.tolist(), consumed_step[ids].tolist(), strict=True):
                if s >= 0:
                    self._replay[i] = int(s)


    def resumed(self) -> None:
        """The resumed run's trainer is restored: parts it no longer needs may go from the next release on."""
        self._adopted = False


def _part_files(run_dir: Path) -> list[tuple[int | None, Path]]:
    """The payload files of ``run_dir``: (part number, path), the legacy single file as part None."""
    out: list[tuple[int | None, Path]] = []
    if (run_dir / PAYLOAD_FILE).is_file():
        out.append((None, run_dir / PAYLOAD_FILE))
    d = run_dir / PAYLOAD_DIR
    if d.is_dir():
        for p in sorted(d.iterdir()):
            m = _PART.match(p.name)
            if m:
                out.append((int(m.group(1)), p))
    return out


def read_payload_parts(run_dir: Path) -> list[tuple[int | None, dict[tuple[str, int], Any]]]:
    """The payloads a run log stored, part by part: (part number or None, {(prompt id, sample index): payload})."""
    out = []
    for part, path in _part_files(Path(run_dir)):
        try:
            with arrow_file(path) as fh:  # a --log whose name is not UTF-8: pyarrow refused the str path
                table = pq.read_table(fh, schema=_SCHEMA)
            names = zip(table.column("prompt_id").to_pylist(), table.column("sample_index").to_pylist(), strict=True)
            texts = table.column("payload").to_pylist()
            out.append((part, {(str(p), int(i)): json.loads(t) for (p, i), t in zip(names, texts, strict=True)}))
        except MemoryError:  # pyarrow's ArrowMemoryError too: the file is fine, and deleting it would lose payloads
            raise
        except (pa.ArrowException, OSError, ValueError, TypeError, RecursionError) as exc:
            reason = " ".join(str(exc).split())[:160]
            raise RunError(f"{path}: cannot read the waiting samples' payloads ({reason}); delete the file to resume "
                           "without them (a trainer that needs their tokens then stops)") from None  # fmt: skip
    return out


def read_payloads(run_dir: Path) -> dict[tuple[str, int], Any]:
    """The payloads a run log stored, by (prompt id, sample index); empty when it stored none."""
    out: dict[tuple[str, int], Any] = {}
    for _, stored in read_payload_parts(run_dir):
        out.update(stored)
    return out


def delete_payloads(run_dir: Path) -> None:
    """Remove every payload file of a run that is complete (it resumes nothing)."""
    (Path(run_dir) / PAYLOAD_FILE).unlink(missing_ok=True)
    d = Path(run_dir) / PAYLOAD_DIR
    if d.is_dir() and not d.is_symlink():
        shutil.rmtree(d, ignore_errors=True)  # parts, and a crash's temporary files


def _encode(payload: Any) -> str | None:
    try:
        return json.dumps(payload, allow_nan=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return None


def sample_ids(work: Any, names: list[tuple[str, int]]) -> np.ndarray:
    """Global sample ids of (prompt id, sample index) pairs; -1 where this plan has no such sample."""
    row_of = {pid: r for r, pid in enumerate(work.prompt_ids.tolist())}
    first = work.row_first_samples()
    return np.asarray(
        [int(first[row_of[p]]) + i if p in row_of and 0 <= i < int(work.n_samples[row_of[p]]) else -1 for p, i in names],
        dtype=np.int64,
    )


def restore_payloads(run_dir: Path, work: Any, queued: np.ndarray, batches: Any, recorder: Any,
                     expected: bool) -> list[str]:  # fmt: skip
    """Hand a resumed run's waiting samples their stored payloads; notes for the run's stderr.

    ``batches`` (the run's ``BatchBuilder``) gives them to the trainer with
    their samples; ``recorder`` takes over the parts they are in, so each
    stays until its samples' consumption is durable (and, for consumed
    samples, until the trainer's checkpoints pass them: a replay reads them).
    ``expected``: the backend returns payloads (hf, vllm), so a waiting
    sample without one is worth a note.
    """
    parts = read_payload_parts(run_dir)
    stored: dict[tuple[str, int], Any] = {}
    owned: dict[int, np.ndarray] = {}
    for part, got in parts:
        stored.update(got)
        if part is not None:
            owned[part] = sample_ids(work, list(got))
    recorder.payloads.adopt(run_dir, owned, recorder.generated, recorder.consumed_step)
    if queued.size == 0:
        return []
    names = zip(work.prompt_ids[work.sample_row[queued]].tolist(), work.sample_index[queued].tolist(), strict=True)
    payload = [stored.get((str(p), int(i))) for p, i in names]
    batches.restore_payloads(queued, payload)
    if not any(part is not None for part, _ in parts):  # a log before the parts: written again as a part
        recorder.payloads.add(queued, payload)
    missing = sum(p is None for p in payload)
    if not missing or not (expected or stored):
        return []
    return [f"{missing} of the {queued.size} samples waiting for the trainer have no stored payload (a log "
            "written before aspc stored them, or a backend whose payloads are not JSON): a trainer that needs "
            "their tokens stops at the first of them"]
