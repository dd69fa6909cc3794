"""Plan schema, Parquet I/O, metrics and checks."""

from aspc.emit.check import CheckResult, check_plan, verify_integrity
from aspc.emit.metrics import group_loads, plan_metrics
from aspc.emit.plan import Plan, read_plan, rows_hash, write_plan

__all__ = [
    "CheckResult",
    "Plan",
    "check_plan",
    "group_loads",
    "plan_metrics",
    "read_plan",
    "rows_hash",
    "verify_integrity",
    "write_plan",
]
