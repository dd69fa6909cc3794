"""``aspc simulate INPUT``: compile with several strategies, simulate each, one table."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from aspc.choices import BOUNDED_ORDER
from aspc.cli.common import (
    RichProgress,
    emit_json,
    handle_errors,
    json_option,
    note,
    quiet_option,
    skipped_json,
    skipped_note,
)
from aspc.cli.common import out_console as _out
from aspc.cli.options import compile_config_from_kwargs, compile_options, input_options, tokenizer_option, unused_note
from aspc.cli.paths import PathArg
from aspc.cli.runtime_options import refuse_real_backend, run_config_from_kwargs, runtime_options


def _f(v: Any, spec: str) -> str:
    return "-" if v is None else spec.format(v)


def _pm(d: dict[str, Any], key: str, spec: str) -> str:
    """``mean ± std`` over repeats when there are repeats, else the value."""
    rep = (d.get("repeats") or {}).get(key)
    if rep is None:
        return _f(d.get(key), spec)
    return f"{spec.format(rep['mean'])} ± {spec.format(rep['std'])}"


def comparison_rich(table: dict[str, dict[str, Any]], title: str) -> Table:
    t = Table(title=title, header_style="bold")
    t.add_column("strategy", no_wrap=True, min_width=8)
    for col in (
        "mean iter s",
        "vs random",
        "steady iter s",
        "vs random ",
        "trend q4/q1",
        "trainer wait",
        "lag mean",
        "lag max",
        "makespan/LB",
    ):
        t.add_column(col, justify="right")
    for name, d in table.items():
        t.add_row(
            name,
            _pm(d, "mean_iteration_time", "{:.3f}"),
            _pm(d, "mean_iteration_time_vs_random", "{:.3f}"),
            _pm(d, "steady_iteration_time", "{:.3f}"),
            _pm(d, "steady_iteration_time_vs_random", "{:.3f}"),
            _f(d.get("iteration_time_trend"), "{:.3f}"),
            _f(d.get("trainer_wait_fraction"), "{:.1%}"),
            _f(d.get("policy_lag_mean"), "{:.2f}"),
            _f(d.get("policy_lag_max"), "{}"),
            _pm(d, "makespan_over_lower_bound", "{:.4f}"),
        )
    return t


@click.command("simulate")
@click.argument("input_path", metavar="INPUT", type=PathArg(dir_okay=False, path_type=Path))
@click.option(
    "--strategies",
    default="random,sorted,asp,oracle",
    show_default=True,
    help="Comma list of strategies: random, sorted, asp, asp+replan (re-planned during the run), "
    "asp+scout (asp planned from a length scout run first: one response per prompt cut at --scout-tokens, "
    "its time included), asp+scout+keep (the same, each scout response that finished under the cut kept as "
    "its prompt's last sample, not generated again), asp+scout+roll (the scout in --scout-windows windows inside "
    "the run: the first window planned from the text prior, each later window's scout ahead of the previous "
    "window's rest, finished responses kept the same "
    "way: a kept sample is a window or two old, not an epoch), oracle (asp knowing each prompt's recorded lengths), "
    "oracle-exact (the very lengths replayed).",
)
@click.option(
    "--scout-tokens",
    type=int,
    default=None,
    help="asp+scout, asp+scout+keep, asp+scout+roll: cut each scout response at this many tokens "
    "[default: --max-new-tokens / 4, or 1024].",
)
@click.option(
    "--scout-keep-through",
    type=int,
    default=None,
    help="asp+scout+keep: keep a scout response only in minibatches dispatched with weights version <= V "
    "(later ones generate it afresh): bounds how much older than its group a kept sample is "
    "[default: keep every finished one; 0 under --max-staleness].",
)
@click.option(
    "--scout-windows",
    type=int,
    default=None,
    help="asp+scout+roll: split the prompts into this many seeded windows; the first is planned from the text "
    "prior and dispatched at once, each later one scouted inside the run [default: one per 256 prompts, 1 to 8].",
)
@click.option(
    "--repeats",
    type=int,
    default=1,
    show_default=True,
    help="Simulate seeds seed..seed+R-1 (random baseline, annealer; repeats after the first also draw which "
    "recorded lengths are replayed, so repeat 0 is the single run). Ratios are shown as mean ± std; --json holds "
    "each field's mean over the repeats (the max for *_max fields).",
)
@input_options
# No --strategy here: --strategies names them all, and a --strategy beside it
# used to be accepted and silently ignored.
@functools.partial(compile_options, with_strategy=False)
@tokenizer_option
@functools.partial(runtime_options, sim_only=True)
@click.option(
    "--actual-lengths",
    type=PathArg(path_type=Path),
    default=None,
    help="Separate dataset (or run log) of real lengths; default: --length-field of INPUT.",
)
@json_option
@quiet_option
@handle_errors
def simulate_cmd(
    input_path: Path,
    strategies: str,
    repeats: int,
    scout_tokens: int | None,
    scout_keep_through: int | None,
    scout_windows: int | None,
    actual_lengths: Path | None,
    as_json: bool,
    quiet: bool,
    **kwargs: Any,
) -> None:
    """Compile INPUT with each strategy and simulate every plan on the same real lengths.

    \b
    aspc simulate in.jsonl --length-field lengths --samples-per-prompt 4 \\
        --workers 8 --global-batch 64 --seed 0 --strategies random,sorted,asp,oracle --json
    """
    from aspc.memory import small_pages_only
    from aspc.simulate import comparison_table, parse_strategies, simulate_strategies
    from aspc.simulate_compare import left_over_note

    small_pages_only()  # simulated workers only: no model runs in this process
    refuse_real_backend(kwargs, "simulate")
    names = parse_strategies(strategies)
    order_asked = kwargs.get("order") is not None
    inputs, config = compile_config_from_kwargs(kwargs)
    if config.predictor is not None:
        from aspc.predict import predictor_path

        predictor_path(config.predictor)  # 'default' beside a ./default directory is refused, as by compile
    # One seed for everything: the compile options' --seed also seeds the run.
    run_config, cost = run_config_from_kwargs(kwargs, seed=config.seed)
    # Plans are compiled for the workers they will run on (makespan-aware order), and for the run's bound.
    config = dataclasses.replace(config, workers=run_config.workers)
    if run_config.max_staleness is not None and not order_asked:
        config = dataclasses.replace(config, order=BOUNDED_ORDER)
    # Every asp-family strategy compiles as asp; only when none runs are asp's own options unread.
    baselines = [n for n in names if n in ("random", "sorted")]  # the rest plan as asp
    if len(baselines) == len(names):
        who = f"--strategies {','.join(names)} {'cuts' if len(names) == 1 else 'each cut'}"
        unused = unused_note(names[0], config.order, who)
    else:
        bound = run_config.max_staleness is not None and not order_asked
        unused = unused_note("asp", config.order, implied=f"under --max-staleness {run_config.max_staleness}" if bound else None)
    for msg in unused:
        note(msg, quiet)
    skipped: list[Any] = []
    selected: dict[str, Any] = {}
    with RichProgress(quiet) as progress:
        results = simulate_strategies(
            input_path,
            inputs,
            config,
            run_config,
            strategies=names,
            sim_cost_model=cost,
            actual_lengths_path=actual_lengths,
            repeats=repeats,
            scout_tokens=scout_tokens,
            keep_through=scout_keep_through,
            scout_windows=scout_windows,
            progress=progress,
            skipped=skipped,
            selected=selected,
        )
    skipped_note(skipped, quiet)
    from aspc.profiles import simulate_selection_notes

    for msg in simulate_selection_notes(selected, config):
        note(msg, quiet)
    table = comparison_table(results)
    planned = min((r[0] if isinstance(r, list) else r).summary.samples_planned for r in results.values())
    if run_config.global_batch > planned:  # as aspc run says it: a table of '-' must not read as a result
        note(f"--global-batch {run_config.global_batch} is more than the plans' {planned} samples: the trainer "
             f"takes no step and no iteration time is measured; pass --global-batch {planned} or less", quiet)  # fmt: skip
    leftover = left_over_note(results, run_config.global_batch)
    if leftover is not None and run_config.global_batch <= planned:
        note(leftover, quiet)
    if as_json:
        left_out = {k: selected[k] for k in ("n_excluded_overlong", "n_excluded_remainder") if k in selected}
        emit_json({"strategies": table, "n_skipped": len(skipped), **skipped_json(skipped), **left_out})
    else:  # the table is the result: --quiet drops diagnostics and bars, not it
        _out.print(
            comparison_rich(
                table,
                f"simulate {input_path.name} (W={run_config.workers}, "
                f"global batch {run_config.global_batch}"
                + (f", {repeats} repeats: mean ± std)" if repeats > 1 else ")"),
            )
        )
        from aspc.replan import NO_REVISION
        from aspc.rolling_scout import roll_note

        for msg in roll_note(run_config.max_staleness, "asp+scout+roll" in results):
            note(msg, quiet)
        replanned = results.get("asp+replan")  # one run, or one per repeat: the first says why if none revised
        first = replanned[0] if isinstance(replanned, list) else replanned
        for msg in first.notes if first is not None else []:
            if msg.startswith(NO_REVISION):
                note(f"asp+replan: {msg}", quiet)
        if run_config.max_staleness is not None and not order_asked and len(baselines) < len(names):
            note(f"asp planned for --max-staleness {run_config.max_staleness}: equal minibatches, shortest first "
                 "(--order ascending; --order lpt for the unbounded order)", quiet)  # fmt: skip
