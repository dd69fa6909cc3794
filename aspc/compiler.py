"""The compile pipeline: predict → partition → anneal → order → plan.

This module glues the stages together; each stage lives in its own package
with a Numba kernel beside a checked wrapper. It never imports the runtime.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import pyarrow as pa

from aspc.compile_config import (  # noqa: F401 - re-exported: aspc.compiler is where callers find them
    DEFAULT_BATCH_SIZE,
    DEFAULT_GROUP_SIZE,
    CompileConfig,
    for_target,
    resolve_groups,
    resolve_sizes,
)
from aspc.emit import schema as S
from aspc.emit.plan import Plan
from aspc.errors import ConfigError
from aspc.guards import check_compile_config
from aspc.io import PromptTable
from aspc.io.gather import dispatch_positions, gathered, kernels_warmed_for
from aspc.io.history import history_hashes, read_history
from aspc.io.options import InputOptions
from aspc.io.table import numpy_column
from aspc.predict.base import LengthPrediction
from aspc.predict.known import prediction_from_lengths  # noqa: F401 - re-exported
from aspc.progress import NULL_PROGRESS, Progress
from aspc.schedule import schedule_prompts


def prepare(
    input_path: str | os.PathLike,
    inputs: InputOptions,
    config: CompileConfig,
    progress: Progress = NULL_PROGRESS,
) -> tuple[PromptTable, LengthPrediction, dict[str, Any]]:
    """Read the input, select the prompts the plan holds, and predict lengths.

    Returns the prompts, their predictions and the predictor's identity (for
    the plan metadata: hashes, never paths).
    """
    table, prediction, identity, _ = prepare_selected(input_path, inputs, config, progress)
    assert prediction is not None
    return table, prediction, identity


def prepare_selected(
    input_path: str | os.PathLike,
    inputs: InputOptions,
    config: CompileConfig,
    progress: Progress = NULL_PROGRESS,
    *,
    predict: bool = True,
) -> tuple[PromptTable, LengthPrediction | None, dict[str, Any], Any]:
    """:func:`prepare`, and the :class:`aspc.profiles.Selection` (the prompts left out, and why).

    ``predict=False`` reads and selects only (prediction ``None``): a caller
    that plans from known lengths alone still holds the prompts a plan holds.
    """
    from aspc.caps import cap_lengths, cap_prediction, check_cap
    from aspc.profiles import check_target, select_prompts, take_rows

    check_compile_config(config)  # before reading: a bad option fails fast
    check_target(config.target)
    check_cap("--max-response-length", config.max_response_length)
    check_cap("--max-prompt-length", config.max_prompt_length)
    config = for_target(config)
    progress.stage("read")
    tokenizer = getattr(inputs, "tokenizer", None)  # a tokenizer spec (aspc.io.tokens): directory or "qwen"
    # Not beside a tokenizer: its imports and Numba's would run on two threads at once.
    with kernels_warmed_for(None if tokenizer else input_path):
        table = inputs.read(input_path)
    selection = select_prompts(table, config, tokenizer)
    # verl rollouts (matched by content) are matched against every prompt read: a left-out prompt's
    # samples then go to no kept prompt whose message it holds.
    read = table if config.history else None
    table = take_rows(table, selection.keep)
    progress.done()
    if not predict:
        return table, None, {}, selection
    progress.stage("predict")
    if inputs.length_field is not None:
        if config.predictor is not None or config.head is not None:
            raise ConfigError(f"give --length-field or {'--predictor' if config.head is None else '--target'}, not both")
        if config.history:
            raise ConfigError("--history blends into a predictor's output; drop it when using --length-field")
        assert table.lengths is not None
        prediction = prediction_from_lengths(cap_lengths(table.lengths, config.max_response_length))
        identity: dict[str, Any] = {"kind": "known-lengths", "field": inputs.length_field}
    else:
        from aspc.predict import HistoryPredictor, load_predictor

        observed = None
        rollouts: list[dict[str, Any]] = []
        if config.history:
            assert read is not None
            matched_to = (read.ids, read.prompts)
            keep = None if read is table else set(table.ids)
            # Each --history source is one earlier epoch, oldest first: RL policies drift, so
            # with several epochs the recent ones weigh more (HistoryPredictor.from_epochs).
            observed = [
                read_history(
                    source,
                    id_field=inputs.id_field,
                    length_field=config.history_length_field,
                    prompts=matched_to,
                    tokenizer=tokenizer,
                    verl_stats=rollouts,
                    keep=keep,
                )
                for source in config.history
            ]
            del matched_to, keep
        read = None  # the prompts left out: freed before predicting
        predictor = load_predictor(config.predictor or "default", target=config.head)
        if observed is not None:
            if len(observed) == 1:
                predictor = HistoryPredictor(predictor, observed[0])
            else:
                predictor = HistoryPredictor.from_epochs(predictor, observed)
        prediction = predictor.predict(table.text_array, ids=table.id_array)
        identity = dict(predictor.identity())
        if observed is not None:
            identity["history"] = history_hashes(config.history)
            identity["history_prompts_matched"] = predictor.coverage(table.ids)
            if rollouts:
                identity["history_verl_rollouts"] = rollouts
        prediction = cap_prediction(prediction, config.max_response_length)
    progress.done()
    return table, prediction, identity, selection


def compile_plan(
    table: PromptTable,
    prediction: LengthPrediction,
    config: CompileConfig,
    *,
    predictor_identity: dict[str, Any] | None = None,
    inputs: InputOptions | None = None,
    progress: Progress = NULL_PROGRESS,
) -> Plan:
    """Compile prompts and their predictions into a :class:`Plan`.

    The schedule (:func:`aspc.schedule.schedule_prompts`: partition, anneal,
    order) reads the predictions only; this lays the prompts out by it.
    """
    from aspc.emit.metrics import plan_metrics

    check_compile_config(config)
    config = for_target(config)
    n = len(table)
    s = schedule_prompts(prediction, config, n, progress, ids=table.id_array)
    rows, bounds, assignment, mb_order, costs, n_groups = s.rows, s.bounds, s.assignment, s.mb_order, s.costs, s.n_groups
    mean_r, nseq_r, q_r, extra, b, d = s.mean_r, s.nseq_r, s.q_r, s.extra, s.b, s.d
    del s  # the per-row arrays are freed as soon as they are gathered (below)
    m = costs.size

    # Rows in dispatch order; minibatches and groups renumbered by first dispatch.
    # pos indexes the partition order (nearly sequential gathers); row_order the input.
    lens = np.diff(bounds)
    pos = dispatch_positions(bounds, mb_order)
    row_order = rows[pos]
    mb_col = np.repeat(np.arange(m, dtype=np.int32), lens[mb_order])
    grp_of_mb = assignment[mb_order]
    _, first = np.unique(grp_of_mb, return_index=True)
    renum = np.empty(n_groups, dtype=np.int32)
    renum[grp_of_mb[np.sort(first)]] = np.arange(n_groups, dtype=np.int32)
    grp_col = np.repeat(renum[grp_of_mb], lens[mb_order])

    # Arrow's take gathers strings in C++ (the prompts on a thread, see
    # aspc.io.gather); numeric columns share NumPy's memory.
    take = numpy_column(row_order, pa.int64())
    prompts = gathered(table.prompt_array, take)
    arrays = {
        S.PROMPT_ID: table.id_array.take(take),
        S.SOURCE_ROW: numpy_column(table.source_rows[row_order], pa.int64()),
        S.PROMPT_TOKENS: numpy_column(table.prompt_tokens[row_order], pa.int64()),
        S.N_SAMPLES: numpy_column(nseq_r[pos], pa.int32()),
        S.PREDICTED_LEN: numpy_column(mean_r[pos], pa.float64()),
        S.PREDICTED_Q10: numpy_column(q_r["q10"][pos], pa.float64()),
        S.PREDICTED_Q50: numpy_column(q_r["q50"][pos], pa.float64()),
        S.PREDICTED_Q90: numpy_column(q_r["q90"][pos], pa.float64()),
        S.MINIBATCH: numpy_column(mb_col, pa.int32()),
        S.GROUP: numpy_column(grp_col, pa.int32()),
        S.DISPATCH_RANK: numpy_column(np.arange(n, dtype=np.int64), pa.int64()),
    }
    # Gathered: the per-row arrays' memory goes before the metrics' own.
    del q_r, mean_r, nseq_r, pos, rows
    # Metrics read numeric columns only: computed while the prompts are gathered.
    numeric = {k: v for k, v in arrays.items() if k != S.PROMPT_ID}
    numeric = pa.Table.from_arrays(list(numeric.values()), names=list(numeric))
    metrics = plan_metrics(numeric, config.minibatch_cost, costs=costs[mb_order], cap=config.max_response_length)
    arrays[S.PROMPT] = prompts.result()
    plan_table = pa.Table.from_arrays([arrays[f.name] for f in S.PLAN_SCHEMA], schema=S.PLAN_SCHEMA)
    metrics.update(extra)
    metrics["n_skipped"] = len(table.skipped)
    cfg = _config_record(config, inputs, b, d, n_groups)
    return Plan(
        table=plan_table,
        config=cfg,
        predictor=predictor_identity or {},
        input_hash=table.input_hash,
        metrics=metrics,
        token_counter=table.token_counter,
        skipped=list(table.skipped),
    )


def _config_record(config: CompileConfig, inputs: InputOptions | None, b: int, d: int, g: int) -> dict[str, Any]:
    """The full compile configuration for the plan metadata (no paths)."""
    cfg = dataclasses.asdict(config)
    # The plan file keeps its historical key for the minibatch cost, so plans
    # stay byte-identical across the CompileConfig rename.
    cfg["cost_model"] = cfg.pop("minibatch_cost")
    # Paths would make plans machine-specific; the predictor identity and
    # history hashes are recorded separately.
    cfg["predictor"] = None if config.predictor is None else ("default" if config.predictor == "default" else "dir")
    cfg["history"] = len(config.history)
    cfg.update({"batch_size": b, "slack": d, "groups": g})
    for key in ("target", "head", "max_response_length", "max_prompt_length"):
        if cfg.get(key) is None:
            # Unset trainer options leave no key: plans compiled without them keep their bytes.
            cfg.pop(key, None)
    if inputs is not None:
        cfg["inputs"] = inputs.record()
    return cfg


def compile_file(
    input_path: str | os.PathLike,
    inputs: InputOptions,
    config: CompileConfig,
    progress: Progress = NULL_PROGRESS,
) -> Plan:
    """Read ``input_path``, predict, and compile: the library form of ``aspc compile``."""
    table, prediction, identity, selection = prepare_selected(input_path, inputs, config, progress)
    assert prediction is not None
    table.lengths = None  # read here, now in the predictions: freed before the plan's columns are built
    plan = compile_plan(table, prediction, config, predictor_identity=identity, inputs=inputs, progress=progress)
    plan.metrics.update(selection.metrics())
    return plan
