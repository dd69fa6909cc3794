"""The report's run figures: queue depth, iteration time, worker timelines, policy lag.

Each function writes one PNG to ``path`` (see :mod:`aspc.report.canvas`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aspc.report.canvas import (
    MAX_MARKED_MINIBATCHES,
    empty_axes,
    new_figure,
    palette,
    require_matplotlib,
    save_png,
    short_label,
)
from aspc.report.data import RunView


def fig_queue_depth(runs: list[RunView], path: Path) -> None:
    """Samples waiting for the trainer over time, one line per run."""
    fig, (ax,) = new_figure(1, height=4.4)
    drawn = False
    for run, c in zip(runs, palette(len(runs)), strict=True):
        if run.queue_time.size == 0:
            continue
        ax.step(
            run.queue_time,
            run.queue_depth,
            where="post",
            color=c,
            linewidth=1.1,
            label=f"{short_label(run.name)} (max {int(run.queue_depth.max()):,})",
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
        empty_axes(ax, "no queue records in the run logs")
        ax.set_ylim(bottom=0)
    else:
        # Head-room above the highest line for the legend.
        lines = [ln.get_ydata() for ln in ax.get_lines()]
        ax.set_ylim(0, max(float(np.max(y)) for y in lines) * 1.3 + 1)
        ax.legend(loc="upper right", fontsize=9)
    ax.set_xlabel("time since run start (s)")
    ax.set_ylabel("queue depth (samples)")
    ax.set_title("Sample queue: fills when generation runs ahead, drains when the trainer starves")
    save_png(fig, path)


def fig_iteration_time(runs: list[RunView], path: Path) -> None:
    """Seconds per trainer step and trainer idle time before each step, one line per run."""
    fig, (ax1, ax2) = new_figure(2, height=6.0)
    drawn = False
    for run, c in zip(runs, palette(len(runs)), strict=True):
        it = run.iteration_time
        if it.size == 0:
            continue
        steps = np.arange(it.size)
        marker = "o" if it.size <= 60 else None
        ax1.plot(
            steps, it, color=c, linewidth=1.2, marker=marker, markersize=3, label=f"{short_label(run.name)} (mean {it.mean():.3g} s)"
        )
        ax2.plot(
            steps,
            run.step_wait,
            color=c,
            linewidth=1.2,
            marker=marker,
            markersize=3,
            label=f"{short_label(run.name)} (total {run.step_wait.sum():.3g} s)",
        )
        drawn = True
    if not drawn:
        empty_axes(ax1, "no trainer steps in the run logs")
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
    save_png(fig, path)


def fig_worker_timeline(runs: list[RunView], path: Path) -> None:
    """Gantt chart per run: minibatches on each worker (colour = group), reloads and trainer steps."""
    mpl = require_matplotlib()
    # About 0.28 inch per worker row, at most 7 inches per run: many workers get thinner rows.
    height = min(1.6 + sum(min(0.28 * (max(r.n_workers, 1) + 1), 7.0) + 0.6 for r in runs), 30.0)
    fig, axes = new_figure(len(runs), height=height, sharex=True)
    cmap = mpl.colormaps["tab20"]
    from matplotlib.patches import Patch

    for ax, run in zip(axes, runs, strict=True):
        w = run.n_workers
        # Outlines and reload markers help with a few hundred bars and bury the data beyond.
        marked = run.mb_end.size <= MAX_MARKED_MINIBATCHES
        edge = {"edgecolor": "white", "linewidth": 0.3} if marked else {"linewidth": 0}
        # One collection per kind of bar, not one broken_barh per worker: each of those re-autoscaled over
        # every collection drawn so far (quadratic: 31 s for 10,000 busy workers).
        busy = np.flatnonzero(run.mb_worker < w)
        _bars(ax, run.mb_start[busy], run.mb_end[busy], run.mb_worker[busy],
              [cmap(int(g) % 20) for g in run.mb_group[busy]], edge)  # fmt: skip
        rel = busy[run.mb_reload[busy]]
        if rel.size:
            _bars(ax, run.mb_dispatch[rel], np.maximum(run.mb_start[rel], run.mb_dispatch[rel]), run.mb_worker[rel],
                  "black", {})  # fmt: skip
        if rel.size and marked:
            ax.plot(run.mb_dispatch[rel], run.mb_worker[rel] + 0.45, linestyle="none", marker="v", markersize=3.5,
                    color="tab:red")  # fmt: skip
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
            f"{short_label(run.name)}: makespan {run.makespan:.4g} s, {int(run.mb_reload.sum())} weight reloads", fontsize=10
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
    save_png(fig, path)


def fig_policy_lag(runs: list[RunView], path: Path) -> None:
    """Histogram of policy lag (trainer version at consumption − generating version), per run."""
    fig, (ax,) = new_figure(1, height=4.2)
    data = [r.policy_lag for r in runs if r.policy_lag.size]
    names = [r for r in runs if r.policy_lag.size]
    if not data:
        empty_axes(ax, "no consumed samples in the run logs")
    else:
        top = int(max(d.max() for d in data))
        bins = np.arange(-0.5, top + 1.5, 1.0)
        colors = [c for r, c in zip(runs, palette(len(runs)), strict=True) if r.policy_lag.size]
        labels = [f"{short_label(r.name)} (mean {r.policy_lag.mean():.2f})" for r in names]
        weights = [np.full(d.size, 100.0 / d.size) for d in data]
        ax.hist(data, bins=bins, weights=weights, color=colors, label=labels, alpha=0.85, rwidth=0.85)
        ax.set_xticks(np.arange(0, top + 1, max(1, (top + 1) // 20)))
        ax.legend(loc="upper right", fontsize=9)
    ax.set_xlabel("policy lag (trainer steps between generating and consuming weights)")
    ax.set_ylabel("consumed samples (%)")
    ax.set_title("Policy lag of consumed samples")
    save_png(fig, path)


def _bars(ax, start: np.ndarray, end: np.ndarray, row: np.ndarray, colors, style: dict) -> None:
    """Bars [start, end) on rows ``row`` (height 0.8) as one collection, the limits updated once."""
    from matplotlib.collections import PolyCollection

    y0, y1 = row - 0.4, row + 0.4
    verts = np.stack([np.stack([start, y0], 1), np.stack([start, y1], 1), np.stack([end, y1], 1),
                      np.stack([end, y0], 1)], 1)  # fmt: skip
    ax.add_collection(PolyCollection(verts, facecolors=colors, **style), autolim=True)
    ax.autoscale_view()
