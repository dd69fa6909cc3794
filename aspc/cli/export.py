"""``aspc export``: a plan's prompts in dispatch order, as a verl dataset or JSONL."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from aspc.choices import EXPORT_FORMATS
from aspc.cli.common import RichProgress, emit_json, err_console, handle_errors, json_option, out_console, quiet_option
from aspc.cli.paths import PathArg
from aspc.errors import ConfigError


@click.command("export")
@click.argument("plan_path", metavar="PLAN", type=PathArg(dir_okay=False, path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(EXPORT_FORMATS),
    default="verl",
    show_default=True,
    help="verl: Parquet with a chat 'prompt' column; jsonl: one JSON record per line.",
)
@click.option("-o", "--output", type=PathArg(path_type=str), required=True, help="File to write.")
@click.option(
    "--data-source",
    default=None,
    help="Replace the data_source column (verl picks the reward function by it). "
    "[default: the dataset's own, else 'aspc']",
)
@click.option(
    "--source",
    type=PathArg(dir_okay=False, path_type=Path),
    default=None,
    help="The dataset the plan was compiled from. [default: found next to the plan or in the working "
    "directory by the hash the plan records]",
)
@click.option("--no-source", is_flag=True, help="Export aspc's columns only, without the dataset's.")
@json_option
@quiet_option
@handle_errors
def export_cmd(
    plan_path: Path,
    fmt: str,
    output: str | Path,
    data_source: str | None,
    source: Path | None,
    no_source: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Write PLAN's prompts, one row per plan row in dispatch order, for a trainer.

    Every column of the dataset the plan was compiled from passes through
    unchanged (data_source, prompt, ability, reward_model, extra_info, ...);
    aspc's schedule goes under extra_info["aspc"] (prompt_id, minibatch,
    group, dispatch_rank, n_samples, predicted_len). With --format verl a
    text prompt becomes a chat list of one user message in the verl format;
    with compile --prompt-field F, that chat, built from F, takes the name
    'prompt' (verl's data.prompt_key), and a source column of that name gives
    way to it, with a note. --format jsonl keeps every source field as it is.

    For verl the command prints the overrides that keep the plan's order (one
    group per trainer step) and its length caps, and what else to set
    (data.gen_batch_size, data.val_files), quoted for a POSIX shell and for
    Hydra; --json gives them as {"overrides": {...}, "warnings": [...],
    "verl_overrides": [one argv element each], ...}. For jsonl (OpenRLHF,
    slime, AReaL) it notes how to keep the order.

    \b
    aspc compile gsm8k.parquet --for verl --max-response-length 1024 --max-prompt-length 512 -o plan.parquet
    aspc export plan.parquet --format verl -o train.parquet
    aspc export plan.parquet --format jsonl -o train.jsonl
    """
    from aspc.export import OUTPUT_EXAMPLES, export_plan
    from aspc.export.overrides import shell_line
    from aspc.guards import check_output

    output = check_output(output, inputs=[plan_path, source], example=OUTPUT_EXAMPLES.get(fmt, "train.parquet"))
    if data_source is not None and not data_source.strip():  # verl picks the reward function by it
        raise ConfigError("--data-source is empty; give the name verl's reward manager knows (e.g. openai/gsm8k)")

    with RichProgress(quiet) as progress:
        progress.stage("export")
        res = export_plan(plan_path, output, fmt, data_source=data_source, source=source, use_source=not no_source)
        progress.done()
    if as_json:
        emit_json(res.to_dict())
        return
    if quiet:
        return
    origin = f", columns of {res.source.name}" if res.source is not None else ", aspc's columns only"
    # emoji=False: a path such as a:smile:b is printed as it is, not with an emoji in it.
    out_console.print(f"wrote {res.rows:,} rows in dispatch order to {res.path} ({res.format}{origin})", markup=False,
                      emoji=False)  # fmt: skip
    if res.format == "verl":
        out_console.print("verl overrides for this plan:")
        # Shell-quoted, so that the lines pasted after a verl command pass each override as one argument.
        line = shell_line(res.verl_overrides(), " \\\n  ")
        out_console.print("  " + line, soft_wrap=True, highlight=False, markup=False, emoji=False)
    for w in res.warnings:
        err_console.print(f"[yellow]note[/] {escape(w)}", soft_wrap=True, highlight=False)
