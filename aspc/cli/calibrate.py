"""``aspc calibrate RUN``: fit the simulator's cost model from a run log."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from aspc.cli.common import (
    emit_json,
    handle_errors,
    json_option,
    note,
    out_console,
    quiet_option,
    results_only_on_stdout,
)
from aspc.cli.paths import PathArg
from aspc.cli.render import plain


@click.command("calibrate")
@click.argument("run_dir", metavar="RUN", type=PathArg(file_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=PathArg(path_type=str),
    default=None,
    help="Write the fitted cost model here (JSON for --cost-model).",
)
@json_option
@quiet_option
@handle_errors
@results_only_on_stdout()
def calibrate_cmd(run_dir: Path, output: str | Path | None, as_json: bool, quiet: bool) -> None:
    """Fit decode, prefill and trainer coefficients from a run log's sample, minibatch and step rows.

    \b
    aspc calibrate RUN -o cost.json
    aspc run plan.parquet --cost-model cost.json
    """
    from aspc.guards import check_output, check_output_suffix
    from aspc.runtime.backends.sim_cost import save_sim_cost_model
    from aspc.runtime.calibrate import calibrate

    if output is not None:
        check_output_suffix(output, "a cost model", "JSON", ".json")  # it wrote JSON into y.parquet
        output = check_output(output, inputs=[run_dir], example="cost.json")

    cal = calibrate(run_dir)
    if output is not None:
        save_sim_cost_model(cal.sim_cost_model, output)
        note(f"cost model written to {output}", quiet)
    for msg in cal.notes:
        note(msg, quiet)
    fit = {
        "n_minibatches": cal.n_minibatches,
        "n_steps": cal.n_steps,
        "fit_rows": cal.fit_rows,  # generation fitted on "samples" (decode / finish times) or "minibatches"
        "n_fit_rows": cal.n_fit_rows,
        "r2_generation": cal.r2_generation,
        "r2_trainer": cal.r2_trainer,
        "generation_rel_error": cal.generation_rel_error,
        "minibatch_overhead": cal.minibatch_overhead,  # for aspc compile --minibatch-overhead
        "speed_probe_s": cal.speed_probe_s,  # machine speed during the run (aspc run --speed-probe)
    }
    if as_json:
        emit_json({"cost_model": cal.sim_cost_model.to_dict(), "std_errors": cal.std_errors, **fit})
    elif not quiet or output is None:  # without -o the table is the result: --quiet drops only the notes
        t = Table(title=plain(f"cost model fitted from {run_dir.name}"), header_style="bold")
        t.add_column("coefficient")
        t.add_column("value", justify="right")
        t.add_column("std. error", justify="right")
        for k, v in cal.sim_cost_model.to_dict().items():
            se = cal.std_errors.get(k)
            t.add_row(k, f"{v:.6g}", "-" if se is None else f"{se:.3g}")
        for k, v in fit.items():
            t.add_row(k, "-" if v is None else (plain(v) if isinstance(v, str) else f"{v:.6g}"), "")
        out_console.print(t)
