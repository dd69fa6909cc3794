"""The report's plan figures: predicted lengths, minibatches, group loads, delivery, predicted vs observed.

Each function writes one PNG to ``path`` (see :mod:`aspc.report.canvas`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from aspc.anneal.order import delivery_drift
from aspc.emit.metrics import group_imbalance
from aspc.report.canvas import (
    MAX_BINS,
    MAX_GROUP_LINES,
    MAX_SCATTER,
    empty_axes,
    fmt,
    new_figure,
    palette,
    require_matplotlib,
    save_png,
    short_label,
)
from aspc.report.data import PlanView, RunView


def _group_lines(ax: Any, plan: PlanView) -> None:
    """Faint vertical lines where a new dispatch group starts (minibatch axis)."""
    if 1 < plan.n_groups <= MAX_GROUP_LINES:
        first = np.flatnonzero(np.diff(plan.mb_group) != 0) + 1
        for x in first:
            ax.axvline(x - 0.5, color="0.6", linewidth=0.6, linestyle=":", zorder=0)


# ---- plan figures ----------------------------------------------------------------


def fig_length_distribution(plan: PlanView, path: Path) -> None:
    """Histogram of predicted mean lengths, and every prompt's q10–q90 interval ranked by mean."""
    fig, (ax1, ax2) = new_figure(2, height=6.4, sharex=False)
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
    save_png(fig, path)


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
    fig, (ax1, ax2, ax3) = new_figure(3, height=7.2)
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
        + (f" (padding_ratio {fmt(pr, 4)})" if isinstance(pr, (int, float)) else "")
    )
    for ax in (ax1, ax2, ax3):
        _group_lines(ax, plan)
    ax3.set_xlim(-0.5, m - 0.5)
    save_png(fig, path)


def fig_group_loads(plan: PlanView, path: Path) -> None:
    """Predicted load of each dispatch group against the lower bound."""
    fig, (ax,) = new_figure(1, height=4.2)
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
    imb = group_imbalance(float(loads.max()), plan.lower_bound, g)  # check's figure: 0, not -0.00%, when balanced
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
    save_png(fig, path)


def _delivery_curve(costs: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.r_[0.0, np.cumsum(sizes, dtype=np.float64)]
    y = np.r_[0.0, np.cumsum(costs, dtype=np.float64)]
    return x / max(x[-1], 1e-300), y / max(y[-1], 1e-300)


def fig_delivery(plan: PlanView, path: Path) -> None:
    """Cumulative predicted work vs cumulative sequences dispatched (the sorting bubble)."""
    fig, (ax,) = new_figure(1, height=6.0, width=7.0)
    x, y = _delivery_curve(plan.mb_cost, plan.mb_sequences)
    ratio = plan.mb_cost / np.maximum(plan.mb_sequences, 1)
    ref = np.argsort(ratio, kind="stable")
    xs, ys = _delivery_curve(plan.mb_cost[ref], plan.mb_sequences[ref])
    ax.plot([0, 1], [0, 1], color="black", linewidth=1.0, linestyle="--", label="ideal straight line")
    if float(np.sum(plan.mb_cost)) > 0 and float(np.sum(plan.mb_sequences)) > 0:
        ax.plot(xs, ys, color="0.55", linewidth=1.2, label="same minibatches, shortest first (sorted)")
        ax.plot(x, y, color="tab:blue", linewidth=2.0, label=f"this plan ({plan.config.get('strategy', '?')})")
        ax.fill_between(x, x, y, color="tab:blue", alpha=0.15)
        k = int(np.argmax(np.abs(y - x)))
        ax.annotate(
            f"delivery_drift {delivery_drift(plan.mb_cost, plan.mb_sequences):.3f}",  # the metric's one definition
            xy=(x[k], y[k]),
            xytext=(0.55, 0.15),
            textcoords="axes fraction",
            arrowprops={"arrowstyle": "->", "color": "tab:blue"},
            color="tab:blue",
        )
    else:  # no work (every predicted length 0) or no sequence: the metric is 0 by definition, no curve to draw
        ax.text(0.55, 0.15, "delivery_drift 0.000", transform=ax.transAxes, color="tab:blue")
        ax.text(0.55, 0.10, "no predicted work to deliver", transform=ax.transAxes, color="0.35", fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.set_xlabel("sequences dispatched (fraction of all)")
    ax.set_ylabel("predicted work dispatched (fraction of all)")
    ax.set_title("Sorting bubble: work vs samples delivered in dispatch order")
    ax.legend(loc="upper left", fontsize=9)
    save_png(fig, path)


# ---- run figures -----------------------------------------------------------------


def fig_predicted_vs_observed(plan: PlanView, runs: list[RunView], path: Path) -> None:
    """Observed mean length of every prompt against its prediction, τ and MAE per run."""
    fig, (ax,) = new_figure(1, height=5.6, width=7.5)
    colors = palette(len(runs))
    rng = np.random.default_rng(0)
    lo, hi = math.inf, 0.0
    nonpositive = False  # a log scale would hide zero lengths
    drawn = False
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
            label=f"{short_label(run.name)}: τ {fmt(tau)}, MAE {fmt(mae, 1)} tokens (n={p.size:,})",
        )
        drawn = True
        nonpositive |= bool(np.any(p <= 0) or np.any(o <= 0))
        pos = np.concatenate([p[p > 0], o[o > 0]])
        if pos.size:
            lo, hi = min(lo, float(pos.min())), max(hi, float(pos.max()))
    if not drawn:
        empty_axes(ax, "no observed lengths in the run logs")
    else:
        # Every length 0 (observed and predicted) is still an observation: a linear axis from 0.
        lo = max(lo, 1.0) if hi > 0 else 0.0
        hi = max(hi, 1.0)
        ax.plot([lo, hi], [lo, hi], color="black", linestyle="--", linewidth=1.0, label="observed = predicted")
        if not nonpositive and lo > 0 and hi / lo > 30:
            ax.set_xscale("log")
            ax.set_yscale("log")
        leg = ax.legend(loc="upper left", fontsize=8, markerscale=2.5)
        for h in leg.legend_handles:
            h.set_alpha(1.0)
    ax.set_xlabel("predicted mean response length (tokens)")
    ax.set_ylabel("observed mean response length (tokens)")
    ax.set_title("Predictor quality: predicted vs observed length per prompt")
    save_png(fig, path)
