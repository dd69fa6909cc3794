"""``aspc check``: CI gate on a plan's integrity and balance metrics."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.markup import escape

from aspc.cli.common import emit_json, err_console, handle_errors, json_option, out_console
from aspc.cli.paths import PathArg
from aspc.cli.render import metrics_table


@click.command("check")
@click.argument("plan_path", metavar="PLAN", type=PathArg(path_type=Path))
@click.option("--max-imbalance", type=float, default=None, help="Fail when group_imbalance exceeds this.")
@click.option("--max-padding", type=float, default=None, help="Fail when padding_ratio exceeds this.")
@click.option("--max-drift", type=float, default=None, help="Fail when delivery_drift exceeds this.")
@json_option
@handle_errors
def check_cmd(plan_path: Path, max_imbalance, max_padding, max_drift, as_json: bool) -> None:
    """Verify a plan and its metrics: exit 0 within bounds, 1 on a violated bound, 2 on bad input."""
    from aspc.emit import check_plan, read_plan
    from aspc.memory import small_pages_only

    small_pages_only()
    plan = read_plan(plan_path)
    res = check_plan(
        plan, max_imbalance=max_imbalance, max_padding=max_padding, max_drift=max_drift, name=plan_path.name
    )
    m = res.metrics
    if as_json:
        emit_json({**m, "ok": res.ok, "violations": res.violations})
    else:
        out_console.print(metrics_table(m, title=f"check {plan_path.name}"))
        for v in res.violations:
            err_console.print(f"[red]FAIL[/] {escape(v)}")
        if res.ok:
            err_console.print("[green]OK[/] plan is consistent and within bounds")
    if not res.ok:
        sys.exit(1)
