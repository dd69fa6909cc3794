"""The report's figures by name: one function per PNG (:mod:`.plan_figures`, :mod:`.run_figures`).

matplotlib's Agg canvas only, imported when a figure is drawn (:mod:`.canvas`).
Every function takes the arrays of :mod:`aspc.report.data`, writes one PNG to
``path`` and returns nothing; :data:`PLAN_FIGURES` and :data:`RUN_FIGURES`
list them with the file name and caption the HTML page uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aspc.report.canvas import require_matplotlib
from aspc.report.data import PlanView, RunView
from aspc.report.plan_figures import (
    fig_delivery,
    fig_group_loads,
    fig_length_distribution,
    fig_minibatches,
    fig_predicted_vs_observed,
)
from aspc.report.run_figures import fig_iteration_time, fig_policy_lag, fig_queue_depth, fig_worker_timeline

__all__ = ["PLAN_FIGURES", "RUN_FIGURES", "FigureSpec", "require_matplotlib"]


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
