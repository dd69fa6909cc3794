"""Execute a plan: dispatcher, bounded queue, workers, trainer, staggered reloads.

The runtime is layered; imports point down only:

- contracts (:mod:`.contracts`, :mod:`.config`, :mod:`.work`, :mod:`.lengths`);
- the core (:mod:`.core`: scheduler, engine events, the drive loop);
- engines, backends and trainers (:mod:`.engines`, :mod:`.backends`,
  :mod:`.trainers`), built by name in :mod:`.registry` only;
- recording (:mod:`.record`: recorder, run log, resume, metrics);
- the API (:mod:`.api`: :func:`run`), and :mod:`.calibrate`.

This package face only re-exports. Each name is imported on first use
(PEP 562), so ``import aspc.runtime.core.scheduler`` loads neither numba
nor pyarrow, and ``from aspc.runtime import run`` still works.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> module that defines it.
_EXPORTS = {
    "BACKENDS": "aspc.runtime.registry",
    "ENGINES": "aspc.runtime.registry",
    "RETURN_MODES": "aspc.runtime.config",
    "BackendContext": "aspc.runtime.contracts",
    "BackendKind": "aspc.runtime.registry",
    "Clock": "aspc.runtime.contracts",
    "Engine": "aspc.runtime.core.events",
    "EngineKind": "aspc.runtime.registry",
    "GenerationBackend": "aspc.runtime.contracts",
    "GenerationResult": "aspc.runtime.contracts",
    "MinibatchWork": "aspc.runtime.work",
    "ReturnMode": "aspc.runtime.config",
    "RunConfig": "aspc.runtime.config",
    "RunLog": "aspc.runtime.record.runlog",
    "RunResult": "aspc.runtime.api",
    "RunSummary": "aspc.runtime.record.metrics",
    "SampleLengths": "aspc.runtime.lengths",
    "Scheduler": "aspc.runtime.core.scheduler",
    "SimCostModel": "aspc.runtime.backends.sim_cost",
    "TrainBatch": "aspc.runtime.contracts",
    "TrainResult": "aspc.runtime.contracts",
    "Trainer": "aspc.runtime.contracts",
    "WorkPlan": "aspc.runtime.work",
    "load_sim_cost_model": "aspc.runtime.backends.sim_cost",
    "read_run_log": "aspc.runtime.record.runlog",
    "run": "aspc.runtime.api",
    "summarize_log": "aspc.runtime.record.metrics",
    "work_from_table": "aspc.runtime.work",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'aspc.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

