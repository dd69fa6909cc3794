"""``aspc report``: figures and an HTML page for a plan and its run logs."""

from __future__ import annotations

from pathlib import Path

import click

from aspc.cli.common import RichProgress, emit_json, handle_errors, json_option, out_console, quiet_option
from aspc.cli.paths import PathArg


@click.command("report")
@click.argument("plan_path", metavar="PLAN", type=PathArg(dir_okay=False, path_type=Path))
@click.argument("run_dirs", metavar="[RUN]...", nargs=-1, type=PathArg(file_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=PathArg(file_okay=False, path_type=Path),
    default=Path("report"),
    show_default=True,
    help="Report directory (replaced whole if it holds an earlier aspc report; any other non-empty directory is refused).",
)
@click.option(
    "--embed", is_flag=True, help="Also inline the PNGs into index.html, so the page alone carries everything."
)
@json_option
@quiet_option
@handle_errors
def report_cmd(
    plan_path: Path, run_dirs: tuple[Path, ...], output: Path, embed: bool, as_json: bool, quiet: bool
) -> None:
    """Draw PNG figures and an offline HTML page (index.html) for PLAN and its run logs.

    Plan figures: predicted length distribution, minibatch sizes and padded
    share, group loads against the lower bound, cumulative dispatched work
    against the straight line (the sorting bubble). With RUN directories
    (written by 'aspc run --log RUN'): predicted vs observed lengths (Kendall
    tau, MAE), queue depth over time, iteration time per trainer step, worker
    timelines with weight reloads, and the policy-lag histogram. Several runs
    are overlaid in the same figures, labelled by directory name.

    \b
    aspc report plan.parquet -o report/
    aspc report plan.parquet runs/asp runs/random -o report/
    """
    from aspc.guards import check_output
    from aspc.report import write_report

    output = check_output(output, inputs=[plan_path, *run_dirs], kind="dir")

    with RichProgress(quiet) as progress:
        files = write_report(plan_path, list(run_dirs), output, progress, embed=embed)
    if as_json:
        emit_json({"report": str(output / "index.html"), "files": [str(f) for f in files]})
    elif not quiet:
        out_console.print(f"wrote {output / 'index.html'} and {len(files) - 1} figures", markup=False)
