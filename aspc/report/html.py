"""The report page: one ``index.html`` with inline CSS, no scripts, no network.

Figures are linked by relative file name (``<img src="lengths.png">``, the
PNGs sit beside the page) or, with ``embed``, inlined as base64 ``data:``
URIs so the page alone carries everything. Either way nothing is fetched from
outside the report directory.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any

from aspc import __version__

GENERATOR = "aspc report"  # <meta name="generator">: marks a directory as an aspc report

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto;
       max-width: 1100px; padding: 0 1rem; color: #222; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.3rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; margin-top: 2.2rem; }
h3 { font-size: 1.05rem; margin-bottom: 0.3rem; }
p.sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: 0.6rem 0 1rem; font-size: 0.9rem; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.6rem; }
th { background: #f4f4f4; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1rem 0 2rem; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9rem; }
nav a { margin-right: 1rem; }
code { background: #f4f4f4; padding: 0 0.2rem; }
"""


def fmt(value: Any) -> str:
    """A metric value as table text (floats to 6 significant digits, NaN as n/a)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if abs(value) < 1e-12:  # rounding noise of sums of fractions
            return "0"
        return f"{value:,.6g}" if abs(value) >= 1000 else f"{value:.6g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (dict, list, tuple)):
        return (
            ", ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else ", ".join(map(str, value))
        )
    return str(value)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def kv_table(rows: dict[str, Any], key_header: str = "metric", value_header: str = "value") -> str:
    """A two-column table of ``rows`` in key order."""
    out = [
        f"<table><thead><tr><th>{html.escape(key_header)}</th><th>{html.escape(value_header)}</th></tr></thead><tbody>"
    ]
    for k in sorted(rows):
        v = rows[k]
        out.append(f"<tr><th>{html.escape(str(k))}</th>{_cell(v)}</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _cell(v: Any) -> str:
    cls = ' class="num"' if _is_num(v) else ""
    return f"<td{cls}>{html.escape(fmt(v))}</td>"


def compare_table(columns: list[str], rows: dict[str, list[Any]], key_header: str = "metric") -> str:
    """A table with one column per run and one row per metric."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    out = [f"<table><thead><tr><th>{html.escape(key_header)}</th>{head}</tr></thead><tbody>"]
    for k in rows:
        cells = "".join(_cell(v) for v in rows[k])
        out.append(f"<tr><th>{html.escape(k)}</th>{cells}</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def figure_html(path: Path, title: str, caption: str, embed: bool) -> str:
    """An ``<figure>`` showing the PNG at ``path`` (relative link or inline data URI)."""
    if embed:
        src = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
    else:
        src = html.escape(path.name, quote=True)
    alt = html.escape(title, quote=True)
    return (
        f'<figure id="{html.escape(path.stem, quote=True)}"><h3>{html.escape(title)}</h3>'
        f'<img src="{src}" alt="{alt}" data-file="{html.escape(path.name, quote=True)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def render_page(*, title: str, subtitle: str, sections: list[tuple[str, str, str]]) -> str:
    """The whole page. ``sections`` are ``(anchor, heading, inner_html)``; inner HTML is trusted."""
    nav = "".join(f'<a href="#{html.escape(a, quote=True)}">{html.escape(h)}</a>' for a, h, _ in sections)
    body = "".join(
        f'<section id="{html.escape(a, quote=True)}"><h2>{html.escape(h)}</h2>{inner}</section>'
        for a, h, inner in sections
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="{GENERATOR} {html.escape(__version__, quote=True)}">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f'<h1>{html.escape(title)}</h1><p class="sub">{html.escape(subtitle)}</p>'
        f"<nav>{nav}</nav>{body}</body></html>\n"
    )
