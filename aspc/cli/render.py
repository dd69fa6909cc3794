"""Rich tables for plan metrics (CLI layer only)."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

_FMT = {
    "padding_ratio": "{:.4f}",
    "group_imbalance": "{:.6f}",
    "delivery_drift": "{:.4f}",
    "total_cost": "{:,.0f}",
    "lower_bound": "{:,.0f}",
    "max_group_load": "{:,.0f}",
    "init_imbalance": "{:.6f}",
}


def fmt_value(key: str, value: Any) -> str:
    if key in _FMT and isinstance(value, (int, float)):
        return _FMT[key].format(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def plain(text: object) -> Text:
    """``text`` as rich draws it literally: a file name or a plan's stored value is user text, and rich
    reads ``[...]`` in a string as markup (``[/]`` raised MarkupError, ``p[red]x`` lost its ``[red]``)."""
    return Text(str(text))


def metrics_table(metrics: dict[str, Any], title: str = "plan metrics") -> Table:
    t = Table(title=plain(title), show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for key in sorted(metrics):
        t.add_row(plain(key), plain(fmt_value(key, metrics[key])))
    return t
