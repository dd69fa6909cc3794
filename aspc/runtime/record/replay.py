"""On ``--resume``, replay the logged trainer steps that the trainer's newest checkpoint does not hold.

A trainer that checkpoints every N steps (verl's ``save_freq``: a step's
checkpoint of a large model costs more than the step) resumes from a state
older than the run log. Restarting generation from there would leave the
log's samples of the later steps consumed by a policy that no longer
exists; throwing those steps away would generate them again. Instead the
trainer restores its newest checkpoint (``Trainer.durable`` names it) and
takes the logged steps after it again, each on the same samples in the
same order, with the payloads the log kept for them
(:mod:`aspc.runtime.record.payloads`): a trainer that is deterministic
given its state and its batch ends where the interrupted run's did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from aspc.errors import RunError
from aspc.runtime.contracts import durable_version, restore_version, take_step
from aspc.runtime.core.scheduler import TrainStep
from aspc.runtime.record import runlog as R
from aspc.runtime.record.payloads import read_payloads, sample_ids


def consumed_batches(log: R.RunLog, work: Any, first: int, last: int) -> list[np.ndarray]:
    """The sample ids each step ``first..last-1`` of ``log`` consumed, in the order it took them."""
    con = log.tables[R.CONSUMED]
    steps = np.asarray(con.column("consumed_step").to_numpy(zero_copy_only=False), dtype=np.int64)
    pick = np.flatnonzero(steps >= first)
    pids = con.column("prompt_id").take(pick).to_pylist()
    gid = sample_ids(work, list(zip(pids, con.column("sample_index").take(pick).to_pylist(), strict=True)))
    if np.any(gid < 0):
        raise RunError(f"{log.path}: cannot resume: its consumed samples name samples this plan does not have")
    out = [gid[steps[pick] == k] for k in range(first, last)]
    if any(ids.size == 0 for ids in out):
        raise RunError(f"{log.path}: cannot resume: the log keeps no consumed samples of a step from {first} on "
                       "(a run log compacted at its end); rerun with --overwrite")  # fmt: skip
    return out


def replay(log: R.RunLog, work: Any, trainer: Any, batches: Any, payloads: Any, version: int,
           expected: bool) -> tuple[Any, list[str]]:  # fmt: skip
    """Restore ``trainer`` for a log holding ``version`` steps; the weights workers load, and notes.

    ``batches`` (the run's ``BatchBuilder``, already restored from the log)
    builds each replayed step's batch as the run did. ``payloads`` (the
    recorder's ``PendingPayloads``) already holds the parts the resume found
    (``restore_payloads``); they stay whole until the trainer is restored,
    so a resume refused here leaves them for the next. ``expected``: the
    backend returns payloads (hf, vllm).
    """
    weights, notes = _replay(log, work, trainer, batches, version, expected)
    payloads.resumed()
    return weights, notes


def _replay(log: R.RunLog, work: Any, trainer: Any, batches: Any, version: int, expected: bool) -> tuple[Any, list[str]]:
    floor = durable_version(trainer.durable, version)
    weights = restore_version(trainer, floor)
    if floor == version:
        return weights, []
    ids_per_step = consumed_batches(log, work, floor, version)
    ids = np.concatenate(ids_per_step)
    stored = read_payloads(Path(log.path))
    names = zip(work.prompt_ids[work.sample_row[ids]].tolist(), work.sample_index[ids].tolist(), strict=True)
    payload = [stored.get((str(p), int(i))) for p, i in names]
    missing = sum(p is None for p in payload)
    if missing and (expected or stored):
        raise RunError(f"{log.path}: cannot resume: the trainer restores weights version {floor}, and {missing} "
                       f"samples of the steps from {floor} to {version - 1} it must take again have no stored "
                       "payload; resume with the checkpoints the run wrote, or rerun with --overwrite")  # fmt: skip
    batches.restore_payloads(ids, payload)
    for k, step_ids in enumerate(ids_per_step, start=floor):
        weights = take_step(trainer, batches.take(TrainStep(k, step_ids)), replay=True).weights
    return weights, [f"the trainer restored weights version {floor} and took the logged steps {floor}..{version - 1} "
                     "again on their samples"]  # fmt: skip


def restore_end(trainer: Any, version: int, log_dir: Any) -> None:
    """Restore ``trainer`` to the end of a completed epoch (``version`` steps) that ``--epochs --resume`` reads back.

    A complete log keeps no payloads to replay steps with, so the trainer
    must restore that very version (the bundled GRPO trainer checkpoints
    each epoch's last step).
    """
    floor = durable_version(trainer.durable, version)
    if floor != version:
        raise RunError(f"{log_dir}: cannot resume: the trainer restores weights version {floor}, not the end of "
                       f"this completed epoch ({version}); resume with the checkpoints the run wrote, or rerun "
                       "with --overwrite")  # fmt: skip
    restore_version(trainer, version)
