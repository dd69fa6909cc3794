"""``aspc inspect``: metrics, config, group loads and minibatch sizes of a plan."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from aspc.cli.common import emit_json, handle_errors, json_option, out_console
from aspc.cli.paths import PathArg
from aspc.cli.render import metrics_table, plain


@click.command("inspect")
@click.argument("plan_path", metavar="PLAN", type=PathArg(path_type=Path))
@json_option
@handle_errors
def inspect_cmd(plan_path: Path, as_json: bool) -> None:
    """Show a plan's metrics, config, per-group loads and minibatch size histogram."""
    import numpy as np

    from aspc.emit import group_loads, plan_cost_model, read_plan, verify_integrity
    from aspc.emit import schema as S
    from aspc.emit.metrics import minibatch_starts
    from aspc.memory import small_pages_only

    small_pages_only()
    plan = read_plan(plan_path)
    verify_integrity(plan, plan_path.name)  # the metrics shown are the stored ones: they must be the rows'
    # The cost model check uses (an older plan keeps it only in its config): the loads are the ones check gates.
    loads = group_loads(plan.table, plan_cost_model(plan), plan.metrics.get("response_cap"))
    sizes = np.diff(minibatch_starts(plan.column(S.MINIBATCH)))
    values, counts = np.unique(sizes, return_counts=True)
    hist = {int(v): int(c) for v, c in zip(values, counts, strict=True)}
    lb = plan.metrics.get("lower_bound") or float(loads.max())
    if as_json:
        emit_json(
            {
                "schema_version": plan.schema_version,
                "metrics": plan.metrics,
                "config": plan.config,
                "predictor": plan.predictor,
                "input_hash": plan.input_hash,
                "group_loads": loads.tolist(),
                "minibatch_size_histogram": hist,
            }
        )
        return
    out_console.print(metrics_table(plan.metrics, title=f"{plan_path.name} (schema {plan.schema_version})"))
    cfg = Table(title="config", header_style="bold")
    cfg.add_column("key")
    cfg.add_column("value")
    for k in sorted(plan.config):
        cfg.add_row(plain(k), plain(plan.config[k]))
    cfg.add_row("predictor", plain(plan.predictor))
    cfg.add_row("input sha256", plain(plan.input_hash[:16] + "…"))
    out_console.print(cfg)
    g = Table(title="group loads (predicted)", header_style="bold")
    g.add_column("group", justify="right")
    g.add_column("load", justify="right")
    g.add_column("load / LB", justify="right")
    shown = loads if loads.size <= 40 else loads[:40]
    for i, v in enumerate(shown):
        # Every length 0: no load to compare with, so the ratio is undefined ("–", as other such figures are).
        g.add_row(str(i), f"{v:,.0f}", f"{v / lb:.4f}" if lb > 0 else "–")
    if loads.size > 40:
        g.add_row("…", f"{loads.size - 40} more", "")
    out_console.print(g)
    h = Table(title="minibatch sizes", header_style="bold")
    h.add_column("prompts", justify="right")
    h.add_column("minibatches", justify="right")
    for k, c in hist.items():
        h.add_row(str(k), str(c))
    out_console.print(h)
