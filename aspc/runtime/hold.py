"""Scout responses generated inside a run and held for their prompt's group: the rolling scout.

A kept scout response (:mod:`aspc.runtime.carry`) is generated before the run
by its first weights, so the group consumed last carries a sample as old as
the epoch. A rolling scout (``simulate --strategies asp+scout+roll``) instead
scouts each window of prompts inside the run, part-way through the previous
window's rest; each response that finished under the cut is its prompt's
last sample. Three things make that hold together, all here and in the
scheduler:

- a scout row's samples are *held*: they leave the in-flight count when they
  return but do not enter the trainer's queue;
- a held sample is *released* into the queue with its group, just before the
  first sample of the row it was kept for, so the trainer consumes it with
  its siblings; its weights version is its own minibatch's (the scout's),
  so its policy lag counts from the weights that generated it;
- a minibatch planned from scouted lengths waits for them: it is not
  dispatched before every scout minibatch up to the last one it needs has
  finished (``after``), whatever the plan order would allow.

A scout response cut at the scout's limit is not a sample: it is held and
never released, and its prompt's row generates the whole group. The
simulator only so far: a real run would plan each window's rest when its
scout returns (refused by :func:`check_holds`). A run log records which
samples are held (:func:`held_record`), and a resumed run queues exactly the
ones its log shows released, where they were (:func:`queued_on_resume`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from aspc.errors import ConfigError, PlanError
from aspc.runtime.work import Holds, WorkPlan


def holds_for(work: WorkPlan, scout_rows: np.ndarray, keep_for: np.ndarray) -> Holds:
    """The :class:`Holds` of ``work`` from per-row marks.

    Parameters
    ----------
    scout_rows
        bool per plan row: a scout row (one sample, held).
    keep_for
        int64 per plan row: for a scout row, the plan row whose group keeps
        its response (-1: discarded, a cut scout); ignored elsewhere.

    Raises
    ------
    PlanError
        Marks of the wrong length; a scout row with more than one sample, or
        kept for a row that is itself a scout row, is kept twice, or comes
        later in dispatch order than the row it feeds.
    """
    n_rows = work.table.num_rows
    scout_rows = np.asarray(scout_rows, dtype=bool)
    keep_for = np.asarray(keep_for, dtype=np.int64)
    if scout_rows.shape != (n_rows,) or keep_for.shape != (n_rows,):
        raise PlanError(f"got {scout_rows.size} scout marks and {keep_for.size} targets for {n_rows} plan rows")
    rows = np.flatnonzero(scout_rows)
    if np.any(work.n_samples[rows] != 1):
        raise PlanError("a scout row generates exactly one sample; recompile the scout plan")
    target = keep_for[rows]
    kept = target >= 0
    if np.any(target >= n_rows) or np.any(scout_rows[target[kept]]):
        raise PlanError("a scout response is kept for a row that does not exist or is itself a scout row")
    if np.unique(target[kept]).size != int(kept.sum()):
        raise PlanError("two scout responses are kept for one row")
    row_mb = np.repeat(np.arange(work.n_minibatches, dtype=np.int64), np.diff(work.row_offsets))
    if np.any(row_mb[rows[kept]] >= row_mb[target[kept]]):
        raise PlanError("a scout row must come in an earlier minibatch than the row that keeps its response")
    first_sample = np.r_[0, np.cumsum(work.n_samples)[:-1]].astype(np.int64)  # per row
    held = scout_rows[work.sample_row]
    release_with = np.full(work.n_total_samples, -1, dtype=np.int64)
    release_with[first_sample[target[kept]]] = first_sample[rows[kept]]
    after = np.full(work.n_minibatches, -1, dtype=np.int64)
    # Every scout row feeds a later row: that row's minibatch needs the scout's minibatch done.
    np.maximum.at(after, row_mb[target[kept]], row_mb[rows[kept]])
    return Holds(held, release_with, after, np.unique(row_mb[rows]))


def attach_holds(work: WorkPlan, scout_rows: np.ndarray | None, keep_for: np.ndarray | None, *, simulated: bool,
                 replanner: object, carried: object, max_staleness: int | None) -> None:  # fmt: skip
    """Set ``work.holds`` from :func:`aspc.runtime.run`'s ``scout_rows`` / ``keep_for``, after :func:`check_holds`."""
    if (scout_rows is None) != (keep_for is None):
        raise ConfigError("the rolling scout needs both its scout rows and the rows they are kept for")
    if scout_rows is None or keep_for is None:
        return
    check_holds(simulated=simulated, replanner=replanner, carried=carried, max_staleness=max_staleness)
    work.holds = holds_for(work, scout_rows, keep_for)


def held_summary(work: WorkPlan) -> dict[str, Any] | None:
    """What a run's summary says of its held samples: how many joined a group, how many were cut scouts."""
    if work.holds is None:
        return None
    kept = work.holds.n_released
    return {"kept": kept, "cut": int(np.count_nonzero(work.holds.held)) - kept}


def held_record(work: WorkPlan) -> dict[str, Any] | None:
    """What a run log records of its held samples: a resume must hold and release the same ones."""
    if work.holds is None:
        return None
    h = hashlib.sha256(np.packbits(work.holds.held).tobytes())
    h.update(np.ascontiguousarray(work.holds.release_with).tobytes())
    return {**(held_summary(work) or {}), "sha256": h.hexdigest()}


def queued_on_resume(work: WorkPlan, waiting: np.ndarray, generated: np.ndarray, finish_time: np.ndarray) -> np.ndarray:
    """The samples a resumed run queues (generated, not consumed: ``waiting``), in the order the run queued them.

    Without holds: by finish time, then sample id. A held sample is queued
    only if the first sample of the row that keeps it has returned, and then
    just before that sample, as :meth:`Scheduler.on_samples` queued it; the
    others (not yet released, or cut) stay out of the queue.
    """
    key = finish_time.astype(np.float64, copy=True)
    pos = np.arange(finish_time.size, dtype=np.float64)
    if work.holds is not None:
        first = np.flatnonzero(work.holds.release_with >= 0)
        held = work.holds.release_with[first]
        out = (generated[first] == 1) & (generated[held] == 1)
        key[held[out]] = finish_time[first[out]]
        pos[held[out]] = first[out] - 0.5
        released = np.zeros(finish_time.size, dtype=bool)
        released[held[out]] = True
        waiting = waiting[~work.holds.held[waiting] | released[waiting]]
    return waiting[np.lexsort((pos[waiting], key[waiting]))]


def check_holds(*, simulated: bool, replanner: object, carried: object, max_staleness: int | None) -> None:
    """Refuse held scout samples where the runtime cannot honour them yet (one line each)."""
    if not simulated:
        raise ConfigError("the rolling scout is simulated only so far; use the sim backend")
    if replanner is not None:
        raise ConfigError("the rolling scout does not combine with re-planning yet; drop one of the two")
    if carried is not None:
        raise ConfigError("the rolling scout scouts every window inside the run; drop the carried responses")
    if max_staleness is not None:
        raise ConfigError("the rolling scout does not combine with --max-staleness yet (a held response's lag "
                          "is not bounded by it); drop one of the two")  # fmt: skip
