"""``aspc run PLAN``: execute a plan (default: the simulator) and print its metrics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from aspc.cli.backend_options import build_real_components, real_backend_options
from aspc.cli.common import (
    RichProgress,
    emit_json,
    handle_errors,
    json_option,
    note,
    out_console,
    quiet_option,
)

# Light modules (no numba, pyarrow or torch), so --help stays fast.
from aspc.runtime.config import RETURN_MODES, ReturnMode, RunConfig
from aspc.runtime.registry import BACKENDS, ENGINES, BackendKind, EngineKind

F = Callable[..., Any]


def runtime_options(fn: F, *, cost_model_flags: tuple[str, ...] = ("--cost-model", "--sim-cost-model")) -> F:
    """Options every command that runs a plan takes (``run``, ``simulate``).

    The simulator's coefficients file is ``--cost-model`` (alias
    ``--sim-cost-model``); the compiler's minibatch cost is ``--minibatch-cost``.
    """
    opts = [
        click.option(
            "--backend",
            type=click.Choice(BACKENDS),
            default=BackendKind.SIM.value,
            show_default=True,
            help="Generation backend (sim: discrete-event simulator, no hardware).",
        ),
        click.option(
            "--engine",
            type=click.Choice(ENGINES),
            default=EngineKind.LOCAL.value,
            show_default=True,
            help="Where workers run.",
        ),
        click.option("--workers", "-w", type=int, default=8, show_default=True, help="Generation workers W."),
        click.option(
            "--global-batch", type=int, default=64, show_default=True, help="Samples per trainer step."
        ),
        click.option(
            "--queue-capacity",
            default="auto",
            show_default=True,
            help="Queue high-water mark: samples (512), trainer batches (4b), or auto "
            "(one batch + one largest minibatch per worker).",
        ),
        click.option(
            "--reload-time",
            type=float,
            default=0.5,
            show_default=True,
            help="Seconds a worker spends loading new weights (sim).",
        ),
        click.option(
            "--return-mode",
            type=click.Choice(RETURN_MODES),
            default=ReturnMode.STATIC.value,
            show_default=True,
            help="static: a minibatch returns when its longest sequence ends; continuous: each sequence "
            "as it ends.",
        ),
        click.option(
            "--max-new-tokens", type=int, default=None, help="Cap every response at this many tokens."
        ),
        click.option(
            *cost_model_flags,
            "sim_cost_model",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="JSON of simulator coefficients (as 'aspc calibrate' writes).",
        ),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


_RUNTIME_KEYS = (
    "backend",
    "engine",
    "workers",
    "global_batch",
    "queue_capacity",
    "reload_time",
    "return_mode",
    "max_new_tokens",
)


def run_config_from_kwargs(kwargs: dict[str, Any], **extra: Any) -> tuple[RunConfig, Any]:
    """Pop the runtime options out of a command's kwargs: (RunConfig, SimCostModel)."""
    from aspc.runtime.backends.sim_cost import SimCostModel, load_sim_cost_model

    vals = {k: kwargs.pop(k) for k in _RUNTIME_KEYS if k in kwargs}
    path = kwargs.pop("sim_cost_model", None)
    cost = load_sim_cost_model(path) if path is not None else SimCostModel()
    config = RunConfig(**vals, **extra)
    config.validate()
    return config, cost


_FMT = {
    "mean_iteration_time": "{:.3f} s",
    "p50_iteration_time": "{:.3f} s",
    "p95_iteration_time": "{:.3f} s",
    "steady_iteration_time": "{:.3f} s",
    "iteration_time_trend": "{:.3f}",
    "trainer_wait_fraction": "{:.1%}",
    "worker_busy_fraction": "{:.1%}",
    "worker_reload_fraction": "{:.1%}",
    "tokens_per_s_per_worker": "{:,.0f}",
    "policy_lag_mean": "{:.2f}",
    "makespan": "{:,.1f} s",
    "lower_bound": "{:,.1f} s",
    "makespan_over_lower_bound": "{:.4f}",
    "run_time": "{:,.1f} s",
}
_ROWS = (
    "samples_planned",
    "samples_generated",
    "samples_consumed",
    "samples_left_over",
    "n_trainer_steps",
    "mean_iteration_time",
    "p50_iteration_time",
    "p95_iteration_time",
    "steady_iteration_time",
    "iteration_time_trend",
    "trainer_wait_fraction",
    "worker_busy_fraction",
    "worker_reload_fraction",
    "tokens_per_s_per_worker",
    "policy_lag_mean",
    "policy_lag_max",
    "makespan",
    "lower_bound",
    "makespan_over_lower_bound",
    "run_time",
    "queue_depth_max",
    "queue_capacity",
)


def fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in _FMT:
        return _FMT[key].format(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def summary_table(summary: dict[str, Any], title: str) -> Table:
    t = Table(title=title, header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for key in _ROWS:
        t.add_row(key, fmt(key, summary.get(key)))
    for name, v in summary.get("bubbles", {}).items():
        t.add_row(f"bubble: {name}", "-" if v is None else f"{v:.1%}")
    return t


@click.command("run")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False, path_type=Path))
@runtime_options
@real_backend_options
@click.option(
    "--actual-lengths",
    type=click.Path(path_type=Path),
    default=None,
    help="Dataset (or run log) of real response lengths, joined by prompt id. "
    "Without it the sim draws lengths from the plan's predictions.",
)
@click.option(
    "--length-field",
    default="length",
    show_default=True,
    help="Length field in --actual-lengths (a number or a list: sample i uses the i-th value).",
)
@click.option("--id-field", default="id", show_default=True, help="Prompt id field in --actual-lengths.")
@click.option(
    "--samples-per-prompt",
    "-n",
    type=int,
    default=None,
    help="Samples per prompt, overriding the plan's n_samples.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed for lengths drawn from the plan's predictions.",
)
@click.option(
    "--log",
    "log_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write the run log (Parquet parts) into this new directory.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing aspc run log at --log.")
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the run log at --log after a crash or failure, with the same plan and options: durable "
    "samples and trainer steps are kept, the rest is generated and trained (none twice).",
)
@click.option(
    "--max-retries",
    type=int,
    default=3,
    show_default=True,
    help="Times a minibatch is handed out again after its worker raised, hung or died, before the run stops.",
)
@click.option(
    "--worker-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Abandon a generation call running longer than this (wall-clock backends) and hand its "
    "minibatch to another worker. Default: no limit.",
)
@click.option(
    "--log-flush-seconds",
    type=float,
    default=10.0,
    show_default=True,
    help="Commit finished work to the run log at least this often (wall seconds): what a crash can lose.",
)
@json_option
@quiet_option
@handle_errors
def run_cmd(
    plan_path: Path,
    actual_lengths: Path | None,
    length_field: str,
    id_field: str,
    samples_per_prompt: int | None,
    seed: int,
    log_dir: Path | None,
    overwrite: bool,
    resume: bool,
    max_retries: int,
    worker_timeout: float | None,
    log_flush_seconds: float,
    as_json: bool,
    quiet: bool,
    **kwargs: Any,
) -> None:
    """Execute a plan: dispatcher, bounded queue, workers, trainer, staggered reloads.

    \b
    aspc run plan.parquet                        # simulate, lengths drawn from the plan
    aspc run plan.parquet --actual-lengths in.jsonl --length-field lengths \\
        --workers 8 --global-batch 64 --log RUN --json
    aspc run plan.parquet ...same options... --log RUN --resume   # after a crash
    """
    from aspc.emit import read_plan
    from aspc.io.history import read_history
    from aspc.runtime.api import run
    from aspc.runtime.record.resume import check_log_options

    # Before a real backend resolves its model or a history file is read.
    check_log_options(log_dir, overwrite=overwrite, resume=resume)
    config, cost = run_config_from_kwargs(
        kwargs,
        seed=seed,
        samples_per_prompt=samples_per_prompt,
        max_retries=max_retries,
        worker_timeout=worker_timeout,
        log_flush_seconds=log_flush_seconds,
    )
    plan = read_plan(plan_path)
    lengths = None
    if actual_lengths is not None:
        lengths = read_history(actual_lengths, id_field=id_field, length_field=length_field)
    backend, trainer, backend_notes = build_real_components(
        kwargs, config, cost, lengths, actual_lengths.name if actual_lengths else ""
    )
    for msg in backend_notes:
        note(msg, quiet)
    with RichProgress(quiet) as progress:
        result = run(
            plan,
            config=config,
            sim_cost_model=cost,
            actual_lengths=lengths,
            lengths_name=actual_lengths.name if actual_lengths else "",
            backend=backend,
            trainer=trainer,
            log_dir=log_dir,
            overwrite=overwrite,
            resume=resume,
            progress=progress,
        )
    for msg in result.notes:
        note(msg, quiet)
    if actual_lengths is not None:
        note(f"lengths: actual, from {actual_lengths.name} (field {length_field!r})", quiet)
    if log_dir is not None:
        note(f"run log written to {log_dir}", quiet)
    summary = result.summary.to_dict()
    if as_json:
        emit_json(summary)
    elif not quiet:
        out_console.print(
            summary_table(summary, f"run {plan_path.name} ({config.backend}, W={config.workers})")
        )
