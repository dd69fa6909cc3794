"""What every figure of the report shares: sizes, limits, a matplotlib Agg figure, PNG output.

matplotlib is the optional ``report`` extra, so it is imported inside
:func:`require_matplotlib`, never at module import. Figures are built on
:class:`matplotlib.figure.Figure` directly (no pyplot): no global state, no GUI
backend, safe to call from any thread.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from aspc.errors import AspcError

DPI = 110  # crisp on a laptop screen, ~100 KB per figure
WIDTH = 9.0  # inches
# Scatter plots draw at most this many points (statistics use all of them):
# beyond it the PNG only gets slower to render, not more informative.
MAX_SCATTER = 20_000
# Group boundaries are drawn when there are at most this many groups.
MAX_GROUP_LINES = 64
# Per-minibatch panels draw at most this many bins (a 9-inch axis has ~900 pixels).
MAX_BINS = 400
# Gantt charts outline bars and mark reloads only up to this many minibatches per run.
MAX_MARKED_MINIBATCHES = 600


def require_matplotlib() -> Any:
    """The matplotlib module, or a clear error if the extra is missing.

    The backend is left as the host set it: figures are :class:`~matplotlib.figure.Figure` objects saved
    as PNG, which draws with Agg whatever the backend (``matplotlib.use("Agg", force=True)`` switched a
    notebook's or a GUI's pyplot backend for the rest of the process).
    """
    try:
        import matplotlib
    except ImportError:
        raise AspcError(
            "aspc report needs matplotlib, which is not installed; install it with: pip install 'aspc[report]'"
        ) from None
    return matplotlib


def literal_text() -> Any:
    """A context in which every text is drawn as written, not parsed as mathtext.

    Labels carry user text (run directory names, plan fields): ``cost_$1_vs_$2``
    raised a mathtext parse error, and ``$lr$`` was drawn as math. No label of
    the report uses mathtext. Text artists read the setting when created, so the
    figures are drawn, not only saved, inside it.
    """
    return require_matplotlib().rc_context({"text.parse_math": False})


def new_figure(nrows: int = 1, height: float = 4.2, sharex: bool = True, width: float = WIDTH) -> tuple[Any, Any]:
    require_matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, 1, sharex=sharex, squeeze=False)[:, 0]
    for ax in axes:
        ax.grid(True, alpha=0.3, linewidth=0.6)
    return fig, axes


def save_png(fig: Any, path: Path) -> None:
    # No Software/date metadata: the same inputs give the same bytes.
    fig.savefig(path, format="png", metadata={"Software": None})


def palette(n: int) -> list[Any]:
    cmap = require_matplotlib().colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


# A legend label past this many characters is cut in the middle: a run directory may be named with up to
# 255, and a legend wider than its figure collapsed the axes (matplotlib warned on stderr under -q).
LABEL_CHARS = 48


def short_label(name: str) -> str:
    """``name`` for a figure's legend or title: at most :data:`LABEL_CHARS` characters, its ends kept.

    A cut name ends in 4 hex digits of its hash, so names that differ only in the middle (a learning rate
    in a long run name) keep different labels; :func:`page_label` shows the same tag beside the full name.
    """
    if len(name) <= LABEL_CHARS:
        return name
    tag = _tag(name)
    keep = LABEL_CHARS - len(tag) - 3  # the ellipsis, and " #" before the tag
    head = keep // 2
    return f"{name[:head]}…{name[-(keep - head):]} #{tag}"


def page_label(name: str) -> str:
    """``name`` as the report page shows it: whole, with the tag its cut figure label ends in, if cut."""
    return name if len(name) <= LABEL_CHARS else f"{name} #{_tag(name)}"


def _tag(name: str) -> str:
    import hashlib

    return hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:4]


def fmt(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def empty_axes(ax: Any, msg: str) -> None:
    ax.text(0.5, 0.5, msg, ha="center", va="center", transform=ax.transAxes, color="0.4")
