"""``aspc check``: verify a plan's integrity and its metrics against bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from aspc.emit import schema as S
from aspc.emit.metrics import plan_metrics
from aspc.emit.plan import Plan, plan_cost_model, rows_hash
from aspc.errors import PlanError
from aspc.guards import check_number

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


# Metrics a plan file must carry: without them a gate has nothing to compare
# the recomputed values with, and an edit that keeps the structure would pass.
REQUIRED_METRICS = ("padding_ratio", "group_imbalance", "delivery_drift", "n_prompts", "n_sequences", "total_cost")


def refuse_rolling_scout_plan(plan: Plan, name: str = "plan") -> None:
    """Raise PlanError for a rolling scout's epoch-1 plan, which ``aspc run --scout --scout-roll`` writes into its log.

    Its scout rows (ids ending in :data:`~aspc.emit.schema.SCOUT_ID_SUFFIX`,
    one sample each) are work of that run, not prompts: run or exported as
    a plan they became one-sample training groups. ``aspc check`` still
    verifies such a plan's integrity (it runs nothing).
    """
    import pyarrow.compute as pc

    if "scout_roll" in (plan.config or {}) or pc.any(pc.ends_with(plan.table.column(S.PROMPT_ID), S.SCOUT_ID_SUFFIX)).as_py():
        raise PlanError(f"{name}: a rolling scout's plan (aspc run --scout --scout-roll writes it into its run log); "
                        "its scout rows are not prompts: run or export the plan that run started from")  # fmt: skip


def verify_integrity(plan: Plan, name: str = "plan") -> dict[str, Any]:
    """Recompute metrics from rows; raise PlanError when rows and metadata disagree.

    A plan read from a file must carry its rows hash and its metrics: a file
    with either removed is treated as edited (deleting the hash would
    otherwise make every row edit pass). An in-memory plan (``from_file``
    false, e.g. straight from :func:`aspc.compiler.compile_plan`) is checked
    against whatever it carries.
    """
    if plan.from_file:
        if not plan.stored_rows_hash:
            raise PlanError(
                f"{name}: plan has no aspc.rows_hash, so its rows cannot be verified (edited by hand?); "
                "recompile the plan"
            )
        missing = [k for k in REQUIRED_METRICS if k not in plan.metrics]
        if missing:
            raise PlanError(
                f"{name}: plan metadata aspc.metrics lacks {', '.join(missing)} (edited by hand?); recompile the plan"
            )
    if plan.stored_rows_hash and plan.stored_rows_hash != rows_hash(plan.table):
        raise PlanError(f"{name}: rows do not match the plan's metadata (edited by hand?); recompile the plan")
    metrics = plan_metrics(plan.table, plan_cost_model(plan), cap=plan.metrics.get("response_cap"))
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
    """Check integrity, then compare metrics with the given bounds.

    Bounds must be finite and >= 0 (a NaN bound would pass every plan, since
    no comparison with NaN is true).
    """
    for flag, bound in (("--max-imbalance", max_imbalance), ("--max-padding", max_padding), ("--max-drift", max_drift)):
        check_number(flag, bound, lo=0)
    metrics = verify_integrity(plan, name)
    result = CheckResult(metrics=metrics)
    for key, bound in (
        ("group_imbalance", max_imbalance),
        ("padding_ratio", max_padding),
        ("delivery_drift", max_drift),
    ):
        if bound is not None and metrics[key] > bound:
            value, limit = _apart(metrics[key], bound)
            result.violations.append(f"{key} = {value} exceeds bound {limit} by {metrics[key] - bound:.3g}")
    return result


def _apart(value: float, bound: float) -> tuple[str, str]:
    """``value`` and ``bound`` at the fewest significant digits (6 to 15, else in full) that tell them apart.

    At a fixed 6 decimals a value just past its bound printed as smaller than
    it ("0.063479 exceeds bound 0.0634793").
    """
    for digits in range(6, 16):
        a, b = f"{value:.{digits}g}", f"{bound + 0.0:.{digits}g}"  # + 0.0: a bound of -0 reads 0
        if a != b:
            return a, b
    return repr(value), repr(bound + 0.0)
