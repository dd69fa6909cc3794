"""What makes a run log resumable: the run's identity in ``meta.json``, and the checks before continuing it.

``aspc run --resume`` continues a log only with the plan and configuration
that wrote it (all but the operational options, which change how a run copes,
not what it computes). The identity is a hash of what the run generates
(:func:`work_hash`), the plan's hashes, the configuration record and the
simulator's cost model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from aspc.errors import ConfigError
from aspc.runtime.config import OPERATIONAL_KEYS, ReturnMode, RunConfig
from aspc.runtime.record.metrics import RunSummary, summarize_log
from aspc.runtime.record.runlog import read_run_log, to_columns
from aspc.runtime.work import WorkPlan


def check_log_options(log_dir: str | os.PathLike | None, *, overwrite: bool, resume: bool) -> None:
    """Raise :class:`ConfigError` for ``--resume`` without ``--log``, or with ``--overwrite``."""
    if resume and log_dir is None:
        raise ConfigError("--resume continues a run log: pass the run's --log directory")
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; pass one of them")


def work_hash(work: WorkPlan) -> str:
    """Hash of what a run generates: prompt ids, minibatch boundaries, samples per prompt."""
    h = hashlib.sha256()
    h.update("\x00".join(str(p) for p in work.prompt_ids.tolist()).encode())
    h.update(np.ascontiguousarray(work.row_offsets, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(work.n_samples, dtype=np.int64).tobytes())
    return h.hexdigest()


def config_record(config: RunConfig) -> dict[str, Any]:
    """``config`` as ``meta.json`` stores it."""
    d = dataclasses.asdict(config)
    d["return_mode"] = ReturnMode(config.return_mode).value
    return d


def check_resumable(path: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` unless the log at ``path`` ran this plan with this configuration."""
    diffs = []
    if (old.get("run") or {}).get("work_hash") != new["run"]["work_hash"]:
        diffs.append("the plan (prompts, minibatches or samples per prompt)")
    for key in ("input_hash", "rows_hash"):
        a, b = (old.get("plan") or {}).get(key), new["plan"].get(key)
        if a and b and a != b:
            diffs.append(f"the plan's {key}")
            break
    oc, nc = old.get("config") or {}, new["config"]
    diffs += [
        f"--{k.replace('_', '-')} ({oc.get(k)!r} in the log, {nc.get(k)!r} now)"
        for k in sorted(set(oc) | set(nc))
        if k not in OPERATIONAL_KEYS and oc.get(k) != nc.get(k)
    ]
    if (old.get("cost_model") or {}) != new["cost_model"]:
        diffs.append("the cost model")
    old_len = (old.get("run") or {}).get("lengths_name")
    if old_len != new["run"]["lengths_name"]:
        diffs.append(f"--actual-lengths ({old_len!r} in the log, {new['run']['lengths_name']!r} now)")
    if diffs:
        raise ConfigError(
            f"--resume {path}: this run differs from the logged one in {'; '.join(diffs)}; "
            "resume with the original options, or start a new run"
        )


def completed_run(path: Path) -> tuple[RunSummary, dict[str, dict[str, np.ndarray]]]:
    """The summary and every column of the complete run log at ``path``."""
    log = read_run_log(path)
    return summarize_log(log), {k: to_columns(t) for k, t in log.tables.items()}
