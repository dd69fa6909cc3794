"""Schedules side by side: compile one input with several strategies, simulate each.

The library form of ``aspc simulate``. It sits above both halves of aspc: it
compiles (:mod:`aspc.compiler`) and runs (:func:`aspc.runtime.run`), so
neither half imports the other. Every strategy is compiled from the
same prompts and predictions and replayed on the same actual lengths with the
same run configuration and seed, so differences come from the schedule alone.
``oracle`` is ``asp`` compiled with the actual lengths as its predictions: the
best a perfect predictor could do.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from aspc.choices import STRATEGIES
from aspc.compiler import compile_plan, prediction_from_lengths, prepare
from aspc.errors import ConfigError, InputError
from aspc.io.history import read_history
from aspc.progress import NULL_PROGRESS, Progress
from aspc.runtime.api import run
from aspc.runtime.backends.sim_cost import SimCostModel
from aspc.runtime.config import RunConfig

ORACLE = "oracle"


def parse_strategies(spec: str | list[str]) -> list[str]:
    """Strategy names from ``"random,sorted,asp,oracle"``; :class:`ConfigError` if unknown or empty."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    allowed = (*STRATEGIES, ORACLE)
    bad = [s for s in names if s not in allowed]
    if bad:
        raise ConfigError(f"unknown strategies {bad}; use a comma list of {', '.join(allowed)}")
    if not names:
        raise ConfigError(f"--strategies is empty; use a comma list of {', '.join(allowed)}")
    return list(dict.fromkeys(names))


def simulate_strategies(
    input_path: str | os.PathLike,
    inputs: Any,
    config: Any,
    run_config: RunConfig,
    *,
    strategies: list[str],
    sim_cost_model: SimCostModel | None = None,
    actual_lengths_path: str | os.PathLike | None = None,
    progress: Progress = NULL_PROGRESS,
) -> dict[str, Any]:
    """Compile ``input_path`` with each strategy and simulate every plan.

    Parameters
    ----------
    input_path
        The prompt dataset.
    inputs, config
        :class:`aspc.compiler.InputOptions` and :class:`aspc.compiler.CompileConfig`
        applied to every strategy (its ``strategy`` field is replaced).
        ``inputs.length_field`` names the actual lengths; they are never used
        as predictions, except by ``oracle``.
    run_config
        Workers, global batch, queue, reload, return mode, seed.
    strategies
        Names from :func:`parse_strategies`.
    actual_lengths_path
        A separate dataset (or run log) of actual lengths, joined by prompt id
        on ``inputs.id_field`` / ``inputs.length_field``.

    Returns
    -------
    dict
        strategy -> :class:`aspc.runtime.RunResult`, in the order given.
    """
    if inputs.length_field is None and actual_lengths_path is None:
        raise InputError(
            "simulate needs actual response lengths: pass --length-field FIELD or --actual-lengths FILE"
        )
    no_lengths = dataclasses.replace(inputs, length_field=None)
    needs_predictor = any(s != ORACLE for s in strategies)
    if needs_predictor:
        table, prediction, identity = prepare(input_path, no_lengths, config, progress)
    else:
        table = inputs.read(input_path, length_field=None)
        prediction, identity = None, {}
    if actual_lengths_path is not None:
        actual = read_history(
            actual_lengths_path, id_field=inputs.id_field, length_field=inputs.length_field or "length"
        )
        name = os.path.basename(os.fspath(actual_lengths_path))
    else:
        with_lengths = inputs.read(input_path)
        assert with_lengths.lengths is not None
        actual = dict(zip(with_lengths.ids, with_lengths.lengths, strict=True))
        name = os.path.basename(os.fspath(input_path))

    results: dict[str, Any] = {}
    for strategy in strategies:
        if strategy == ORACLE:
            missing = [pid for pid in table.ids if pid not in actual]
            if missing:
                raise InputError(
                    f"{len(missing)} of {len(table.ids)} prompts have no actual length in {name}, "
                    f"e.g. id {missing[0]!r}; check --length-field and --id-field"
                )
            pred = prediction_from_lengths([np.asarray(actual[pid], dtype=np.float64) for pid in table.ids])
            cfg = dataclasses.replace(config, strategy="asp", history=())
            ident: dict[str, Any] = {"kind": "oracle", "field": inputs.length_field}
        else:
            pred, cfg, ident = prediction, dataclasses.replace(config, strategy=strategy), identity
        plan = compile_plan(table, pred, cfg, predictor_identity=ident, inputs=no_lengths, progress=progress)
        results[strategy] = run(
            plan,
            config=run_config,
            sim_cost_model=sim_cost_model,
            actual_lengths=actual,
            lengths_name=name,
            progress=progress,
        )
    return results


def comparison_table(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Summaries per strategy, with ``*_vs_random`` ratios when ``random`` ran."""
    out = {name: res.summary.to_dict() for name, res in results.items()}
    for key in ("mean_iteration_time", "steady_iteration_time"):
        base = out.get("random", {}).get(key)
        for d in out.values():
            m = d.get(key)
            d[f"{key}_vs_random"] = m / base if (base and m is not None) else None
    return out
