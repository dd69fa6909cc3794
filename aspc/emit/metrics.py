"""Plan metrics, recomputed from a plan's rows.

The names here are the ones used everywhere: plan metadata, ``aspc check``,
``aspc inspect`` and reports.

- ``padding_ratio`` = Σ_b |b|·max_b / Σ len − 1 over sequences (predicted means).
- ``group_imbalance`` = max_g load_g / LB − 1 with LB = max(mean group load,
  largest single minibatch cost): measured against the lower bound.
- ``delivery_drift``: the largest gap between the cumulative fraction of work
  dispatched and of sequences dispatched (the sorting-bubble index).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from aspc.anneal.order import delivery_drift
from aspc.costs import minibatch_costs
from aspc.emit import schema as S

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


def table_costs(table: pa.Table, cost_model: str) -> np.ndarray:
    """Per-minibatch predicted cost of a plan table (dispatch order)."""
    mb = table.column(S.MINIBATCH).to_numpy()
    col = lambda c: table.column(c).to_numpy()  # noqa: E731
    return minibatch_costs(
        cost_model,
        minibatch_starts(mb),
        col(S.N_SAMPLES),
        col(S.PREDICTED_LEN),
        col(S.PREDICTED_Q10),
        col(S.PREDICTED_Q50),
        col(S.PREDICTED_Q90),
    )


def plan_metrics(table: pa.Table, cost_model: str = "padded") -> dict[str, Any]:
    """Compute every plan metric from the rows of ``table``."""
    mb = table.column(S.MINIBATCH).to_numpy()
    grp = table.column(S.GROUP).to_numpy()
    nseq = table.column(S.N_SAMPLES).to_numpy().astype(np.float64)
    pred = table.column(S.PREDICTED_LEN).to_numpy()
    starts = minibatch_starts(mb)
    sizes = np.diff(starts)
    seq_per_mb = np.add.reduceat(nseq, starts[:-1])
    max_per_mb = np.maximum.reduceat(pred, starts[:-1])
    total_len = float(np.dot(nseq, pred))
    padded = float(np.dot(seq_per_mb, max_per_mb))
    costs = table_costs(table, cost_model)
    mb_group = grp[starts[:-1]]
    n_groups = int(grp.max()) + 1
    loads = np.bincount(mb_group, weights=costs, minlength=n_groups)
    lb = max(float(loads.sum()) / n_groups, float(costs.max()))
    return {
        "padding_ratio": padded / total_len - 1.0 if total_len > 0 else 0.0,
        "group_imbalance": float(loads.max()) / lb - 1.0 if lb > 0 else 0.0,
        "delivery_drift": float(delivery_drift(costs, seq_per_mb)),
        "n_prompts": int(table.num_rows),
        "n_sequences": int(nseq.sum()),
        "n_minibatches": int(sizes.size),
        "n_groups": n_groups,
        "total_cost": float(costs.sum()),
        "lower_bound": lb,
        "max_group_load": float(loads.max()),
        "min_minibatch_size": int(sizes.min()),
        "max_minibatch_size": int(sizes.max()),
        "cost_model": cost_model,
    }


def group_loads(table: pa.Table, cost_model: str = "padded") -> np.ndarray:
    """Predicted load of each group (sum of its minibatch costs)."""
    grp = table.column(S.GROUP).to_numpy()
    starts = minibatch_starts(table.column(S.MINIBATCH).to_numpy())
    costs = table_costs(table, cost_model)
    return np.bincount(grp[starts[:-1]], weights=costs, minlength=int(grp.max()) + 1)
