"""What the report draws, computed once from a plan and its run logs (NumPy only).

The figures never read files: they receive a :class:`PlanView` and a list of
:class:`RunView`, so each can be tested on hand-made arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aspc.emit import Plan, plan_cost_model
from aspc.emit import schema as S
from aspc.emit.metrics import load_lower_bound, minibatch_starts, table_costs
from aspc.errors import RunError
from aspc.io.table import arrow_scalar, column_numpy, string_column
from aspc.report.stats import kendall_tau, mean_absolute_error


@dataclass
class PlanView:
    """A plan's rows and minibatches as arrays (dispatch order throughout)."""

    name: str  # plan file name, for titles
    metrics: dict[str, Any]  # plan metrics as stored in the file (aspc.emit.metrics names)
    config: dict[str, Any]  # compile configuration stored in the file
    predictor: dict[str, Any]  # predictor identity stored in the file
    minibatch_cost: str  # minibatch cost the metrics and loads use ("padded" | "expected-max")
    prompt_ids: np.ndarray  # object array of str, one per row
    predicted: np.ndarray  # float64 per row: predicted mean response length, tokens
    q10: np.ndarray  # float64 per row: 10th percentile, tokens
    q90: np.ndarray  # float64 per row: 90th percentile, tokens
    n_samples: np.ndarray  # int64 per row, >= 1
    mb_prompts: np.ndarray  # int64 per minibatch: plan rows (prompts)
    mb_sequences: np.ndarray  # int64 per minibatch: sequences = Σ n_samples
    mb_max: np.ndarray  # float64 per minibatch: longest predicted mean, tokens
    mb_padded_fraction: np.ndarray  # float64 per minibatch: 1 - useful / padded token-slots, in [0, 1)
    mb_cost: np.ndarray  # float64 per minibatch: predicted cost, token-slots (minibatch_cost)
    mb_group: np.ndarray  # int64 per minibatch: dispatch group
    group_loads: np.ndarray  # float64 per group: Σ cost of its minibatches, token-slots
    lower_bound: float  # aspc.emit.metrics.load_lower_bound of the groups, token-slots

    @property
    def n_minibatches(self) -> int:
        return int(self.mb_cost.size)

    @property
    def n_groups(self) -> int:
        return int(self.group_loads.size)


def plan_view(plan: Plan, name: str) -> PlanView:
    """Arrays of ``plan`` the figures draw (minibatch costs recomputed from rows)."""
    t = plan.table
    minibatch_cost = plan_cost_model(plan)  # check's, so the figures' loads are the ones check gates
    pred = plan.column(S.PREDICTED_LEN).astype(np.float64)
    nseq = plan.column(S.N_SAMPLES).astype(np.int64)
    starts = minibatch_starts(plan.column(S.MINIBATCH))
    heads = starts[:-1]
    mb_seq = np.add.reduceat(nseq, heads)
    mb_max = np.maximum.reduceat(pred, heads)
    useful = np.add.reduceat(nseq * pred, heads)
    padded = mb_seq * mb_max
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(padded > 0, 1.0 - useful / padded, 0.0)
    costs = table_costs(t, minibatch_cost, plan.metrics.get("response_cap"))
    mb_group = plan.column(S.GROUP).astype(np.int64)[heads]
    loads = np.bincount(mb_group, weights=costs, minlength=int(mb_group.max()) + 1)
    # The bound inspect and check report (with the cardinality term): the figure's imbalance is theirs.
    lb = load_lower_bound(costs, np.bincount(mb_group, minlength=loads.size))
    return PlanView(
        name=name,
        metrics=dict(plan.metrics),
        config=dict(plan.config),
        predictor=dict(plan.predictor),
        minibatch_cost=minibatch_cost,
        prompt_ids=plan.column(S.PROMPT_ID),
        predicted=pred,
        q10=plan.column(S.PREDICTED_Q10).astype(np.float64),
        q90=plan.column(S.PREDICTED_Q90).astype(np.float64),
        n_samples=nseq,
        mb_prompts=np.diff(starts),
        mb_sequences=mb_seq,
        mb_max=mb_max,
        mb_padded_fraction=np.clip(frac, 0.0, 1.0),
        mb_cost=costs,
        mb_group=mb_group,
        group_loads=loads,
        lower_bound=lb,
    )


@dataclass
class RunView:
    """One run log's timeline as arrays (seconds since the run started)."""

    name: str  # label in legends: the run directory's name
    status: str  # meta.json status: complete | running | failed
    meta: dict[str, Any]  # meta.json as read
    # Predicted vs observed, per prompt present in both the plan and the run.
    predicted: np.ndarray  # float64: plan's predicted mean, tokens
    observed: np.ndarray  # float64: mean observed response length of its samples, tokens
    # Samples consumed by a trainer step.
    policy_lag: np.ndarray  # int64 per consumed sample: trainer step - weights version
    # Trainer steps, in step order.
    step_start: np.ndarray  # float64, s
    step_end: np.ndarray  # float64, s
    step_wait: np.ndarray  # float64, s: trainer idle before the step
    # Queue depth after every change.
    queue_time: np.ndarray  # float64, s
    queue_depth: np.ndarray  # int64, samples queued for the trainer
    # Minibatches, as run.
    mb_worker: np.ndarray  # int64
    mb_group: np.ndarray  # int64, plan dispatch group
    mb_dispatch: np.ndarray  # float64, s: handed to the worker; a reload starts here
    mb_start: np.ndarray  # float64, s: generation starts (after any reload)
    mb_end: np.ndarray  # float64, s: longest sequence done
    mb_reload: np.ndarray  # bool: weights reloaded right before it
    extra: dict[str, Any] = field(default_factory=dict)  # report-computed metrics (kendall_tau, length_mae)

    @property
    def iteration_time(self) -> np.ndarray:
        """Seconds between consecutive trainer step ends (step 0: since the run started)."""
        if self.step_end.size == 0:
            return np.empty(0)
        return np.diff(np.r_[0.0, self.step_end])

    @property
    def makespan(self) -> float:
        """Seconds until the last minibatch finished (as the run summary defines it)."""
        return float(self.mb_end.max()) if self.mb_end.size else 0.0

    @property
    def n_workers(self) -> int:
        return int(self.mb_worker.max()) + 1 if self.mb_worker.size else 0


def _np(table: pa.Table, name: str, dtype: Any = None) -> np.ndarray:
    col = table.column(name)
    if col.null_count:
        col = col.fill_null(arrow_scalar(-1, col.type))  # a Python -1 imports pandas, as to_numpy does
    arr = column_numpy(col)
    return arr.astype(dtype) if dtype is not None else arr


def _observed_per_prompt(plan: PlanView, samples: pa.Table) -> tuple[np.ndarray, np.ndarray, bool]:
    """Plan-predicted and observed mean length of every prompt found in both, and whether any id was.

    A rolling scout's rows (ids ending in ``SCOUT_ID_SUFFIX``) are left out, as ``predict train`` and
    ``--history`` leave them: their one response is cut short, and they are no extra prompts. They
    still count as shared with the plan (its scout rows), so a log of only them is not "another plan's".
    """
    if samples.num_rows == 0:
        return np.empty(0), np.empty(0), False
    # group_by imports pandas (through pyarrow.acero); a report, which draws with matplotlib, can bear it.
    agg = samples.group_by("prompt_id").aggregate([("response_len", "mean")])
    ids = agg.column("prompt_id")
    plan_ids = string_column(plan.prompt_ids.tolist())
    # Row of each observed prompt in the plan; -1 for ids the plan lacks.
    pos = column_numpy(pc.index_in(ids, value_set=plan_ids).fill_null(arrow_scalar(-1, pa.int32()))).astype(np.int64)
    obs = column_numpy(agg.column("response_len_mean")).astype(np.float64)
    found = pos >= 0
    scout = column_numpy(pc.ends_with(ids, S.SCOUT_ID_SUFFIX)).astype(bool)
    keep = found & ~scout
    return plan.predicted[pos[keep]], obs[keep], bool(found.any())


def run_view(plan: PlanView, log: Any, name: str) -> RunView:
    """Arrays of a run log (:class:`aspc.runtime.record.runlog.RunLog`) the figures draw.

    Raises
    ------
    RunError
        The run log shares no prompt with the plan (it was produced from
        another plan).
    """
    from aspc.runtime.record import runlog as R

    samples = log.tables[R.SAMPLES]
    mbs = log.tables[R.MINIBATCHES]
    steps = log.tables[R.STEPS].sort_by("step")
    queue = log.tables[R.QUEUE].sort_by("time")
    pred, obs, shared = _observed_per_prompt(plan, samples)
    if samples.num_rows and not shared:
        raise RunError(f"{log.path}: no prompt of this run log is in {plan.name}; pass the plan the run executed")
    lag = _np(samples, "policy_lag", np.int64) if samples.num_rows else np.empty(0, dtype=np.int64)
    view = RunView(
        name=name,
        status=str(log.meta.get("status", "?")),
        meta=dict(log.meta),
        predicted=pred,
        observed=obs,
        policy_lag=lag[lag >= 0],
        step_start=_np(steps, "start", np.float64),
        step_end=_np(steps, "end", np.float64),
        step_wait=_np(steps, "wait", np.float64),
        queue_time=_np(queue, "time", np.float64),
        queue_depth=_np(queue, "depth", np.int64),
        mb_worker=_np(mbs, "worker", np.int64),
        mb_group=_np(mbs, "group", np.int64),
        mb_dispatch=_np(mbs, "dispatch_time", np.float64),
        mb_start=_np(mbs, "start", np.float64),
        mb_end=_np(mbs, "end", np.float64),
        mb_reload=_np(mbs, "reload", bool),
    )
    from aspc.runtime.record.metrics import check_log, summarize_log

    summary = log.meta.get("summary")
    if log.meta.get("status") != "complete" or not isinstance(summary, dict):
        # A failed or interrupted run has no stored summary: recompute it from the parts.
        summary = summarize_log(log).to_dict()
    else:  # its rows are drawn: a damaged time, worker id or lag is refused, as for any other log
        check_log(log)
    view.extra = run_metrics(view, summary)
    return view


def run_metrics(run: RunView, summary: dict[str, Any]) -> dict[str, Any]:
    """The run's metrics table: predictor agreement (computed here) then the run summary.

    ``summary`` is :meth:`aspc.runtime.record.metrics.RunSummary.to_dict` (names as
    ``aspc run`` prints them); nested dicts are flattened to ``outer.inner``
    and lists (per-worker values) left out.
    """
    out: dict[str, Any] = {
        "status": run.status,
        "kendall_tau": kendall_tau(run.predicted, run.observed),
        "length_mae": mean_absolute_error(run.predicted, run.observed),
        "prompts_observed": int(run.observed.size),
    }
    for k, v in summary.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items() if not isinstance(vv, (dict, list))})
        elif not isinstance(v, list) and k not in out:
            out[k] = math.nan if v is None else v
    return out


def run_labels(paths: list[Path]) -> list[str]:
    """Legend labels: each run directory's name, with parents added until they are unique."""
    paths = [Path(p).resolve() for p in paths]
    depth = 1
    while True:
        labels = [str(Path(*p.parts[-depth:])) for p in paths]  # a root part ("/") joins as a path does
        if len(set(labels)) == len(labels) or all(depth >= len(p.parts) for p in paths):
            return labels
        depth += 1
