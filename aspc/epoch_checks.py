"""Checks an epochs run (:mod:`aspc.epochs`) makes before it writes: stored plans, epoch logs, lengths files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from aspc.emit import schema as S
from aspc.emit.plan import Plan
from aspc.epoch_predict import epoch_lengths
from aspc.errors import ConfigError


def check_lengths_cover(plan: Plan, sources: list[tuple[dict[str, np.ndarray] | None, str]], n: int, drift: float) -> None:
    """Raise as epoch 1's run would (a prompt without a length, a bad one) for each (lengths, name) given.

    Epoch 1 joins its lengths only once it starts, after its plan is written: a wrong
    lengths file left ``plans/epoch-1.parquet`` behind, and the corrected command was then refused.
    """
    from aspc.runtime.lengths import join_actual_lengths
    from aspc.runtime.work import work_from_table

    work = None
    for lengths, name in sources:
        if lengths is not None:
            work = work or work_from_table(plan.table)
            join_actual_lengths(work, epoch_lengths(lengths, 1, n, drift), source_name=name)


def check_stored_plan(plan: Plan, path: Path, epoch: int, plan_name: str = "", *, given: bool = False) -> Plan:
    """The plan stored at ``path`` to resume: ``plan`` itself, or the stored one where an earlier aspc compiled
    the same schedule (rows hash intact, same configuration, same rows but the last bits of predictions).

    Raise :class:`ConfigError` otherwise; ``given``: ``plan`` is PLAN.
    """
    from aspc.emit.plan import as_stored, read_plan, rows_hash
    from aspc.errors import PlanError, finding

    try:
        stored = read_plan(path)
    except PlanError as exc:
        # Not the reader's advice: an epoch's plan is compiled by the run.
        raise ConfigError(f"cannot resume epoch {epoch}: {finding(exc)}; delete it (the resume compiles it again from the "
                          "run logs) or pass --overwrite to start the epochs again") from None  # fmt: skip
    same_rows = stored.stored_rows_hash == rows_hash(plan.table.cast(S.PLAN_SCHEMA))
    want = as_stored(plan.config)
    if not same_rows and stored.config == want and _same_schedule(stored, plan):
        return stored  # what the epoch's log ran (an aspc before 2026-12-07 summed predictions in another order)
    if not (same_rows and stored.config == want):
        old_n, n = stored.config.get("samples_per_prompt"), want.get("samples_per_prompt")
        if not given and epoch > 1 and old_n == 1 != n and {**stored.config, "samples_per_prompt": n} == want:
            # Not edited: an aspc before 2026-12-06 compiled every epoch after the first for one sample per prompt.
            raise ConfigError(f"{path}: compiled for 1 sample per prompt, as aspc did for epochs after the first "
                              f"before 2026-12-06 (this one compiles them for the run's {n}); finish the run with the "
                              "aspc that started it, or pass --overwrite to start the epochs again")  # fmt: skip
        named = f"PLAN {plan_name}" if plan_name else "the given plan"
        what = (f"epoch 1 ran another plan than {named} (or {path.name} was edited)" if given else
                f"not the plan epoch {epoch} compiles from {named} and the run logs before it (edited, or another "
                "PLAN or other options)")  # fmt: skip
        raise ConfigError(f"{path}: {what}; resume with the PLAN and options the run started with, or pass "
                          "--overwrite to start the epochs again")  # fmt: skip
    return plan


_PREDICTED = (S.PREDICTED_LEN, S.PREDICTED_Q10, S.PREDICTED_Q50, S.PREDICTED_Q90)


def _same_schedule(stored: Plan, plan: Plan) -> bool:
    """``stored`` is intact (its rows hash verifies) and holds ``plan``'s rows, predictions equal to 1e-9."""
    from aspc.emit.plan import rows_hash

    a, b = stored.table.cast(S.PLAN_SCHEMA), plan.table.cast(S.PLAN_SCHEMA)
    if a.num_rows != b.num_rows or stored.stored_rows_hash != rows_hash(a):
        return False
    if not a.drop_columns(list(_PREDICTED)).equals(b.drop_columns(list(_PREDICTED))):
        return False
    return all(np.allclose(a.column(c).to_numpy(), b.column(c).to_numpy(), rtol=1e-9, atol=0.0) for c in _PREDICTED)


def check_epoch_logs(root: Path, n_epochs: int, drift: float | None) -> None:
    """Refuse a resume an epoch's log cannot take: no ``meta.json``, or another ``drift`` (None: not compared).

    Logs from before the record of ``--length-drift`` carry none and are not compared.
    """
    from aspc.errors import AspcError
    from aspc.runtime.record.runlog import is_run_log, never_started, read_meta

    for name in ["scout", *(f"epoch-{k}" for k in range(1, n_epochs + 1))]:
        d = root / name
        if d.is_dir() and not is_run_log(d) and not never_started(d):
            fix = ("pass --overwrite to start the run again" if name == "scout" else
                   f"delete {d} to run epoch {name[6:]} again, or pass --overwrite to start the epochs again")  # fmt: skip
            raise ConfigError(f"--log {root}: {d} holds files but no meta.json, so its log cannot be resumed; {fix}")
        try:
            run_info = read_meta(d).get("run") if drift is not None and is_run_log(d) else None
        except AspcError:  # damaged: that log's own resume says so
            continue
        source = run_info.get("lengths_file") if isinstance(run_info, dict) else None
        old = source.get("length_drift") if isinstance(source, dict) else None
        if isinstance(old, (int, float)) and float(old) != drift:
            raise ConfigError(f"--resume {root}: its epochs replay lengths with --length-drift {float(old)!r}, this run "
                              f"with {float(drift)!r}; resume with --length-drift {float(old)!r}, or start a new run "
                              "with --overwrite")  # fmt: skip


def check_scout_part_of(root: Path, part_of: dict[str, Any]) -> None:
    """Refuse a resume of a ``--scout`` run stopped before epoch 1's log began, given other options.

    The scout's own log records the scout's config (its own global batch, no keep), so its resume
    compared nothing the epochs use: the options of the whole run (``part_of``, recorded in the scout's
    ``meta.json``) are compared here. Once epoch 1's log exists, its own checks say what differs.
    Logs from before the record carry none and are not compared.
    """
    from aspc.errors import AspcError
    from aspc.runtime.record.runlog import is_run_log, read_meta

    if not is_run_log(root / "scout") or is_run_log(root / "epoch-1"):
        return
    try:
        was = (read_meta(root / "scout").get("run") or {}).get("part_of")
    except AspcError:  # damaged: the scout's own resume says so
        return
    if not isinstance(was, dict) or was == part_of:
        return
    from aspc.runtime.config import capacity_spelling

    def same(k: str) -> bool:  # "AUTO" for a logged "auto" is the same queue
        a, b = was.get(k), part_of.get(k)
        return a == b or (k == "queue_capacity" and capacity_spelling(a) == capacity_spelling(b))

    diffs = [f"--{k.replace('_', '-')} ({was.get(k)!r} in the log, {part_of.get(k)!r} now)"
             for k in sorted(set(was) | set(part_of)) if not same(k)]  # fmt: skip
    if not diffs:
        return
    raise ConfigError(f"--resume {root}: this run differs from the logged one in {'; '.join(diffs)}; resume with "
                      "the original options, or start a new run")  # fmt: skip
