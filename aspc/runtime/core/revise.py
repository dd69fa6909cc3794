"""Applying a plan revision: the undispatched remainder of a run gets new minibatches.

A revision never touches a minibatch already handed out: the plan rows of
minibatches ``< k`` (and so their sample ids ``< sample_offsets[k]``) keep
their place; the rows after them are replaced by the revised remainder, in
its dispatch order, and its minibatches are numbered ``k, k + 1, ...``.
Sample ids after the prefix are renumbered; none of them has been generated
yet, so nothing recorded refers to them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aspc.emit import schema as S
from aspc.errors import RunError
from aspc.io.table import column_numpy
from aspc.runtime.work import WorkPlan, work_from_table


def revise_work(work: WorkPlan, first: int, tail: pa.Table) -> np.ndarray:
    """Replace minibatches ``>= first`` of ``work`` (in place) by ``tail``; return new -> old sample ids.

    Raises
    ------
    RunError
        ``tail`` does not hold exactly the remainder's prompts with their
        sample counts (a replanner bug): the run stops rather than lose or
        duplicate work.
    """
    r0 = int(work.row_offsets[first])
    old_ids = work.prompt_ids[r0:].tolist()
    new_ids = tail.column(S.PROMPT_ID).to_pylist()
    pos = {pid: r0 + i for i, pid in enumerate(old_ids)}
    if len(new_ids) != len(old_ids) or set(new_ids) != set(old_ids):
        raise RunError(
            f"plan revision holds {len(new_ids)} prompts for a remainder of {len(old_ids)} "
            "(not the same prompts); the replanner is broken, please report this bug"
        )
    old_rows = np.array([pos[p] for p in new_ids], dtype=np.int64)
    mb = column_numpy(tail.column(S.MINIBATCH)).astype(np.int64) + first
    grp = column_numpy(tail.column(S.GROUP)).astype(np.int64)
    head = work.table.slice(0, r0)
    g0 = int(work.group[:first].max()) + 1 if first > 0 else 0
    cols = {}
    for name in work.table.column_names:
        col = tail.column(name)
        if name == S.MINIBATCH:
            col = pa.array(mb.astype(np.int32), pa.int32())
        elif name == S.GROUP:
            col = pa.array((grp + g0).astype(np.int32), pa.int32())
        elif name == S.DISPATCH_RANK:
            col = pa.array(np.arange(r0, r0 + len(new_ids), dtype=np.int64), pa.int64())
        cols[name] = col
    table = pa.concat_tables([head, pa.Table.from_pydict(cols, schema=work.table.schema)])
    # The run's sample counts (after any --samples-per-prompt override) move with their prompts.
    counts = np.concatenate([work.n_samples[:r0], work.n_samples[old_rows]]).astype(np.int32)
    table = table.set_column(table.schema.get_field_index(S.N_SAMPLES), S.N_SAMPLES, pa.array(counts, pa.int32()))
    new = work_from_table(table)
    # Sample (row, index) pairs map one to one; the prefix is the identity.
    old_first = np.r_[0, np.cumsum(work.n_samples)][:-1]
    row_of_new_row = np.concatenate([np.arange(r0, dtype=np.int64), old_rows])
    new_to_old = old_first[row_of_new_row[new.sample_row]] + new.sample_index
    if not np.array_equal(np.sort(new_to_old), np.arange(work.n_total_samples)):
        raise RunError("plan revision lost or duplicated samples; please report this bug")
    fields = ("table", "prompt_ids", "prompt_tokens", "n_samples", "row_offsets", "sample_offsets")
    for f in (*fields, "sample_row", "sample_index", "group"):
        setattr(work, f, getattr(new, f))
    work._bounds = None
    return new_to_old.astype(np.int64)
