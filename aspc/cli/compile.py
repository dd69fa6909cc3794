"""``aspc compile``: prompts → plan.parquet."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from aspc.cli.common import (
    RichProgress,
    emit_json,
    handle_errors,
    json_option,
    note,
    out_console,
    quiet_option,
    skipped_json,
    skipped_note,
)
from aspc.cli.options import (
    compile_config_from_kwargs,
    compile_options,
    input_options,
    tokenizer_option,
    unused_note,
)
from aspc.cli.paths import PathArg
from aspc.cli.render import metrics_table


@click.command("compile")
@click.argument("input_path", metavar="INPUT", type=PathArg(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=PathArg(path_type=str), required=True, help="Plan file to write.")
@click.option(
    "--workers",
    "-w",
    type=int,
    default=None,
    help="Generation workers the plan will run on; read by --order interleave, which then dispatches very long "
    "minibatches first (--order lpt does so whatever the count).",
)
@input_options
@tokenizer_option
@compile_options
@json_option
@quiet_option
@handle_errors
def compile_cmd(
    input_path: Path, output: str, workers: int | None, as_json: bool, quiet: bool, **kwargs
) -> None:
    """Compile a prompt dataset (JSONL, JSON, CSV, Parquet) into a dispatch plan."""
    from aspc.compiler import compile_file
    from aspc.emit import write_plan
    from aspc.guards import check_compile_config, check_output, check_output_suffix
    from aspc.memory import small_pages_only
    from aspc.predict import default_predictor_path, predictor_path

    small_pages_only()
    inputs, config = compile_config_from_kwargs(kwargs)
    config = dataclasses.replace(config, workers=workers)
    check_compile_config(config)
    for msg in unused_note(config.strategy, config.order):
        note(msg, quiet)
    # The predictor is an input too (the shipped one when none is named and lengths are predicted).
    predictor_dir = None if inputs.length_field is not None else default_predictor_path()
    if config.predictor is not None:
        predictor_dir = predictor_path(config.predictor)
    named = Path(output).name  # as the user wrote it: check_output resolves symlinks
    given = str(output)
    output = check_output(output, inputs=[input_path, *config.history, predictor_dir])
    # After check_output: "is also an input" is the graver thing to say. Written over a dataset of that
    # name, the user's data was replaced by the plan (export refuses so too).
    check_output_suffix(given, "a plan", "Parquet", ".parquet")
    with RichProgress(quiet) as progress:
        plan = compile_file(input_path, inputs, config, progress)
        progress.stage("write")
        write_plan(plan, output)
        progress.done()
    if Path(named).suffix and Path(named).suffix.lower() not in (".parquet", ".pq", ".parq"):
        # A name of another data format is refused above; any other suffix (plan.v2) is the user's, so noted
        # once the plan is written (a failed compile still prints its one line).
        note(f"{named}: a plan is always written as Parquet, whatever its name; name it .parquet to say so", quiet)
    skipped_note(plan.skipped, quiet)
    if plan.token_counter:
        note(f"prompt tokens counted by the {plan.token_counter.get('name', '?')} tokenizer", quiet)
    from aspc.profiles import compile_notes

    for line in compile_notes(plan.metrics, config, plan.predictor):
        note(line, quiet)
    if inputs.length_field is None:
        kind = plan.predictor.get("kind", "?")
        note(f"lengths predicted by the {kind} predictor ({plan.predictor.get('name', config.predictor or 'default')})", quiet)
    if as_json:
        emit_json({"plan": str(output), **plan.metrics, **skipped_json(plan.skipped)})
    elif not quiet:
        out_console.print(metrics_table(plan.metrics, title=f"plan {output.name}"))
