"""``aspc run PLAN``: execute a plan (default: the simulator) and print its metrics."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from aspc.choices import REPLAN_EVERY
from aspc.cli.backend_options import build_real_components, real_backend_options
from aspc.cli.common import (
    CliError,
    RichProgress,
    emit_json,
    handle_errors,
    json_option,
    note,
    out_console,
    quiet_option,
    rerun_command,
    results_only_on_stdout,
    shell_word,
)
from aspc.cli.options import check_lengths_field
from aspc.cli.paths import PathArg
from aspc.cli.preload import runtime_loading
from aspc.cli.run_epochs import check_epoch_options, epoch_options
from aspc.cli.runtime_options import run_config_from_kwargs, runtime_options
from aspc.errors import ConfigError, Interrupted, OutputError, finding

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


def _refusal(trainer: Any) -> str | None:
    """The trainer's ``resume_refusal()``; ``None`` when it has none or it fails (the message must still come)."""
    try:
        reason = getattr(trainer, "resume_refusal", None)
        out = reason() if callable(reason) else None
    except Exception:
        return None
    return out if isinstance(out, str) and out else None


def _logged_steps(meta_file: Path) -> int | None:
    """Trainer steps the run log of ``meta_file`` committed; ``None`` where it cannot be read."""
    import json

    import pyarrow.parquet as pq

    from aspc.arrow_files import arrow_file
    from aspc.io.runlog_meta import committed, part_ranges

    def rows(part: Path) -> int:
        with arrow_file(part) as f:  # a --log whose name is not UTF-8: pyarrow refused the str path
            return pq.ParquetFile(f).metadata.num_rows

    run_dir = meta_file.parent
    try:
        ranges = part_ranges(json.loads(meta_file.read_text(encoding="utf-8")), run_dir, ValueError)
        parts = committed(sorted((run_dir / "steps").glob("part-*.parquet")), "steps", ranges, run_dir, ValueError)
        return sum(rows(p) for p in parts)
    except (OSError, ValueError, TypeError, AttributeError, RecursionError):  # RecursionError: nested too deep
        return None


def _interrupted_message(
    exc: Interrupted,
    log_dir: Path | None,
    epochs: int = 1,
    refusal: str | None = None,
    started: dict[str, tuple[int, int, int]] | None = None,
    overwrite: bool = False,
) -> str:
    """One line: what the signal did to the run, and the command that continues it.

    ``refusal``: the trainer's ``resume_refusal()``; a log holding trainer
    steps then cannot go on, and the line says to start over instead.
    ``started``: the log's ``meta.json`` files as the command found them (``meta_stamps``); a complete
    log not written since is an earlier run's; under ``overwrite`` so is an earlier run's complete epoch.
    """
    import json

    from aspc.interrupt import signal_name
    from aspc.run_layout import unchanged_since

    name = signal_name(exc.signum)
    if log_dir is None:
        return f"interrupted by {name}; the run had no --log, so there is nothing to resume"
    # The epochs layout (--epochs): the latest epoch's log is the one a signal stopped.
    logs = sorted(log_dir.glob("epoch-*/meta.json"), key=lambda m: int(k) if (k := m.parent.name[6:]).isdigit() else -1)
    scout = log_dir / "scout" / "meta.json"  # --scout: the scout runs before epoch 1
    meta_file = logs[-1] if logs else (scout if scout.is_file() else log_dir / "meta.json")
    # Called as a library (tests): said in words.
    in_words = f"aspc run PLAN <the same options> --log {shell_word(str(log_dir))}"
    cmd, fresh = (rerun_command("run", flag) or f"{in_words} {flag}" for flag in ("--resume", "--overwrite"))
    if not meta_file.is_file():
        if any((log_dir / "plans").glob("epoch-*.parquet")):  # epoch 1's plan was written, its log not begun
            return (f"interrupted by {name} before epoch 1's run log was started; {log_dir} holds its plan: "
                    f"continue it with --resume: {cmd}")  # fmt: skip
        return f"interrupted by {name} before the run log was started; nothing was written to {log_dir}"
    try:
        status = json.loads(meta_file.read_text(encoding="utf-8")).get("status", "?")
    except (OSError, ValueError, AttributeError, RecursionError):  # RecursionError: nested too deep
        status = "?"
    earlier = status == "complete" and overwrite and unchanged_since(meta_file, started)
    if earlier and meta_file.parent != log_dir:
        return (f"interrupted by {name} before the run began; run log {log_dir} still holds the earlier run: "
                f"rerun with --overwrite to replace it: {fresh}")  # fmt: skip
    if status == "complete" and meta_file.parent == log_dir:
        if not unchanged_since(meta_file, started):  # this run completed; the signal cut its close-down short
            return f"interrupted by {name} after the run completed; run log {log_dir} is complete"
        return (f"interrupted by {name} before the run began; run log {log_dir} still holds the earlier, complete "
                f"run: rerun with --overwrite to replace it: {fresh}")  # fmt: skip
    if refusal is not None:  # a complete epoch's steps too: an epochs resume restores them (not so a scout's)
        later_epoch = meta_file.parent.name.startswith("epoch-") and meta_file.parent.name != "epoch-1"
        steps = None if later_epoch else _logged_steps(meta_file)
        if steps != 0:
            held = f"holds {steps} trainer steps" if steps else "holds trainer steps"
            return (f"interrupted by {name}; run log {log_dir} {held}, but {refusal}, so it cannot go on from them: "
                    f"start over with --overwrite: {fresh}")  # fmt: skip
    if status == "complete" and meta_file.parent != log_dir:  # between epochs: the next one never began
        done = "the length scout" if meta_file == scout else f"epoch {meta_file.parent.name[6:]} of {epochs}"
        return (
            f"interrupted by {name} after {done} finished, before the next epoch started; "
            f"run log {log_dir} keeps every finished epoch: continue it with --resume: {cmd}"
        )
    return (
        f"interrupted by {name}; run log {log_dir} is marked {status} and keeps every committed sample: "
        f"continue it with --resume: {cmd}"
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
@click.argument("plan_path", metavar="PLAN", type=PathArg(dir_okay=False, path_type=Path))
@runtime_options
@real_backend_options
@click.option(
    "--actual-lengths",
    type=PathArg(path_type=Path),
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
    help="Seed of the run: lengths drawn from the plan's predictions (sim without --actual-lengths), hf sampling "
    "(per minibatch), vllm sampling (per engine: --seed + worker), the built-in GRPO trainer; epoch k runs "
    "--seed + k - 1.",
)
@click.option(
    "--log",
    "log_dir",
    type=PathArg(file_okay=False, path_type=Path),
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
@click.option(
    "--speed-probe",
    is_flag=True,
    help="Time a fixed reference minibatch (8 sequences x 32 replayed tokens) on every worker before the "
    "first dispatch and after the last; the JSON and the log report it as speed_probe_s, so runs of "
    "different plans can be compared at equal machine speed (hf, vllm; local or Ray engine: on Ray in each "
    "worker's actor).",
)
@epoch_options
@json_option
@quiet_option
@handle_errors
@results_only_on_stdout()
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
    speed_probe: bool,
    epochs: int,
    length_drift: float,
    replan: bool,
    replan_every: int | None,
    scout: bool,
    scout_tokens: int | None,
    scout_keep: bool,
    scout_keep_through: int | None,
    scout_roll: bool,
    scout_windows: int | None,
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
    from aspc.run_layout import meta_stamps

    started = meta_stamps(log_dir)  # a complete log still as found here is an earlier run's (the interrupt message)
    from aspc.emit import read_plan, verify_integrity
    from aspc.emit.check import refuse_rolling_scout_plan
    from aspc.runtime.config import check_log_options

    # Before a real backend resolves its model or a history file is read.
    check_log_options(log_dir, overwrite=overwrite, resume=resume)
    flush_source = click.get_current_context().get_parameter_source("log_flush_seconds")
    defaults = (click.core.ParameterSource.DEFAULT, click.core.ParameterSource.DEFAULT_MAP)
    if log_dir is None and flush_source not in defaults:  # it was silently ignored
        raise ConfigError("--log-flush-seconds sets how often the run log commits: pass --log RUN too, or drop it")
    check_lengths_field(actual_lengths, id_field=True)
    check_epoch_options(epochs, log_dir, length_drift, replan, replan_every, scout, scout_tokens, scout_keep,
                        scout_keep_through, kwargs.get("backend") or "sim", scout_roll=scout_roll,
                        scout_windows=scout_windows)  # fmt: skip
    if log_dir is not None:
        from aspc.guards import check_output

        cost_file = kwargs.get("sim_cost_model")
        check_output(log_dir, inputs=[plan_path, actual_lengths, cost_file], kind="dir", option="--log", resume=resume)
        if resume and not os.path.lexists(log_dir):  # a restart script's first run, or a mistyped path
            note(f"--resume: no run log at {log_dir} yet; this run starts one there", quiet)
    from aspc.run_layout import SINGLE, check_log_layout, clear_run_dir

    layout = check_log_layout(
        log_dir, epochs=epochs != 1 or bool(length_drift) or scout, scout=scout and not scout_roll, resume=resume,
        overwrite=overwrite, n_epochs=epochs if epochs != 1 or length_drift or scout else None,
        scout_roll=scout and scout_roll,
    )
    config, cost = run_config_from_kwargs(
        kwargs,
        seed=seed,
        samples_per_prompt=samples_per_prompt,
        max_retries=max_retries,
        worker_timeout=worker_timeout,
        log_flush_seconds=log_flush_seconds,
        speed_probe=speed_probe,
    )
    trainer = None  # built in the try; a signal before it finds none
    try:
        with runtime_loading(config.backend, plan_path):
            plan = read_plan(plan_path)
        verify_integrity(plan, plan_path.name)  # a plan `aspc check` refuses is not run either
        refuse_rolling_scout_plan(plan, plan_path.name)
        from aspc.cli.run_epochs import epoch_overrides
        from aspc.epoch_staleness import check_epochs_staleness

        # The plans the run compiles as it goes (from a scout, for epochs 2..N): refused before any note,
        # and before a model backend loads.
        check_epochs_staleness(plan, config, epochs=epochs, scout=scout, scout_roll=scout_roll, windows=scout_windows,
                               replan=replan, compile_overrides=epoch_overrides(config))  # fmt: skip
        from aspc.io.history import read_history
        from aspc.runtime.api import run
        from aspc.runtime.config import global_batch_note, staleness_notes

        lengths = None
        if actual_lengths is not None:
            lengths = read_history(actual_lengths, id_field=id_field, length_field=length_field, option="--length-field",
                                   own_id_field=True)  # fmt: skip
        source = None  # what else identifies the lengths file: a --resume names what changed, accepts a copy
        if actual_lengths is not None:
            from aspc.io.history import source_hash

            source = {"sha256": source_hash(actual_lengths), "length_field": length_field, "id_field": id_field}
        backend, trainer, backend_notes = build_real_components(
            kwargs, config, cost, lengths, actual_lengths.name if actual_lengths else ""
        )
        notes = [*global_batch_note(config, plan.table), *staleness_notes(config, plan, check=not scout, replan=replan)]
        for msg in [*backend_notes, *notes]:
            note(msg, quiet)
        if epochs != 1 or length_drift or scout:
            from aspc.cli.run_epochs import run_epochs_cmd

            return run_epochs_cmd(
                plan, epochs, log_dir, config, cost, lengths, actual_lengths, length_drift, replan, replan_every,
                overwrite=overwrite, resume=resume, as_json=as_json, quiet=quiet, backend=backend, trainer=trainer,
                scout=scout, scout_tokens=scout_tokens, scout_keep=scout_keep, scout_keep_through=scout_keep_through,
                scout_roll=scout_roll, scout_windows=scout_windows, lengths_source=source, plan_name=str(plan_path),
            )
        replanner = None
        if replan:
            from aspc.replan import OnlineReplanner, compile_config_of

            cfg = compile_config_of(
                plan.config or {}, workers=config.workers, max_response_length=config.max_new_tokens
            )
            replanner = OnlineReplanner(
                plan.table, cfg, every_steps=replan_every or REPLAN_EVERY, log_dir=log_dir, input_hash=plan.input_hash
            )
        if overwrite and layout not in (None, SINGLE):  # epochs replaced by one run: none of them may survive
            clear_run_dir(log_dir)
        with RichProgress(quiet) as progress:
            result = run(
                plan,
                config=config,
                sim_cost_model=cost,
                actual_lengths=lengths,
                lengths_name=actual_lengths.name if actual_lengths else "",
                lengths_source=source,
                backend=backend,
                trainer=trainer,
                log_dir=log_dir,
                overwrite=overwrite,
                resume=resume,
                replanner=replanner,
                progress=progress,
            )
    except Interrupted as exc:
        refusal = _refusal(trainer)
        raise CliError(_interrupted_message(exc, log_dir, epochs, refusal, started, overwrite), exc.exit_code) from None
    if log_dir is not None:  # the plan's prompt texts let 'aspc predict train RUN' learn from the run
        from aspc.predict.pairs import keep_plan_in_log

        try:
            keep_plan_in_log(plan_path, log_dir)
        except OutputError as exc:  # the log is complete already: its summary stands, the copy can follow
            raise CliError(f"{finding(exc)}; the run itself is complete: fix that, then rerun it with --resume to "
                           "keep the plan in the log (what 'aspc predict train RUN' reads)") from None  # fmt: skip
    for msg in result.notes:
        note(msg, quiet)
    if actual_lengths is not None:
        note(f"lengths: actual, from {actual_lengths.name} (field {length_field!r})", quiet)
    if log_dir is not None:
        note(f"run log written to {log_dir}", quiet)
    summary = result.summary.to_dict()
    if as_json:
        emit_json(summary)
    elif not quiet or log_dir is None:  # without --log the table is the run's only result: --quiet keeps it
        out_console.print(
            summary_table(summary, f"run {plan_path.name} ({config.backend}, W={config.workers})")
        )
