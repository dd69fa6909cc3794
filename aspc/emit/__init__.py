"""Plan schema, Parquet I/O, metrics and checks."""

from __future__ import annotations

import importlib
from typing import Any

# Names load on first use: metrics and checks import Numba (~0.4 s), which a
# large compile imports on a thread while it reads its input (aspc.compiler).
_HOMES = {
    "CheckResult": "check",
    "check_plan": "check",
    "verify_integrity": "check",
    "group_loads": "metrics",
    "plan_metrics": "metrics",
    "Plan": "plan",
    "plan_cost_model": "plan",
    "read_plan": "plan",
    "rows_hash": "plan",
    "write_plan": "plan",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'aspc.emit' has no attribute {name!r}")
    return getattr(importlib.import_module(f"aspc.emit.{home}"), name)
