"""Synthetic plan tables, for benchmarks and tests that must not depend on the compiler.

They follow PLAN_SCHEMA and its invariants (rows in dispatch order,
minibatches 0..M-1) but are not compiled: minibatches are consecutive runs of
rows, in random or sorted order of the predicted length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from aspc.costs.kernel import Z90
from aspc.emit import schema as S


def plan_table(
    minibatch: Sequence[int],
    *,
    n_samples: Sequence[int] | int = 1,
    prompt_tokens: Sequence[int] | int = 0,
    predicted: Sequence[float] | float = 100.0,
    spread: float = 0.3,
    group_size: int = 8,
    ids: Sequence[str] | None = None,
) -> pa.Table:
    """A plan table from per-row minibatch ids (dispatch order) and optional per-row values.

    ``spread`` is the log-normal sigma that sets predicted_q10 / q90 around
    ``predicted`` (used as both mean and median).
    """
    mb = np.asarray(minibatch, dtype=np.int32)
    n = mb.size
    q50 = np.broadcast_to(np.asarray(predicted, dtype=np.float64), (n,)).copy()
    ids = list(ids) if ids is not None else [f"p{i:07d}" for i in range(n)]
    cols = {
        S.PROMPT_ID: pa.array(ids, pa.string()),
        S.SOURCE_ROW: pa.array(np.arange(n, dtype=np.int64)),
        S.PROMPT: pa.array([f"prompt {i}" for i in range(n)], pa.string()),
        S.PROMPT_TOKENS: pa.array(np.broadcast_to(np.asarray(prompt_tokens, dtype=np.int64), (n,)).copy()),
        S.N_SAMPLES: pa.array(np.broadcast_to(np.asarray(n_samples, dtype=np.int32), (n,)).copy()),
        S.PREDICTED_LEN: pa.array(q50),
        S.PREDICTED_Q10: pa.array(q50 * np.exp(-Z90 * spread)),
        S.PREDICTED_Q50: pa.array(q50),
        S.PREDICTED_Q90: pa.array(q50 * np.exp(Z90 * spread)),
        S.MINIBATCH: pa.array(mb),
        S.GROUP: pa.array((mb // max(1, group_size)).astype(np.int32)),
        S.DISPATCH_RANK: pa.array(np.arange(n, dtype=np.int64)),
    }
    return pa.Table.from_pydict(cols, schema=S.PLAN_SCHEMA)


def synthetic_plan(
    n_prompts: int,
    batch_size: int,
    *,
    n_samples: int = 1,
    order: str = "random",
    seed: int = 0,
    median: float = 350.0,
    sigma_between: float = 0.8,
    spread: float = 0.3,
) -> pa.Table:
    """A plan of ``n_prompts`` with log-normal predicted lengths in fixed-size minibatches.

    ``order`` is ``"random"`` (the unscheduled baseline) or ``"sorted"``
    (shortest first).
    """
    rng = np.random.default_rng(seed)
    q50 = np.exp(np.log(median) + sigma_between * rng.standard_normal(n_prompts))
    if order == "sorted":
        q50 = np.sort(q50)
    elif order != "random":
        raise ValueError("order must be 'random' or 'sorted'")
    ptok = rng.integers(16, 512, size=n_prompts)
    mb = np.arange(n_prompts) // batch_size
    return plan_table(mb, n_samples=n_samples, prompt_tokens=ptok, predicted=q50, spread=spread)
