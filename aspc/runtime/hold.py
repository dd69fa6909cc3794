"""Scout responses generated inside a run and held for their prompt's group: the rolling scout.

A kept scout response (:mod:`aspc.runtime.carry`) is generated before the run
by its first weights, so the group consumed last carries a sample as old as
the epoch. A rolling scout (``simulate --strategies asp+scout+roll``,
:mod:`aspc.rolling_scout`) instead scouts each window of prompts inside the
run, beside the previous window's rest, and plans that window's
rest when its scout returns, as a plan revision. The runtime's side, here
and in the scheduler:

- a scout row (its prompt id ends in :data:`~aspc.emit.schema.SCOUT_ID_SUFFIX`) generates one
  sample, *held*: it leaves the in-flight count when it returns but does not
  enter the trainer's queue;
- a minibatch planned from the text prior alone is *pending*: it is not
  dispatched before a revision replaces it (the revision made when its
  window's scout returns);
- a revision may plan a prompt with one sample fewer than before, when its
  scout response finished under the cut and has returned: that response is
  the group's missing sample, *released* into the queue just before the
  first sample of the prompt's row, so the trainer consumes it with its
  siblings; its weights version is its own minibatch's (the scout's), so
  its policy lag counts from the weights that generated it.

A scout response cut at the scout's limit is not a sample: it is held and
never released, and its prompt's row generates the whole group. Under
``--max-staleness`` no response is kept (``RollingScout(keep=False)``): every
scout response is held that way, so the staleness gate bounds every sample
the trainer consumes. A model
backend (hf, vllm) stops a scout minibatch's responses at the scout's cut
(``Holds.scout_tokens``) and names a scout response's prompt as its group's
(:func:`aspc.emit.schema.prompt_of`), so a trainer that groups by prompt id
(GRPO) finds the kept response among its siblings; the trainer gets its
tokens from the batch builder, which keeps every response's payload until
it is consumed. A run log records which
samples are held (:func:`held_record`; revisions are replayed from
``RUN/plans/`` before it is compared), and a resumed run queues exactly the
ones its log shows released, where they were (:func:`queued_on_resume`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from aspc.emit import schema as S
from aspc.emit.schema import SCOUT_ID_SUFFIX
from aspc.errors import ConfigError, PlanError, RunError
from aspc.runtime.work import Holds, WorkPlan

# Schema metadata key of a revised remainder: JSON list of its pending minibatches (numbered from 0).
PENDING_KEY = b"aspc.pending_minibatches"


def scout_row_mask(work: WorkPlan) -> np.ndarray:
    """bool per plan row: a scout row (its prompt id ends in :data:`~aspc.emit.schema.SCOUT_ID_SUFFIX`)."""
    return scout_ids(work.table.column(S.PROMPT_ID))


def scout_ids(ids: Any) -> np.ndarray:
    """bool per id of an Arrow string array: a scout row's (vectorized: a run's plan has one per prompt and sample)."""
    import pyarrow.compute as pc

    return np.asarray(pc.ends_with(ids, SCOUT_ID_SUFFIX).to_numpy(zero_copy_only=False), dtype=bool)


def initial_holds(work: WorkPlan, scout_tokens: int | None = None, keeps: bool = True, ready: Any = None) -> Holds:
    """The :class:`Holds` of a rolling scout's first plan: scout rows held, every other minibatch pending.

    ``scout_tokens``: the scout's cut, where a model backend stops a scout
    minibatch's responses; ``keeps``: whether revisions may release them;
    ``ready``: prompt ids (an Arrow string array) planned without a scout,
    whose minibatches are not pending.

    Raises
    ------
    PlanError
        A scout row with more than one sample, a minibatch mixing scout rows
        with others, or no scout row at all.
    """
    scout = scout_row_mask(work)
    if not scout.any():
        raise PlanError("the rolling scout's plan has no scout row; build it with aspc.rolling_scout")
    if np.any(work.n_samples[scout] != 1):
        raise PlanError("a scout row generates exactly one sample; recompile the scout plan")
    per_mb = np.add.reduceat(scout.astype(np.int64), work.row_offsets[:-1])
    mixed = (per_mb > 0) & (per_mb < np.diff(work.row_offsets))
    if mixed.any():
        raise PlanError(f"minibatch {int(np.flatnonzero(mixed)[0])} mixes scout rows with others; recompile it")
    pending = per_mb == 0
    if ready is not None:
        import pyarrow.compute as pc

        mine = pc.is_in(work.table.column(S.PROMPT_ID), value_set=ready).to_numpy(zero_copy_only=False)
        pending &= np.add.reduceat(np.asarray(mine, dtype=np.int64), work.row_offsets[:-1]) == 0
    n = work.n_total_samples
    return Holds(scout[work.sample_row], np.full(n, -1, dtype=np.int64), pending, scout_tokens, keeps)


def revised_holds(work: WorkPlan, old: Holds, first: int, new_to_old: np.ndarray, kept_rows: np.ndarray,
                  pending_tail: np.ndarray, observed: np.ndarray | None) -> Holds:  # fmt: skip
    """The :class:`Holds` of ``work`` after a revision from minibatch ``first`` on.

    Held and released samples keep their links through ``new_to_old``; each
    of ``kept_rows`` (rows the revision planned with one sample fewer) keeps
    its prompt's scout response, released just before the row's first
    sample. ``observed`` (tokens per old sample id, -1 where not returned;
    None when a resumed run replays its revisions) must show that response
    returned.

    Raises
    ------
    RunError
        A kept row has no scout row, or its scout has not been dispatched
        or returned (a replanner bug).
    """
    held = old.held[new_to_old]  # a scout row keeps its one sample through every revision
    release = old.release_with[new_to_old]
    if kept_rows.size and not old.keeps:
        raise RunError("a plan revision keeps a scout response in a run that keeps none (--max-staleness); "
                       "please report this bug")  # fmt: skip
    if kept_rows.size:
        first_sample = work.row_first_samples()
        import pyarrow as pa
        import pyarrow.compute as pc

        ids = work.table.column(S.PROMPT_ID)
        wanted = pc.binary_join_element_wise(ids.take(pa.array(kept_rows)), pa.scalar(SCOUT_ID_SUFFIX), "")
        src = np.asarray(pc.index_in(wanted, value_set=ids.combine_chunks()).fill_null(-1).to_numpy(), dtype=np.int64)
        s0 = int(work.sample_offsets[first])
        ok = (src >= 0) & (first_sample[np.maximum(src, 0)] < s0)
        if ok.all() and observed is not None:
            ok = observed[new_to_old[first_sample[src]]] >= 0
        if not ok.all():
            raise RunError("a plan revision keeps a scout response that has not returned; the rolling scout "
                           "is broken, please report this bug")  # fmt: skip
        release[first_sample[kept_rows]] = first_sample[src]
    pending = np.concatenate([old.pending[:first], np.asarray(pending_tail, dtype=bool)])
    if pending.size != work.n_minibatches:
        raise RunError("a plan revision marks pending minibatches it does not hold; please report this bug")
    return Holds(held, release, pending, old.scout_tokens, old.keeps)


def pending_of(tail: Any) -> np.ndarray:
    """bool per minibatch of a revised remainder: its :data:`PENDING_KEY` marks (none without them)."""
    n_mb = int(tail.column(S.MINIBATCH).to_numpy().max()) + 1 if tail.num_rows else 0
    out = np.zeros(n_mb, dtype=bool)
    raw = (tail.schema.metadata or {}).get(PENDING_KEY)
    if raw:
        out[np.asarray(json.loads(raw), dtype=np.int64)] = True
    return out


def attach_holds(work: WorkPlan, replanner: object, *, max_staleness: int | None) -> None:
    """Set ``work.holds`` when ``replanner`` is a rolling scout's (it says ``holds_scouts``), after :func:`check_holds`."""
    if not getattr(replanner, "holds_scouts", False):
        return
    check_holds(replanner=replanner, max_staleness=max_staleness)
    work.holds = initial_holds(work, getattr(replanner, "tokens", None), getattr(replanner, "keeps", True),
                               getattr(replanner, "ready_ids", None))  # fmt: skip


def cut_scouts(work: WorkPlan, response_len: np.ndarray) -> None:
    """The sim's lengths (in place): a rolling scout's responses stop at its cut, as a model backend stops them."""
    if work.holds is not None and work.holds.scout_tokens is not None:
        held = work.holds.held
        response_len[held] = np.minimum(response_len[held], int(work.holds.scout_tokens))


def held_summary(work: WorkPlan) -> dict[str, Any] | None:
    """What a run's summary says of its held samples: how many joined a group, how many were cut scouts.

    A run that keeps none (under ``--max-staleness``) says ``not_kept``
    instead of ``cut``: its responses that finished under the cut are held too.
    """
    if work.holds is None:
        return None
    kept = work.holds.n_released
    return {"kept": kept, ("cut" if work.holds.keeps else "not_kept"): int(np.count_nonzero(work.holds.held)) - kept}


def left_over_without_held(summary: Any) -> None:
    """``summary.samples_left_over`` (in place) less the held responses never meant to be consumed.

    A cut scout response (or, under ``--max-staleness``, any scout response) is held and never a
    sample; counted, a rolling scout's run reported them as samples generated and left over, two
    global batches and more. ``summary.extra["samples_held"]`` (:func:`work_extras`) must be set.
    """
    held = summary.extra.get("samples_held") or {}
    never = int(held.get("cut", 0)) + int(held.get("not_kept", 0))
    summary.samples_left_over = max(0, int(summary.samples_left_over) - never)


def work_extras(work: WorkPlan) -> dict[str, Any]:
    """What a run's summary says of the samples it did not generate afresh: carried responses, held ones."""
    out: dict[str, Any] = {}
    if work.carried is not None:  # those not generated afresh at dispatch (carry_through)
        out["samples_carried"] = int(np.count_nonzero(work.carried))
    if work.holds is not None:
        out["samples_held"] = held_summary(work)
    return out


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


def check_holds(*, replanner: object, max_staleness: int | None) -> None:
    """Refuse held scout samples where the runtime cannot honour them yet (one line each).

    Carried responses are refused before (:func:`~aspc.runtime.carry.check_carried`: not with a replanner).
    """
    if not getattr(replanner, "holds_scouts", False):
        raise ConfigError("the rolling scout plans each window's rest when its scout returns: run it with its "
                          "replanner (aspc.rolling_scout), not another")  # fmt: skip
    if max_staleness is not None and getattr(replanner, "keeps", True):
        # A held response waits for its group's row, which the gate may hold back past K versions of it.
        raise ConfigError("a rolling scout that keeps its responses does not combine with --max-staleness (a held "
                          "response's lag is not bounded by it); build it with keep=False, or drop the bound")  # fmt: skip
