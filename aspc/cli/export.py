"""``aspc export``: a plan's prompts in dispatch order, as a verl dataset or JSONL."""

from __future__ import annotations

from pathlib import Path

import click

from aspc.cli.common import RichProgress, emit_json, err_console, handle_errors, json_option, out_console, quiet_option


@click.command("export")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["verl", "jsonl"]),
    default="verl",
    show_default=True,
    help="verl: Parquet with a chat 'prompt' column; jsonl: one JSON record per line.",
)
@click.option("-o", "--output", type=click.Path(path_type=str), required=True, help="File to write.")
@click.option(
    "--data-source",
    default=None,
    help="Value of the data_source column (verl picks the reward function by it). "
    "[default: the --source dataset's own, else 'aspc']",
)
@click.option(
    "--source",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The dataset the plan was compiled from: carry its other fields (reward_model, ability, extra_info, ...).",
)
@json_option
@quiet_option
@handle_errors
def export_cmd(
    plan_path: Path, fmt: str, output: str | Path, data_source: str | None, source: Path | None, as_json: bool, quiet: bool
) -> None:
    """Write PLAN's prompts, one row per plan row in dispatch order, for a trainer.

    The verl format is a Parquet file with 'prompt' as a chat list of
    {role, content} (a text prompt becomes one user message), 'data_source',
    'extra_info' (index, split, and aspc's prompt_id, minibatch, group,
    dispatch_rank, n_samples, predicted_len) and 'id' (the aspc prompt id, so
    'aspc compile' of the file keeps the ids).

    verl keeps the plan's order only with these settings: data.shuffle=False
    (a sequential sampler); data.train_batch_size = prompts per plan group, so
    each trainer step takes exactly one group (groups hold equal prompt counts
    when compiled with --slack 0 and a prompt count divisible by batch size x
    group size); actor_rollout_ref.rollout.n = the plan's n_samples;
    data.filter_overlong_prompts=False and data.train_max_samples=-1, since
    dropping or subsampling rows shifts every later batch; no custom
    data.sampler. The command prints these overrides for the plan.

    \b
    aspc export plan.parquet --format verl -o train.parquet
    aspc export plan.parquet --format verl --source prompts.parquet -o train.parquet
    aspc export plan.parquet --format jsonl -o train.jsonl
    """
    from aspc.export import export_plan
    from aspc.guards import check_output

    output = check_output(output, inputs=[plan_path, source])

    with RichProgress(quiet) as progress:
        progress.stage("export")
        res = export_plan(plan_path, output, fmt, data_source=data_source, source=source)
        progress.done()
    if as_json:
        emit_json(res.to_dict())
        return
    if quiet:
        return
    out_console.print(f"wrote {res.rows:,} rows in dispatch order to {res.path} ({res.format})")
    if res.train_batch_size is None:
        sizes = sorted(set(res.group_prompts))
        err_console.print(
            f"[yellow]note[/] the plan's {res.n_groups} groups hold {sizes[0]}–{sizes[-1]} prompts: no single "
            "data.train_batch_size matches them; for equal groups compile with --slack 0 and a prompt count "
            "divisible by batch size x group size"
        )
    if res.format == "verl":
        out_console.print("verl overrides that keep this order:")
        out_console.print("  " + " \\\n  ".join(res.verl_overrides()), soft_wrap=True, highlight=False, markup=False)
