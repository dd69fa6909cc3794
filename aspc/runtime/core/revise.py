"""Applying a plan revision: the undispatched remainder of a run gets new minibatches.

A revision never touches a minibatch already handed out: the plan rows of
minibatches ``< k`` (and so their sample ids ``< sample_offsets[k]``) keep
their place; the rows after them are replaced by the revised remainder, in
its dispatch order, and its minibatches are numbered ``k, k + 1, ...``.
Sample ids after the prefix are renumbered; none of them has been generated
yet, so nothing recorded refers to them. In a rolling scout's run (held
samples, :mod:`aspc.runtime.hold`) a revision may also plan a prompt with
one sample fewer: its scout's response takes the dropped sample's place.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aspc.emit import schema as S
from aspc.errors import RunError
from aspc.io.table import arrow_array, arrow_scalar, column_numpy
from aspc.runtime.hold import pending_of, revised_holds
from aspc.runtime.work import WorkPlan, work_from_table


def revise_work(work: WorkPlan, first: int, tail: pa.Table, observed: np.ndarray | None = None) -> np.ndarray:
    """Replace minibatches ``>= first`` of ``work`` (in place) by ``tail``; return new -> old sample ids.

    With held samples, ``tail``'s own sample counts apply (each the old one
    or one fewer) and its pending marks; ``observed`` (tokens per sample id,
    -1 where not returned; None when a resume replays the revision) is what
    :func:`~aspc.runtime.hold.revised_holds` checks a kept scout against.

    Raises
    ------
    RunError
        ``tail`` does not hold exactly the remainder's prompts with their
        sample counts (a replanner bug): the run stops rather than lose or
        duplicate work.
    """
    import pyarrow.compute as pc

    r0 = int(work.row_offsets[first])
    old_ids = work.table.column(S.PROMPT_ID).slice(r0).combine_chunks()
    new_ids = tail.column(S.PROMPT_ID)
    # Plan ids are unique: the same prompts iff every new id is found once among the old ones.
    at = pc.index_in(new_ids, value_set=old_ids)
    found = at.null_count == 0 and len(new_ids) == len(old_ids)
    # arrow_scalar and arrow_array here, not Python values or pa.array: pyarrow imports pandas for those.
    old_rows = r0 + column_numpy(at.fill_null(arrow_scalar(-1, at.type))).astype(np.int64)
    if not found or np.unique(old_rows).size != len(old_ids):
        raise RunError(
            f"plan revision holds {len(new_ids)} prompts for a remainder of {len(old_ids)} "
            "(not the same prompts); the replanner is broken, please report this bug"
        )
    mb = column_numpy(tail.column(S.MINIBATCH)).astype(np.int64) + first
    grp = column_numpy(tail.column(S.GROUP)).astype(np.int64)
    # A copy of the kept rows, not a slice: a slice keeps every earlier revision's whole buffers alive
    # (its last chunk is one), so memory grew with the revisions, not the plan.
    head = work.table.slice(0, r0).combine_chunks()
    g0 = int(work.group[:first].max()) + 1 if first > 0 else 0
    cols = {}
    for name in work.table.column_names:
        col = tail.column(name)
        if name == S.MINIBATCH:
            col = arrow_array(mb.astype(np.int32), pa.int32())
        elif name == S.GROUP:
            col = arrow_array((grp + g0).astype(np.int32), pa.int32())
        elif name == S.DISPATCH_RANK:
            col = arrow_array(np.arange(r0, r0 + len(old_rows), dtype=np.int64), pa.int64())
        cols[name] = col
    table = pa.concat_tables([head, pa.Table.from_pydict(cols, schema=work.table.schema)])
    # The run's sample counts (after any --samples-per-prompt override) move with their prompts;
    # a rolling scout's revision may drop one where the prompt's scout response is kept.
    counts = np.concatenate([work.n_samples[:r0], work.n_samples[old_rows]]).astype(np.int32)
    kept_rows = np.zeros(0, dtype=np.int64)
    if work.holds is not None:
        own = column_numpy(tail.column(S.N_SAMPLES)).astype(np.int32)
        drop = counts[r0:] - own
        if np.any((drop != 0) & (drop != 1)):
            raise RunError("plan revision changes a prompt's sample count by more than its scout response; "
                           "the replanner is broken, please report this bug")  # fmt: skip
        counts[r0:] = own
        kept_rows = r0 + np.flatnonzero(drop == 1)
    table = table.set_column(table.schema.get_field_index(S.N_SAMPLES), S.N_SAMPLES, arrow_array(counts, pa.int32()))
    new = work_from_table(table)
    # Counted by the model's tokenizer at setup (WorkPlan.count_prompt_tokens), not the plan's estimate: they move too.
    new.prompt_tokens = np.concatenate([work.prompt_tokens[:r0], work.prompt_tokens[old_rows]])
    # Sample (row, index) pairs map one to one; the prefix is the identity.
    old_first = work.row_first_samples()
    row_of_new_row = np.concatenate([np.arange(r0, dtype=np.int64), old_rows])
    new_to_old = old_first[row_of_new_row[new.sample_row]] + new.sample_index
    # One to one but for the samples a kept scout response replaces (never dispatched: after the prefix).
    seen = np.zeros(work.n_total_samples, dtype=np.int64)
    np.add.at(seen, new_to_old, 1)
    if seen.max(initial=0) > 1 or np.any(seen[: int(work.sample_offsets[first])] == 0):
        raise RunError("plan revision lost or duplicated samples; please report this bug")
    holds = None
    if work.holds is not None:
        holds = revised_holds(new, work.holds, first, new_to_old, kept_rows, pending_of(tail), observed)
    fields = ("table", "prompt_ids", "prompt_tokens", "n_samples", "row_offsets", "sample_offsets")
    for f in (*fields, "sample_row", "sample_index", "group"):
        setattr(work, f, getattr(new, f))
    work._bounds = None
    work.holds = holds
    return new_to_old.astype(np.int64)
