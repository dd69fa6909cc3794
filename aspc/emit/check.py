"""``aspc check``: verify a plan's integrity and its metrics against bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from aspc.emit.metrics import plan_metrics
from aspc.emit.plan import Plan, rows_hash
from aspc.errors import PlanError

# Stored and recomputed metrics must agree to this relative tolerance; they
# come from the same code, so any larger gap means the rows were edited.
_REL_TOL = 1e-9


@dataclass
class CheckResult:
    metrics: dict[str, Any]  # recomputed from the rows
    violations: list[str] = field(default_factory=list)  # one line per bound exceeded

    @property
    def ok(self) -> bool:
        return not self.violations


def verify_integrity(plan: Plan, name: str = "plan") -> dict[str, Any]:
    """Recompute metrics from rows; raise PlanError when rows and metadata disagree."""
    if plan.stored_rows_hash and plan.stored_rows_hash != rows_hash(plan.table):
        raise PlanError(f"{name}: rows do not match the plan's metadata (edited by hand?); recompile the plan")
    # Plans record it as metrics["cost_model"]; older ones only in their config.
    cfg = plan.config
    minibatch_cost = plan.metrics.get("cost_model") or cfg.get("minibatch_cost") or cfg.get("cost_model") or "padded"
    metrics = plan_metrics(plan.table, minibatch_cost, cap=plan.metrics.get("response_cap"))
    for key, value in plan.metrics.items():
        if key not in metrics:
            continue
        got = metrics[key]
        if isinstance(value, (int, float)) and isinstance(got, (int, float)):
            if not math.isclose(float(value), float(got), rel_tol=_REL_TOL, abs_tol=1e-12):
                raise PlanError(
                    f"{name}: stored {key}={value:.6g} but the rows give {got:.6g}; the plan was edited, recompile it"
                )
        elif value != got:
            raise PlanError(f"{name}: stored {key}={value!r} but the rows give {got!r}; recompile the plan")
    return metrics


def check_plan(
    plan: Plan,
    *,
    max_imbalance: float | None = None,
    max_padding: float | None = None,
    max_drift: float | None = None,
    name: str = "plan",
) -> CheckResult:
    """Check integrity, then compare metrics with the given bounds."""
    metrics = verify_integrity(plan, name)
    result = CheckResult(metrics=metrics)
    for key, bound in (
        ("group_imbalance", max_imbalance),
        ("padding_ratio", max_padding),
        ("delivery_drift", max_drift),
    ):
        if bound is not None and metrics[key] > bound:
            result.violations.append(f"{key} = {metrics[key]:.6f} exceeds bound {bound:g} by {metrics[key] - bound:.6f}")
    return result
