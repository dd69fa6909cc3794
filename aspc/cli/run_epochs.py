"""``aspc run PLAN --epochs N``: the multi-epoch branch of ``aspc run`` (thin over :mod:`aspc.epochs`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aspc.cli.common import RichProgress, emit_json, note, out_console
from aspc.errors import ConfigError


def check_epoch_options(epochs: int, log_dir: Path | None, length_drift: float, replan: bool, replan_every: int) -> None:
    """Usage errors of --epochs, --length-drift and --replan-every, before any backend loads."""
    if length_drift and epochs < 2:
        raise ConfigError("--length-drift scales the epochs after the first: pass --epochs N with N >= 2")
    if epochs != 1 and log_dir is None:
        raise ConfigError("--epochs writes one plan and one run log per epoch: pass --log RUN")
    if replan and replan_every < 1:
        raise ConfigError(f"--replan-every must be >= 1, got {replan_every}")

def run_epochs_cmd(
    plan: Any,
    epochs: int,
    log_dir: Path | None,
    config: Any,
    cost: Any,
    lengths: dict | None,
    actual_lengths: Path | None,
    length_drift: float,
    replan: bool,
    replan_every: int,
    *,
    overwrite: bool,
    resume: bool,
    as_json: bool,
    quiet: bool,
    backend: Any = None,
    trainer: Any = None,
) -> None:
    """Run the epochs, print per-epoch metrics (or ``{"epochs": [...], totals}`` with --json).

    ``backend`` and ``trainer``: the real components ``aspc run`` built (hf, vllm, a user trainer), kept
    open across the epochs (:mod:`aspc.epochs`); ``None`` for the sim.
    """
    from aspc.epochs import run_epochs

    check_epoch_options(epochs, log_dir, length_drift, replan, replan_every)
    with RichProgress(quiet) as progress:
        res = run_epochs(
            plan,
            epochs,
            log_dir,
            config=config,
            actual_lengths=lengths,
            length_drift=length_drift,
            overwrite=overwrite,
            resume=resume,
            compile_overrides={"max_response_length": config.max_new_tokens} if config.max_new_tokens else None,
            replan_every=replan_every if replan else None,
            sim_cost_model=cost,
            lengths_name=actual_lengths.name if actual_lengths else "",
            progress=progress,
            backend=backend,
            trainer=trainer,
        )
    out = res.to_dict()
    if as_json:
        emit_json(out)
        return
    note(f"{epochs} epochs: plans in {log_dir}/plans, run logs in {log_dir}/epoch-K", quiet)
    if not quiet:
        for d in out["epochs"]:
            out_console.print(
                f"epoch {d['epoch']}: mean iteration {d['mean_iteration_time']:.3f} s, "
                f"{d['n_trainer_steps']} steps, makespan/LB {d['makespan_over_lower_bound']:.4f}, "
                f"policy lag max {d['policy_lag_max']}"
            )
        out_console.print(
            f"total: {out['n_trainer_steps']} steps in {out['run_time']:.1f} s "
            f"(mean iteration {out['mean_iteration_time']:.3f} s)"
        )
