"""``aspc run PLAN --epochs N``: the multi-epoch branch of ``aspc run`` (thin over :mod:`aspc.epochs`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from aspc.choices import REPLAN_EVERY
from aspc.cli.common import RichProgress, emit_json, note, out_console
from aspc.errors import ConfigError
from aspc.guards import check_number

# The options of the multi-epoch branch, applied to ``aspc run`` (kept here, beside what they drive).
_EPOCH_OPTIONS = [
    click.option(
        "--epochs",
        type=int,
        default=1,
        show_default=True,
        help="Passes over the prompts; each after the first is compiled from the run log so far "
        "(RUN/plans/epoch-K.parquet, logs in RUN/epoch-K/). Needs --log.",
    ),
    click.option(
        "--length-drift",
        type=float,
        default=0.0,
        show_default=True,
        help="Sim with --epochs: epoch k replays lengths scaled by (1+F)^(k-1) (a policy whose responses grow).",
    ),
    click.option(
        "--replan",
        is_flag=True,
        help="Re-plan the undispatched remainder from the lengths returned so far, at windows every "
        "--replan-every trainer steps once 1/16 of the plan was dispatched since the last revision (any "
        "backend); revisions go to RUN/plans/revision-R.parquet.",
    ),
    click.option("--replan-every", type=int, default=None,
                 help=f"With --replan: trainer steps per re-planning window.  [default: {REPLAN_EVERY}]"),  # fmt: skip
    click.option(
        "--scout",
        is_flag=True,
        help="Before the first epoch, a length scout: one response per prompt cut at --scout-tokens, no trainer "
        "step (RUN/scout/); epoch 1 runs the plan compiled from the plan's predictions blended with those "
        "lengths (RUN/plans/epoch-1.parquet). Needs --log.",
    ),
    click.option(
        "--scout-tokens", type=int, default=None, help="The scout's cut T.  [default: --max-new-tokens / 4, or 1024]"
    ),
    click.option(
        "--scout-keep",
        is_flag=True,
        help="Keep each scout response that finished under the cut as its prompt's last sample of epoch 1 "
        "(not generated again; weights version 0, so its policy lag counts from the epoch's start). Sim only.",
    ),
    click.option(
        "--scout-keep-through",
        type=int,
        default=None,
        help="With --scout-keep: keep them only in minibatches dispatched with weights version <= V.  "
        "[default: all; 0 under --max-staleness]",
    ),
    click.option(
        "--scout-roll",
        is_flag=True,
        help="With --scout: scout inside epoch 1, window by window (asp+scout+roll). Window 1 is planned from the "
        "text prior and starts at once; window k+1's scout runs beside window k's rest; each later window's rest is "
        "planned when its scout returns (a revision in "
        "RUN/epoch-1/plans/), and a response that finished under the cut is held as one of its group's samples. "
        "Any backend and engine.",
    ),
    click.option("--scout-windows", type=int, default=None,
                 help="With --scout-roll: windows of prompts.  [default: one per 256 prompts, 1 to 8]"),  # fmt: skip
]


def epoch_options(f: Any) -> Any:
    """``--epochs``, ``--length-drift``, ``--replan``, ``--replan-every``, ``--scout`` and its options."""
    for option in reversed(_EPOCH_OPTIONS):
        f = option(f)
    return f


def check_epoch_options(
    epochs: int, log_dir: Path | None, length_drift: float, replan: bool, replan_every: int | None, scout: bool = False,
    scout_tokens: int | None = None, scout_keep: bool = False, scout_keep_through: int | None = None,
    backend: str = "sim", *, scout_roll: bool = False, scout_windows: int | None = None,
) -> None:  # fmt: skip
    """Usage errors of --epochs, --length-drift, --replan-every and --scout, before any backend loads."""
    if length_drift and epochs < 2:
        raise ConfigError("--length-drift scales the epochs after the first: pass --epochs N with N >= 2")
    from aspc.epochs import check_epoch_count

    check_epoch_count(epochs)  # before --log: '--epochs 0' was told to pass --log, then that 0 is out of range
    if epochs != 1 and log_dir is None:
        raise ConfigError("--epochs writes one plan and one run log per epoch: pass --log RUN")
    if replan_every is not None and not replan:
        raise ConfigError("--replan-every sets how often --replan re-plans: pass --replan too, or drop it")
    check_number("--replan-every", replan_every, lo=1, hi=2**31 - 1, integer=True)
    if scout_tokens is not None and not scout:
        raise ConfigError("--scout-tokens sets the cut of the length scout: pass --scout too, or drop it")
    if scout and log_dir is None:
        raise ConfigError("--scout writes the scout's log and epoch 1's plan: pass --log RUN")
    if scout:
        from aspc.scout import scout_tokens as check_tokens

        check_tokens(None, scout_tokens)
    from aspc.scout import check_keep

    check_keep(scout, scout_keep, scout_keep_through, real=backend != "sim", replan=replan)
    from aspc.rolling_scout import check_roll_run

    check_roll_run(scout, scout_roll, scout_windows, keep=scout_keep, replan=replan)

def epoch_overrides(config: Any) -> dict[str, Any] | None:
    """What the run's later plans change of the plan's compile settings: the response cap of --max-new-tokens."""
    return {"max_response_length": config.max_new_tokens} if config.max_new_tokens else None


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
    replan_every: int | None,
    *,
    overwrite: bool,
    resume: bool,
    as_json: bool,
    quiet: bool,
    backend: Any = None,
    trainer: Any = None,
    scout: bool = False,
    scout_tokens: int | None = None,
    scout_keep: bool = False,
    scout_keep_through: int | None = None,
    scout_roll: bool = False,
    scout_windows: int | None = None,
    lengths_source: dict | None = None,
    plan_name: str = "",
) -> None:
    """Run the epochs, print per-epoch metrics (or ``{"epochs": [...], totals}`` with --json).

    ``backend`` and ``trainer``: the real components ``aspc run`` built (hf, vllm, a user trainer), kept
    open across the epochs (:mod:`aspc.epochs`); ``None`` for the sim. ``lengths_source``: what identifies
    the --actual-lengths file (as a single run records it); ``plan_name``: PLAN's path, for messages.
    """
    from aspc.epochs import run_epochs
    from aspc.rolling_scout import roll_note

    check_epoch_options(epochs, log_dir, length_drift, replan, replan_every, scout, scout_tokens, scout_keep,
                        scout_keep_through, config.backend, scout_roll=scout_roll, scout_windows=scout_windows)  # fmt: skip
    for msg in roll_note(config.max_staleness, scout_roll):
        note(msg, quiet)
    with RichProgress(quiet) as progress:
        res = run_epochs(
            plan,
            epochs,
            log_dir,
            config=config,
            actual_lengths=lengths,
            lengths_source=lengths_source,
            length_drift=length_drift,
            overwrite=overwrite,
            resume=resume,
            compile_overrides=epoch_overrides(config),
            replan_every=(replan_every or REPLAN_EVERY) if replan else None,
            sim_cost_model=cost,
            lengths_name=actual_lengths.name if actual_lengths else "",
            progress=progress,
            backend=backend,
            trainer=trainer,
            scout=scout,
            scout_tokens=scout_tokens,
            scout_keep=scout_keep,
            scout_keep_through=scout_keep_through,
            scout_roll=scout_roll,
            scout_windows=scout_windows,
            plan_name=plan_name,
        )
    out = res.to_dict()
    if as_json:
        emit_json(out)
        return
    note(f"{epochs} {'epoch' if epochs == 1 else 'epochs'}: plans in {log_dir}/plans, run logs in {log_dir}/epoch-K", quiet)
    if not quiet and "scout" in out:
        sc = out["scout"]
        out_console.print(
            f"scout: {sc['responses']} responses cut at {sc['tokens']} tokens ({sc['responses_cut']} cut"
            + (f", {sc['responses_kept']} kept for epoch 1" if "responses_kept" in sc else "")
            + f") in {sc['run_time']:.1f} s, log in {log_dir}/scout"
        )
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
    from aspc.replan import NO_REVISION

    for k, r in enumerate(res.runs, start=1):  # --replan that revised nothing in an epoch says why
        for msg in r.notes:
            if msg.startswith(NO_REVISION):
                note(f"epoch {k}: {msg}", quiet)
