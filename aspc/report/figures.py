"""The report's figures: one function per PNG, matplotlib's Agg canvas only.

matplotlib is the optional ``report`` extra, so it is imported inside
:func:`require_matplotlib`, never at module import. Figures are built on
:class:`matplotlib.figure.Figure` directly (no pyplot): no global state, no GUI
backend, safe to call from any thread.

Every function takes the arrays of :mod:`aspc.report.data`, writes one PNG to
``path`` and returns nothing; :data:`PLAN_FIGURES` and :data:`RUN_FIGURES`
list them with the file name and caption the HTML page uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aspc.errors import AspcError
from aspc.report.data import PlanView, RunView

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
    """The matplotlib module with the Agg backend, or a clear error if the extra is missing."""
    try:
        import matplotlib
    except ImportError:
        raise AspcError(
            "aspc report needs matplotlib, which is not installed; install it with: pip install 'aspc[report]'"
        ) from None
    matplotlib.use("Agg", force=True)
    return matplotlib


def _figure(nrows: int = 1, height: float = 4.2, sharex: bool = True, width: float = WIDTH) -> tuple[Any, Any]:
    require_matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, 1, sharex=sharex, squeeze=False)[:, 0]
    for ax in axes:
        ax.grid(True, alpha=0.3, linewidth=0.6)
    return fig, axes


def _save(fig: Any, path: Path) -> None:
    # No Software/date metadata: the same inputs give the same bytes.
    fig.savefig(path, format="png", metadata={"Software": None})


def _colors(n: int) -> list[Any]:
    cmap = require_matplotlib().colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def _fmt(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _empty(ax: Any, msg: str) -> None:
    ax.text(0.5, 0.5, msg, ha="center", va="center", transform=ax.transAxes, color="0.4")


def _group_lines(ax: Any, plan: PlanView) -> None:
    """Faint vertical lines where a new dispatch group starts (minibatch axis)."""
    if 1 < plan.n_groups <= MAX_GROUP_LINES:
        first = np.flatnonzero(np.diff(plan.mb_group) != 0) + 1
        for x in first:
            ax.axvline(x - 0.5, color="0.6", linewidth=0.6, linestyle=":", zorder=0)


# ---- plan figures ----------------------------------------------------------------


def fig_length_distribution(plan: PlanView, path: Path) -> None:
    """Histogram of predicted mean lengths, and every prompt's q10–q90 interval ranked by mean."""
    fig, (ax1, ax2) = _figure(2, height=6.4, sharex=False)
    pred = plan.predicted
    lo, hi = max(float(pred.min()), 1.0), max(float(pred.max()), 1.0)
    log = float(pred.min()) > 0 and hi / lo > 30
    if log:
        bins = np.geomspace(lo, hi * 1.0001, 50)
        ax1.set_xscale("log")
    else:
        bins = np.linspace(float(pred.min()), float(pred.max()) + 1e-9, 50)
    ax1.hist(pred, bins=bins, color="tab:blue", alpha=0.8, weights=None)
    ax1.axvline(
        float(np.mean(pred)), color="tab:red", linestyle="--", linewidth=1.2, label=f"mean {np.mean(pred):,.0f}"
    )
    ax1.axvline(
        float(np.median(pred)), color="black", linestyle=":", linewidth=1.2, label=f"median {np.median(pred):,.0f}"
    )
    ax1.set_xlabel("predicted mean response length (tokens)" + (", log scale" if log else ""))
    ax1.set_ylabel("prompts")
    ax1.set_title(f"Predicted response lengths ({pred.size:,} prompts, predictor: {plan.predictor.get('kind', '?')})")
    ax1.legend(loc="upper right")

    order = np.argsort(pred, kind="stable")
    rank = np.arange(pred.size)
    ax2.fill_between(rank, plan.q10[order], plan.q90[order], color="tab:blue", alpha=0.25, step="mid", label="q10–q90")
    ax2.plot(rank, pred[order], color="tab:blue", linewidth=1.2, label="predicted mean")
    if log:
        ax2.set_yscale("log")
    ax2.set_xlabel("prompts ranked by predicted mean length")
    ax2.set_ylabel("response length (tokens)")
    ax2.set_title("Prediction uncertainty per prompt")
    ax2.legend(loc="upper left")
    _save(fig, path)


def _bins(m: int) -> tuple[np.ndarray, int]:
    """Start index of each drawn bin over ``m`` minibatches, and minibatches per bin."""
    k = max(1, math.ceil(m / MAX_BINS))
    return np.arange(0, m, k), k


def fig_minibatches(plan: PlanView, path: Path) -> None:
    """Per minibatch, in dispatch order: prompts, longest predicted length, padded fraction.

    Beyond :data:`MAX_BINS` minibatches, consecutive minibatches share a bin
    (size range, longest length, mean padded share) so nothing is lost to
    lines thinner than a pixel.
    """
    fig, (ax1, ax2, ax3) = _figure(3, height=7.2)
    m = plan.n_minibatches
    heads, k = _bins(m)
    edges = np.r_[heads, m] - 0.5
    lo_size = np.minimum.reduceat(plan.mb_prompts, heads)
    hi_size = np.maximum.reduceat(plan.mb_prompts, heads)
    ax1.stairs(
        hi_size, edges, fill=True, color="tab:blue", alpha=0.7, baseline=0, label="largest in bin" if k > 1 else None
    )
    if k > 1 and np.any(lo_size < hi_size):
        ax1.stairs(lo_size, edges, color="navy", linewidth=0.9, label="smallest in bin")
    b, d = plan.config.get("batch_size"), plan.config.get("slack")
    if isinstance(b, int) and isinstance(d, int):
        ax1.axhspan(b - d, b + d, color="tab:green", alpha=0.12, label=f"allowed size B±δ = {b}±{d}")
    if ax1.get_legend_handles_labels()[0]:
        ax1.legend(loc="lower right")
    ax1.set_ylabel("prompts")
    ax1.set_ylim(0, max(float(plan.mb_prompts.max()) * 1.15, 1.0))
    lo, hi = int(plan.mb_prompts.min()), int(plan.mb_prompts.max())
    sizes = str(lo) if lo == hi else f"{lo}–{hi}"
    binned = f"; bins of {k}" if k > 1 else ""
    ax1.set_title(f"Minibatch sizes ({m:,} minibatches of {sizes} prompts{binned})")

    ax2.stairs(np.maximum.reduceat(plan.mb_max, heads), edges, color="tab:purple", linewidth=1.2)
    ax2.set_ylabel("longest predicted\nlength (tokens)")
    ax2.set_title("Longest predicted response per minibatch" + (f" (max over bins of {k})" if k > 1 else ""))

    frac = np.add.reduceat(plan.mb_padded_fraction, heads) / np.diff(np.r_[heads, m])
    ax3.stairs(frac * 100.0, edges, fill=True, color="tab:orange", alpha=0.8, baseline=0)
    ax3.set_ylabel("padded slots (%)" if k == 1 else f"padded slots (%),\nmean over bins of {k}")
    ax3.set_xlabel(
        "minibatch (dispatch order)" + ("; dotted lines: group starts" if 1 < plan.n_groups <= MAX_GROUP_LINES else "")
    )
    pr = plan.metrics.get("padding_ratio")
    ax3.set_title(
        "Padding bubble: share of token-slots idle while the longest sequence finishes"
        + (f" (padding_ratio {_fmt(pr, 4)})" if isinstance(pr, (int, float)) else "")
    )
    for ax in (ax1, ax2, ax3):
        _group_lines(ax, plan)
    ax3.set_xlim(-0.5, m - 0.5)
    _save(fig, path)


def fig_group_loads(plan: PlanView, path: Path) -> None:
    """Predicted load of each dispatch group against the lower bound."""
    fig, (ax,) = _figure(1, height=4.2)
    g = plan.n_groups
    loads = plan.group_loads
    x = np.arange(g)
    worst = int(np.argmax(loads))
    colors = ["tab:red" if i == worst else "tab:blue" for i in range(g)]
    ax.bar(x, loads, width=0.8 if g <= 200 else 1.0, color=colors, alpha=0.85)
    ax.axhline(
        plan.lower_bound, color="black", linestyle="--", linewidth=1.2, label=f"lower bound {plan.lower_bound:,.0f}"
    )
    ax.axhline(float(loads.mean()), color="tab:green", linestyle=":", linewidth=1.2, label=f"mean {loads.mean():,.0f}")
    imb = float(loads.max()) / plan.lower_bound - 1.0 if plan.lower_bound > 0 else 0.0
    top = max(float(loads.max()), plan.lower_bound)
    low = min(float(loads.min()), plan.lower_bound)
    if top > 0 and low / top > 0.9:
        # Balanced groups differ by far less than their size: zoom on the band they occupy.
        pad = max(top - low, top * 1e-4) * 0.6
        bottom, ceil = max(0.0, low - pad), top + pad
    else:
        bottom, ceil = 0.0, top * 1.15 if top > 0 else 1.0
    ax.set_ylim(bottom, ceil)
    ax.yaxis.set_major_formatter(require_matplotlib().ticker.StrMethodFormatter("{x:,.0f}"))
    ax.set_xlabel("dispatch group")
    ax.set_ylabel(f"predicted load (token-slots, {plan.minibatch_cost})")
    ax.set_title(f"Group loads vs lower bound: group_imbalance {imb:.2%} (red: heaviest group)")
    if bottom > 0:
        ax.text(0.01, 0.02, f"y axis starts at {bottom:,.0f}", transform=ax.transAxes, fontsize=8, color="0.35")
    ax.legend(loc="upper right")
    if g <= 40:
        ax.set_xticks(x)
    _save(fig, path)


def _delivery_curve(costs: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.r_[0.0, np.cumsum(sizes, dtype=np.float64)]
    y = np.r_[0.0, np.cumsum(costs, dtype=np.float64)]
    return x / max(x[-1], 1e-300), y / max(y[-1], 1e-300)


def fig_delivery(plan: PlanView, path: Path) -> None:
    """Cumulative predicted work vs cumulative sequences dispatched (the sorting bubble)."""
    fig, (ax,) = _figure(1, height=6.0, width=7.0)
    x, y = _delivery_curve(plan.mb_cost, plan.mb_sequences)
    ratio = plan.mb_cost / np.maximum(plan.mb_sequences, 1)
    ref = np.argsort(ratio, kind="stable")
    xs, ys = _delivery_curve(plan.mb_cost[ref], plan.mb_sequences[ref])
    ax.plot([0, 1], [0, 1], color="black", linewidth=1.0, linestyle="--", label="ideal straight line")
    ax.plot(xs, ys, color="0.55", linewidth=1.2, label="same minibatches, shortest first (sorted)")
    ax.plot(x, y, color="tab:blue", linewidth=2.0, label=f"this plan ({plan.config.get('strategy', '?')})")
    ax.fill_between(x, x, y, color="tab:blue", alpha=0.15)
    k = int(np.argmax(np.abs(y - x)))
    gap = float(abs(y[k] - x[k]))
    ax.annotate(
        f"delivery_drift {gap:.3f}",
        xy=(x[k], y[k]),
        xytext=(0.55, 0.15),
        textcoords="axes fraction",
        arrowprops={"arrowstyle": "->", "color": "tab:blue"},
        color="tab:blue",
    )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.set_xlabel("sequences dispatched (fraction of all)")
    ax.set_ylabel("predicted work dispatched (fraction of all)")
    ax.set_title("Sorting bubble: work vs samples delivered in dispatch order")
    ax.legend(loc="upper left", fontsize=9)
    _save(fig, path)


# ---- run figures -----------------------------------------------------------------


def fig_predicted_vs_observed(plan: PlanView, runs: list[RunView], path: Path) -> None:
    """Observed mean length of every prompt against its prediction, τ and MAE per run."""
    fig, (ax,) = _figure(1, height=5.6, width=7.5)
    colors = _colors(len(runs))
    rng = np.random.default_rng(0)
    lo, hi = math.inf, 0.0
    nonpositive = False  # a log scale would hide zero lengths
    for run, c in zip(runs, colors, strict=True):
        p, o = run.predicted, run.observed
        if p.size == 0:
            continue
        idx = rng.choice(p.size, MAX_SCATTER, replace=False) if p.size > MAX_SCATTER else slice(None)
        tau, mae = run.extra.get("kendall_tau", math.nan), run.extra.get("length_mae", math.nan)
        ax.scatter(
            p[idx],
            o[idx],
            s=6,
            alpha=0.35,
            color=c,
            linewidths=0,
            label=f"{run.name}: τ {_fmt(tau)}, MAE {_fmt(mae, 1)} tokens (n={p.size:,})",
        )
        nonpositive |= bool(np.any(p <= 0) or np.any(o <= 0))
        pos = np.concatenate([p[p > 0], o[o > 0]])
        if pos.size:
            lo, hi = min(lo, float(pos.min())), max(hi, float(pos.max()))
    if hi <= 0:
        _empty(ax, "no observed lengths in the run logs")
    else:
        lo = max(lo, 1.0)
        ax.plot([lo, hi], [lo, hi], color="black", linestyle="--", linewidth=1.0, label="observed = predicted")
        if hi / lo > 30 and not nonpositive:
            ax.set_xscale("log")
            ax.set_yscale("log")
        leg = ax.legend(loc="upper left", fontsize=8, markerscale=2.5)
        for h in leg.legend_handles:
            h.set_alpha(1.0)
    ax.set_xlabel("predicted mean response length (tokens)")
    ax.set_ylabel("observed mean response length (tokens)")
    ax.set_title("Predictor quality: predicted vs observed length per prompt")
    _save(fig, path)


def fig_queue_depth(runs: list[RunView], path: Path) -> None:
    """Samples waiting for the trainer over time, one line per run."""
    fig, (ax,) = _figure(1, height=4.4)
    drawn = False
    for run, c in zip(runs, _colors(len(runs)), strict=True):
        if run.queue_time.size == 0:
            continue
        ax.step(
            run.queue_time,
            run.queue_depth,
            where="post",
            color=c,
            linewidth=1.1,
            label=f"{run.name} (max {int(run.queue_depth.max()):,})",
        )
        drawn = True
        if len(runs) == 1:
            gb = (run.meta.get("config") or {}).get("global_batch")
            cap = (run.meta.get("run") or {}).get("queue_capacity")
            if isinstance(gb, int):
                ax.axhline(gb, color="0.4", linestyle=":", linewidth=1.0, label=f"one trainer batch ({gb:,} samples)")
            if isinstance(cap, int):
                ax.axhline(
                    cap, color="tab:red", linestyle="--", linewidth=1.0, label=f"queue capacity ({cap:,} samples)"
                )
    if not drawn:
        _empty(ax, "no queue records in the run logs")
        ax.set_ylim(bottom=0)
    else:
        # Head-room above the highest line for the legend.
        lines = [ln.get_ydata() for ln in ax.get_lines()]
        ax.set_ylim(0, max(float(np.max(y)) for y in lines) * 1.3 + 1)
        ax.legend(loc="upper right", fontsize=9)
    ax.set_xlabel("time since run start (s)")
    ax.set_ylabel("queue depth (samples)")
    ax.set_title("Sample queue: fills when generation runs ahead, drains when the trainer starves")
    _save(fig, path)


def fig_iteration_time(runs: list[RunView], path: Path) -> None:
    """Seconds per trainer step and trainer idle time before each step, one line per run."""
    fig, (ax1, ax2) = _figure(2, height=6.0)
    drawn = False
    for run, c in zip(runs, _colors(len(runs)), strict=True):
        it = run.iteration_time
        if it.size == 0:
            continue
        steps = np.arange(it.size)
        marker = "o" if it.size <= 60 else None
        ax1.plot(
            steps, it, color=c, linewidth=1.2, marker=marker, markersize=3, label=f"{run.name} (mean {it.mean():.3g} s)"
        )
        ax2.plot(
            steps,
            run.step_wait,
            color=c,
            linewidth=1.2,
            marker=marker,
            markersize=3,
            label=f"{run.name} (total {run.step_wait.sum():.3g} s)",
        )
        drawn = True
    if not drawn:
        _empty(ax1, "no trainer steps in the run logs")
    else:
        ax1.legend(loc="upper right", fontsize=9)
        ax2.legend(loc="upper right", fontsize=9)
    ax1.set_ylabel("iteration time (s)")
    ax1.set_title("Trainer iteration time per step (step 0 includes the pipeline fill)")
    ax1.set_ylim(bottom=0)
    ax2.set_ylabel("trainer wait (s)")
    ax2.set_xlabel("trainer step")
    ax2.set_title("Trainer idle time before each step (waiting for samples)")
    ax2.set_ylim(bottom=0)
    _save(fig, path)


def fig_worker_timeline(runs: list[RunView], path: Path) -> None:
    """Gantt chart per run: minibatches on each worker (colour = group), reloads and trainer steps."""
    mpl = require_matplotlib()
    # About 0.28 inch per worker row, at most 7 inches per run: many workers get thinner rows.
    height = min(1.6 + sum(min(0.28 * (max(r.n_workers, 1) + 1), 7.0) + 0.6 for r in runs), 30.0)
    fig, axes = _figure(len(runs), height=height, sharex=True)
    cmap = mpl.colormaps["tab20"]
    from matplotlib.patches import Patch

    for ax, run in zip(axes, runs, strict=True):
        w = run.n_workers
        # Outlines and reload markers help with a few hundred bars and bury the data beyond.
        marked = run.mb_end.size <= MAX_MARKED_MINIBATCHES
        edge = {"edgecolor": "white", "linewidth": 0.3} if marked else {"linewidth": 0}
        for k in range(w):
            sel = np.flatnonzero(run.mb_worker == k)
            if sel.size == 0:
                continue
            spans = list(zip(run.mb_start[sel], run.mb_end[sel] - run.mb_start[sel], strict=True))
            ax.broken_barh(
                spans,
                (k - 0.4, 0.8),
                facecolors=[cmap(int(g) % 20) for g in run.mb_group[sel]],
                **edge,
            )
            rel = sel[run.mb_reload[sel]]
            if rel.size:
                rspans = list(
                    zip(run.mb_dispatch[rel], np.maximum(run.mb_start[rel] - run.mb_dispatch[rel], 0.0), strict=True)
                )
                ax.broken_barh(rspans, (k - 0.4, 0.8), facecolors="black")
            if rel.size and marked:
                ax.plot(
                    run.mb_dispatch[rel],
                    np.full(rel.size, k + 0.45),
                    linestyle="none",
                    marker="v",
                    markersize=3.5,
                    color="tab:red",
                )
        if run.step_start.size:
            ax.broken_barh(
                list(zip(run.step_start, run.step_end - run.step_start, strict=True)),
                (w - 0.4, 0.8),
                facecolors="0.35",
                **edge,
            )
        labels = [f"worker {k}" for k in range(w)] + ["trainer"]
        step = max(1, (w + 1) // 24)
        ax.set_yticks(np.arange(w + 1)[::step], labels[::step], fontsize=8)
        ax.set_ylim(-0.6, w + 0.6)
        ax.invert_yaxis()
        ax.set_title(
            f"{run.name}: makespan {run.makespan:.4g} s, {int(run.mb_reload.sum())} weight reloads", fontsize=10
        )
    axes[-1].set_xlabel("time since run start (s)")
    handles = [
        Patch(facecolor=cmap(0), label="minibatch generation (colour = dispatch group)"),
        Patch(
            facecolor="black",
            label="weight reload"
            + (" (red ▼ marks it)" if any(r.mb_end.size <= MAX_MARKED_MINIBATCHES for r in runs) else ""),
        ),
        Patch(facecolor="0.35", label="trainer step"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8)
    fig.suptitle("Worker timelines")
    _save(fig, path)


def fig_policy_lag(runs: list[RunView], path: Path) -> None:
    """Histogram of policy lag (trainer version at consumption − generating version), per run."""
    fig, (ax,) = _figure(1, height=4.2)
    data = [r.policy_lag for r in runs if r.policy_lag.size]
    names = [r for r in runs if r.policy_lag.size]
    if not data:
        _empty(ax, "no consumed samples in the run logs")
    else:
        top = int(max(d.max() for d in data))
        bins = np.arange(-0.5, top + 1.5, 1.0)
        colors = [c for r, c in zip(runs, _colors(len(runs)), strict=True) if r.policy_lag.size]
        labels = [f"{r.name} (mean {r.policy_lag.mean():.2f})" for r in names]
        weights = [np.full(d.size, 100.0 / d.size) for d in data]
        ax.hist(data, bins=bins, weights=weights, color=colors, label=labels, alpha=0.85, rwidth=0.85)
        ax.set_xticks(np.arange(0, top + 1, max(1, (top + 1) // 20)))
        ax.legend(loc="upper right", fontsize=9)
    ax.set_xlabel("policy lag (trainer steps between generating and consuming weights)")
    ax.set_ylabel("consumed samples (%)")
    ax.set_title("Policy lag of consumed samples")
    _save(fig, path)


# ---- registry ----------------------------------------------------------------------


@dataclass(frozen=True)
class FigureSpec:
    """A figure of the report: how to draw it, where, and what it shows."""

    file: str  # PNG file name inside the report directory
    title: str  # heading on the HTML page
    caption: str  # what to look for, one or two sentences
    draw: Callable[..., None]  # plan figures: (plan, path); run figures: (plan, runs, path)


def _runs_only(fn: Callable[[list[RunView], Path], None]) -> Callable[[PlanView, list[RunView], Path], None]:
    def draw(plan: PlanView, runs: list[RunView], path: Path) -> None:
        fn(runs, path)

    return draw


PLAN_FIGURES = (
    FigureSpec(
        "lengths.png",
        "Predicted length distribution",
        "How long the predictor expects responses to be, and how uncertain each prediction is (q10–q90 band).",
        fig_length_distribution,
    ),
    FigureSpec(
        "minibatches.png",
        "Minibatches",
        "Sizes stay within the allowed band; the padded share shows the padding bubble each minibatch pays.",
        fig_minibatches,
    ),
    FigureSpec(
        "group_loads.png",
        "Group loads",
        "Balanced groups sit on the lower bound; the heaviest group (red) sets the imbalance.",
        fig_group_loads,
    ),
    FigureSpec(
        "delivery.png",
        "Cumulative dispatched work",
        "The closer the plan's curve to the straight line, the steadier the trainer is fed; sorted dispatch bows far below it.",
        fig_delivery,
    ),
)

RUN_FIGURES = (
    FigureSpec(
        "predicted_vs_observed.png",
        "Predicted vs observed lengths",
        "Each point is one prompt; Kendall τ measures how well the predictor ranks lengths, MAE its error in tokens.",
        fig_predicted_vs_observed,
    ),
    FigureSpec(
        "queue_depth.png",
        "Queue depth",
        "Samples waiting for the trainer; a queue at zero means a starving trainer, a full one back-pressures workers.",
        _runs_only(fig_queue_depth),
    ),
    FigureSpec(
        "iteration_time.png",
        "Iteration time",
        "Seconds per trainer step and how much of it the trainer waited for samples.",
        _runs_only(fig_iteration_time),
    ),
    FigureSpec(
        "worker_timeline.png",
        "Worker timelines",
        "Each bar is one minibatch on one worker; black bars are weight reloads, the last row the trainer's steps.",
        _runs_only(fig_worker_timeline),
    ),
    FigureSpec(
        "policy_lag.png",
        "Policy lag",
        "How many weight versions behind the trainer each consumed sample was generated.",
        _runs_only(fig_policy_lag),
    ),
)
