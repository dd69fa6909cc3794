"""Structural invariants every plan satisfies.

Checked on every read, so a hand-edited or truncated plan fails loudly before
the runtime spends accelerator time on it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aspc.emit import schema as S
from aspc.errors import PlanError
from aspc.guards import MAX_LENGTH
from aspc.io.table import column_numpy


def _contiguous_ids(ids: np.ndarray) -> bool:
    """True when ids start at 0, never decrease, and step by at most 1."""
    if ids.size == 0:
        return True
    d = np.diff(ids)
    return bool(ids[0] == 0 and np.all((d == 0) | (d == 1)))


def validate_table(table: pa.Table, *, name: str = "plan") -> None:
    """Raise :class:`PlanError` unless ``table`` is a well-formed plan."""
    n = table.num_rows
    if n == 0:
        raise PlanError(f"{name}: plan has no rows; recompile from a non-empty dataset")
    rank = column_numpy(table.column(S.DISPATCH_RANK))
    if not np.array_equal(rank, np.arange(n)):
        raise PlanError(f"{name}: rows are not in dispatch order (dispatch_rank != row number); recompile")
    mb = column_numpy(table.column(S.MINIBATCH))
    grp = column_numpy(table.column(S.GROUP))
    if not _contiguous_ids(mb):
        raise PlanError(f"{name}: minibatch ids are not contiguous in dispatch order; recompile the plan")
    if not _contiguous_ids(grp):
        raise PlanError(f"{name}: group ids are not contiguous in dispatch order; recompile the plan")
    starts = np.flatnonzero(np.r_[True, mb[1:] != mb[:-1]])
    if np.any(grp[starts] != grp[np.r_[starts[1:], n] - 1]):
        raise PlanError(f"{name}: a minibatch spans two groups; recompile the plan")
    ids = table.column(S.PROMPT_ID).to_pylist()
    if len(set(ids)) != n:
        raise PlanError(f"{name}: duplicate prompt ids in plan; recompile the plan")
    if any(not i for i in ids):
        raise PlanError(f"{name}: empty prompt_id in some rows; recompile the plan")
    for col in (S.PROMPT_TOKENS, S.SOURCE_ROW):
        if np.any(column_numpy(table.column(col)) < 0):
            raise PlanError(f"{name}: column {col} has negative values; recompile the plan")
    ns = column_numpy(table.column(S.N_SAMPLES))
    if np.any(ns < 1):
        raise PlanError(f"{name}: n_samples must be >= 1 in every row; recompile the plan")
    for col in (S.PREDICTED_LEN, S.PREDICTED_Q10, S.PREDICTED_Q50, S.PREDICTED_Q90):
        v = column_numpy(table.column(col))
        if not np.all(np.isfinite(v)) or np.any(v < 0):
            raise PlanError(f"{name}: column {col} has negative or non-finite values; recompile the plan")
        # Compile refuses longer lengths (aspc.guards.check_lengths); past it 'aspc run' overflowed and
        # blamed "response lengths must be >= 0".
        if np.any(v > MAX_LENGTH):
            raise PlanError(f"{name}: column {col} has lengths over {MAX_LENGTH:.0e} tokens, more than compile "
                            "allows; recompile the plan")  # fmt: skip
    q10 = column_numpy(table.column(S.PREDICTED_Q10))
    q50 = column_numpy(table.column(S.PREDICTED_Q50))
    q90 = column_numpy(table.column(S.PREDICTED_Q90))
    if np.any(q10 > q90 + 1e-9):
        raise PlanError(f"{name}: predicted_q10 exceeds predicted_q90 in some rows; recompile the plan")
    # The expected-max cost reads q50 as the median between them; compile's predictors keep that order.
    if np.any(q10 > q50 + 1e-9):
        raise PlanError(f"{name}: predicted_q10 exceeds predicted_q50 in some rows; recompile the plan")
    if np.any(q50 > q90 + 1e-9):
        raise PlanError(f"{name}: predicted_q50 exceeds predicted_q90 in some rows; recompile the plan")
