"""Plan metrics, recomputed from a plan's rows.

The names here are the ones used everywhere: plan metadata, ``aspc check``,
``aspc inspect`` and reports.

- ``padding_ratio`` = Σ_b |b|·max_b / Σ len − 1 over sequences (predicted means).
- ``group_imbalance`` = max_g load_g / LB − 1 with LB = max(mean group load,
  largest single minibatch cost, cardinality bound): measured against the
  lower bound (see :func:`load_lower_bound`), not the mean.
- ``delivery_drift``: the largest gap between the cumulative fraction of work
  dispatched and of sequences dispatched (the sorting-bubble index).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from aspc import portable_math as pm
from aspc.anneal.order import delivery_drift
from aspc.costs import minibatch_costs
from aspc.emit import schema as S
from aspc.io.table import column_numpy

METRIC_NAMES = (
    "padding_ratio",
    "group_imbalance",
    "delivery_drift",
    "n_prompts",
    "n_sequences",
    "n_minibatches",
    "n_groups",
    "total_cost",
    "lower_bound",
    "max_group_load",
    "min_minibatch_size",
    "max_minibatch_size",
    "cost_model",
)


def minibatch_starts(minibatch: np.ndarray) -> np.ndarray:
    """Row boundaries of the minibatches of a plan in dispatch order (length M+1)."""
    n = minibatch.size
    return np.r_[np.flatnonzero(np.r_[True, minibatch[1:] != minibatch[:-1]]), n].astype(np.int64)


def table_costs(table: pa.Table, cost_model: str, cap: float | None = None) -> np.ndarray:
    """Per-minibatch predicted cost of a plan table (dispatch order); ``cap``: the plan's response cap."""
    mb = column_numpy(table.column(S.MINIBATCH))
    col = lambda c: column_numpy(table.column(c))  # noqa: E731
    return minibatch_costs(
        cost_model,
        minibatch_starts(mb),
        col(S.N_SAMPLES),
        col(S.PREDICTED_LEN),
        col(S.PREDICTED_Q10),
        col(S.PREDICTED_Q50),
        col(S.PREDICTED_Q90),
        cap=cap,
    )


def load_lower_bound(costs: np.ndarray, group_cardinalities: np.ndarray) -> float:
    """A lower bound on the largest group load for these minibatches and group sizes.

    max(mean load, largest minibatch, cardinality bound): the group holding the
    largest minibatch also holds at least ``k_min - 1`` others, so its load is
    at least the largest cost plus the ``k_min - 1`` smallest other costs.
    With group sizes fixed (``--group-size``) this is the bound no assignment
    can beat, so ``group_imbalance`` measures what balancing left on the table.
    """
    c = np.sort(np.asarray(costs, dtype=np.float64))
    n_groups = int(group_cardinalities.size)
    k_min = int(group_cardinalities.min()) if n_groups else 1
    card = float(c[-1] + pm.sum(c[:-1][: max(0, k_min - 1)]))
    return max(pm.sum(c) / max(n_groups, 1), float(c[-1]), card)


# Relative gap between the largest group load and the lower bound that is float rounding, not imbalance: both
# sum the same minibatch costs, in different orders (dispatch order per group; sorted for the bound), so a
# perfectly balanced plan differed by an ulp or so and a one-group plan failed 'aspc check --max-imbalance 0'.
# Summing m positive costs errs by at most ~m·eps relative (typically ~sqrt(m)·eps); kept below the
# absolute tolerance of aspc.emit.check (1e-12), so a plan that stored such a gap before still verifies.
IMBALANCE_ROUNDING = 1e-13


def group_imbalance(max_load: float, lb: float, n_groups: int) -> float:
    """``max_load / lb - 1``, exactly 0 for one group (its load is the bound) and for a gap within rounding."""
    if n_groups <= 1 or lb <= 0:  # lb 0: every cost is 0, nothing to balance
        return 0.0
    gap = max_load / lb - 1.0
    return gap if gap > IMBALANCE_ROUNDING else 0.0


def plan_metrics(
    table: pa.Table, cost_model: str = "padded", costs: np.ndarray | None = None, cap: float | None = None
) -> dict[str, Any]:
    """Compute every plan metric from the rows of ``table``."""
    mb = column_numpy(table.column(S.MINIBATCH))
    grp = column_numpy(table.column(S.GROUP))
    nseq = column_numpy(table.column(S.N_SAMPLES)).astype(np.float64)
    pred = column_numpy(table.column(S.PREDICTED_LEN))
    starts = minibatch_starts(mb)
    sizes = np.diff(starts)
    seq_per_mb = np.add.reduceat(nseq, starts[:-1])
    max_per_mb = np.maximum.reduceat(pred, starts[:-1])
    # pm.sum: NumPy >= 2.3's pairwise sums, which these always were here (so tests/fixtures/plans keep
    # their bytes), on older NumPy too, which split sums past 8,192 fractional predictions into buffers.
    total_len = pm.sum(nseq * pred)
    padded = pm.sum(seq_per_mb * max_per_mb)
    # The compiler passes the costs it already computed (same rows, same model).
    costs = table_costs(table, cost_model, cap) if costs is None else np.asarray(costs, dtype=np.float64)
    mb_group = grp[starts[:-1]]
    n_groups = int(grp.max()) + 1
    loads = np.bincount(mb_group, weights=costs, minlength=n_groups)
    lb = load_lower_bound(costs, np.bincount(mb_group, minlength=n_groups))
    out = {
        "padding_ratio": padded / total_len - 1.0 if total_len > 0 else 0.0,
        "group_imbalance": group_imbalance(float(loads.max()), lb, n_groups),
        "delivery_drift": float(delivery_drift(costs, seq_per_mb)),
        "n_prompts": int(table.num_rows),
        "n_sequences": int(nseq.sum()),
        "n_minibatches": int(sizes.size),
        "n_groups": n_groups,
        "total_cost": pm.sum(costs),
        "lower_bound": lb,
        "max_group_load": float(loads.max()),
        "min_minibatch_size": int(sizes.min()),
        "max_minibatch_size": int(sizes.max()),
        "cost_model": cost_model,
    }
    if cap is not None:
        out["response_cap"] = cap  # tokens: responses stop here (--max-response-length); costs count min(len, cap)
    return out


def group_loads(table: pa.Table, cost_model: str = "padded", cap: float | None = None) -> np.ndarray:
    """Predicted load of each group (sum of its minibatch costs)."""
    grp = column_numpy(table.column(S.GROUP))
    starts = minibatch_starts(column_numpy(table.column(S.MINIBATCH)))
    costs = table_costs(table, cost_model, cap)
    return np.bincount(grp[starts[:-1]], weights=costs, minlength=int(grp.max()) + 1)
