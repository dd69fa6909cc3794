"""The table ``aspc simulate`` prints: each strategy's summary, its ratios to ``random``, and over repeats
their means and spread.

Over repeats every field of the summary is aggregated the same way, so no
field of one repeat sits beside another's mean (a makespan averaged beside
repeat 0's lower bound read as a makespan below its bound): numbers are means,
``*_max`` fields are maxima (a bound a user gates on, ``policy_lag_max``, must
not average below a repeat's value), nested numbers per key, per-worker lists
per worker; ratios are the mean of the per-repeat ratios.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Keys whose spread (mean, std, values) over repeats the table also reports.
REPEAT_KEYS = (
    "mean_iteration_time",
    "steady_iteration_time",
    "makespan",
    "makespan_over_lower_bound",
    "trainer_wait_fraction",
    "policy_lag_max",
)
RATIO_KEYS = ("mean_iteration_time_vs_random", "steady_iteration_time_vs_random")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def aggregate(key: str, values: list[Any]) -> Any:
    """One field over repeats: the mean of numbers (max for ``*_max``), recursing into dicts and lists.

    A field missing (``None``) in any repeat, or not of one shape in all, is
    ``None``; a non-numeric field equal in every repeat keeps its value.
    """
    first = values[0]
    if all(v == first for v in values) and not isinstance(first, float):
        return first  # identical in every repeat: counts, names, configuration
    if all(_number(v) for v in values):
        arr = np.asarray(values, dtype=np.float64)
        if key.endswith("_max"):
            top = arr.max()
            return int(top) if all(isinstance(v, (int, np.integer)) for v in values) else float(top)
        return float(arr.mean())
    if all(isinstance(v, dict) for v in values) and all(v.keys() == first.keys() for v in values):
        return {k: aggregate(k, [v[k] for v in values]) for k in first}
    if all(isinstance(v, list) for v in values) and len({len(v) for v in values}) == 1:
        return [aggregate(key, [v[i] for v in values]) for i in range(len(first))]
    return None


def comparison_table(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Summaries per strategy, with ``*_vs_random`` ratios when ``random`` ran.

    With repeats (lists of results), each strategy's entry aggregates every
    field over the repeats (:func:`aggregate`), and ``repeats`` holds
    key -> {mean, std, values} for :data:`REPEAT_KEYS` and the ratios.
    """
    runs = {k: (v if isinstance(v, list) else [v]) for k, v in results.items()}
    n = len(next(iter(runs.values()))) if runs else 0
    base = [r.summary.to_dict() for r in runs["random"]] if "random" in runs else None
    out: dict[str, dict[str, Any]] = {}
    for name, rs in runs.items():
        dicts = [r.summary.to_dict() for r in rs]
        for i, d in enumerate(dicts):
            for key in ("mean_iteration_time", "steady_iteration_time"):
                b = base[i].get(key) if base else None
                m = d.get(key)
                d[f"{key}_vs_random"] = m / b if (b and m is not None) else None
        if n == 1:
            out[name] = dicts[0]
            continue
        keys = list(dict.fromkeys(k for d in dicts for k in d))
        entry = {k: aggregate(k, [d.get(k) for d in dicts]) for k in keys}
        spread: dict[str, Any] = {}
        for key in (*REPEAT_KEYS, *RATIO_KEYS):
            vals = [d.get(key) for d in dicts]
            if any(v is None for v in vals):
                continue
            arr = np.asarray(vals, dtype=np.float64)
            spread[key] = {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)), "values": arr.tolist()}
        entry["repeats"] = spread
        entry["n_repeats"] = n
        out[name] = entry
    return out


def _largest_divisor_below(n: int, limit: int) -> int:
    """The largest divisor of ``n`` below ``limit`` (0 if none): O(sqrt n), not O(limit) (a --global-batch of
    2**40 took hours to scan)."""
    best = 0
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            best = max([best, *(x for x in (d, n // d) if x < limit)])
    return best


def _samples(summary: Any) -> int:
    """A run's samples: those consumed and those left over; not a rolling scout's cut responses, which
    its ``samples_planned`` counts (scout rows are plan rows) and which were never meant to be consumed."""
    return int(summary.samples_consumed) + int(summary.samples_left_over)


def left_over_note(results: dict[str, Any], global_batch: int) -> str | None:
    """Why the iteration times leave out part of the run, when they do; ``None`` when every sample was consumed.

    A plan of P samples trains on floor(P / batch) global batches; the rest is
    generated and never consumed. The mean iteration time ends at the last
    trainer step (DESIGN.md, Metrics), so generation that ends after it, such
    as a plan's longest minibatch dispatched last, costs nothing there and a
    strategy that leaves its longest work for the end looks faster than it is.
    """
    # Every repeat's plan: a rolling scout keeps a different number of responses in each.
    runs = [(name, s.summary) for name, r in results.items() for s in (r if isinstance(r, list) else [r])]
    worst_name, worst = max(runs, key=lambda run: run[1].samples_left_over)
    if not worst.samples_left_over:
        return None
    sizes = {_samples(s) for _, s in runs}
    # Count and total of one plan: a rolling scout's kept responses make its plan larger than the others'.
    whose = "the plans'" if len(sizes) == 1 else f"{worst_name}'s"
    # A batch that consumes every plan whole: a divisor of all their sizes (never the batch that left these).
    common = math.gcd(*sizes)
    fit = _largest_divisor_below(common, global_batch)
    better = f"; --global-batch {fit} consumes all of them" if fit and fit * 2 >= global_batch else ""
    return (f"{worst.samples_left_over} of {whose} {_samples(worst)} samples are generated but no trainer step "
            f"consumes them (--global-batch {global_batch}): the iteration times end at the last step and leave out "
            f"whatever generation ends after it, which flatters a strategy that dispatches its longest work "
            f"last{better}")  # fmt: skip
