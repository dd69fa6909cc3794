"""The compile pipeline: predict → partition → anneal → order → plan.

This module glues the stages together; each stage lives in its own package
with a Numba kernel beside a checked wrapper. It never imports the runtime.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from aspc.choices import ORDERS, Strategy, parse_strategy
from aspc.emit import schema as S
from aspc.emit.plan import Plan
from aspc.errors import ConfigError, InputError
from aspc.guards import check_compile_config, check_lengths
from aspc.io import PromptTable, RaggedLengths
from aspc.io.gather import dispatch_positions, gathered, kernels_warmed_for
from aspc.io.history import history_hashes, read_history
from aspc.io.options import InputOptions
from aspc.io.table import numpy_column
from aspc.predict.base import LengthPrediction
from aspc.progress import NULL_PROGRESS, Progress

# Generation minibatches of 16 prompts keep a worker busy without making the
# longest sequence dominate; small datasets get 4 minibatches at least.
DEFAULT_BATCH_SIZE = 16
# Eight minibatches per group: enough freedom for the annealer to balance loads
# while keeping groups close to one trainer step of samples.
DEFAULT_GROUP_SIZE = 8


@dataclass(frozen=True)
class CompileConfig:
    batch_size: int | None = None  # prompts per minibatch (B); None -> 16, or n//4 under 64 prompts
    slack: int | None = None  # δ: minibatch sizes in [B-δ, B+δ]; None -> B//4
    # κ, sequence-equivalents: each minibatch costs (|b| + κ)·max_b in the DP.
    # None keeps the nominal count round(n/B) (a per-minibatch Lagrange
    # penalty), so the slack moves boundaries to length jumps instead of
    # shrinking every minibatch to B-δ, which pure padding (κ = 0) would do.
    minibatch_overhead: float | None = None
    groups: int | None = None  # dispatch groups (G); None -> from group_size
    group_size: int | None = None  # minibatches per group (K); G = max(1, M // K); None -> 8
    samples_per_prompt: int = 1  # responses per prompt (GRPO n); cost counts all n sequences
    strategy: str = "asp"  # asp | sorted | random
    seed: int = 0  # seeds the annealer and the random baseline
    anneal_iterations: int | None = None  # annealing proposals; None -> scaled with M
    equal_samples: bool = False  # groups must hold equal sample counts
    # Minibatch cost: "expected-max" = sequences x the expected maximum of
    # their sampled lengths (lognormal per prompt from q10/q50/q90), the cost
    # a static minibatch really pays; "padded" = sequences x max predicted mean.
    minibatch_cost: str = "expected-max"
    predictor: str | None = None  # predictor directory or "default"; None with no length field -> default
    history: tuple[str, ...] = ()  # run logs / datasets of observed lengths
    history_length_field: str = "length"  # length field in history datasets
    # Generation workers the plan will run on; None -> order ignores makespan.
    # With W known, the "interleave" order dispatches minibatches longer than
    # half a worker's share of the work first (see _front_load_heavy).
    workers: int | None = None
    # Dispatch order of asp: "lpt" = groups and their minibatches longest
    # first on the q90 of their longest response (the run's last long chain
    # starts early; measured 4-9% shorter iterations than "interleave" on the
    # CASTILLO reference scenario, benchmarks/rl_reference.py); "interleave" =
    # the preprint's order (aspc.anneal.dispatch_order); "ascending": aspc.choices.
    order: str = "lpt"
    # Trainer the plan is for (aspc.profiles): "verl" -> equal prompt counts per
    # group (slack 0, remainder left out, counted), None -> no trainer constraint.
    target: str | None = None
    max_response_length: int | None = None  # tokens; responses cut here (predictions and costs capped)
    max_prompt_length: int | None = None  # tokens; longer prompts are excluded from the plan (aspc.caps)


def resolve_sizes(config: CompileConfig, n: int) -> tuple[int, int]:
    """Batch size and slack for ``n`` prompts, validated."""
    if n < 1:
        raise InputError("no prompts to compile")
    b = config.batch_size
    if b is None:
        b = DEFAULT_BATCH_SIZE if n >= 4 * DEFAULT_BATCH_SIZE else max(1, n // 4)
    if b < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {b}")
    if b > n:
        raise ConfigError(f"--batch-size {b} is larger than the dataset ({n} prompts); use --batch-size <= {n}")
    d = config.slack if config.slack is not None else b // 4
    if d < 0 or d >= b:
        raise ConfigError(f"--slack must be in [0, batch size - 1] = [0, {b - 1}], got {d}")
    if config.samples_per_prompt < 1:
        raise ConfigError(f"--samples-per-prompt must be >= 1, got {config.samples_per_prompt}")
    return b, d


def resolve_groups(config: CompileConfig, m: int) -> int:
    if config.groups is not None and config.group_size is not None:
        raise ConfigError("give --groups or --group-size, not both")
    if config.groups is not None:
        if config.groups < 1:
            raise ConfigError(f"--groups must be >= 1, got {config.groups}")
        if config.groups > m:
            raise ConfigError(f"--groups {config.groups} is more than the {m} minibatches; use --groups <= {m}")
        return config.groups
    k = config.group_size if config.group_size is not None else DEFAULT_GROUP_SIZE
    if k < 1:
        raise ConfigError(f"--group-size must be >= 1, got {k}")
    return max(1, m // k)


def prediction_from_lengths(lengths: RaggedLengths | Sequence[np.ndarray]) -> LengthPrediction:
    """Known lengths as a prediction: mean and empirical quantiles per prompt.

    One kernel over the ragged segments; each value is bit-identical to
    ``x.mean()`` and ``np.quantile(x, [0.1, 0.5, 0.9])`` of that prompt.
    """
    if not isinstance(lengths, RaggedLengths):
        lengths = RaggedLengths.from_arrays(lengths)
    mean, qs = lengths.stats([0.1, 0.5, 0.9])
    return LengthPrediction(mean=mean, q10=qs[:, 0], q50=qs[:, 1], q90=qs[:, 2])


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
    table, prediction, identity, _ = _prepare(input_path, inputs, config, progress)
    return table, prediction, identity


def _prepare(
    input_path: str | os.PathLike, inputs: InputOptions, config: CompileConfig, progress: Progress
) -> tuple[PromptTable, LengthPrediction, dict[str, Any], Any]:
    from aspc.caps import cap_lengths, cap_prediction, check_cap
    from aspc.profiles import check_target, select_prompts, take_rows

    check_compile_config(config)  # before reading: a bad option fails fast
    check_target(config.target)
    check_cap("--max-response-length", config.max_response_length)
    check_cap("--max-prompt-length", config.max_prompt_length)
    if config.target == "verl":
        config = _verl_config(config)
    progress.stage("read")
    tokenizer = getattr(inputs, "tokenizer", None)  # a tokenizer spec (aspc.io.tokens): directory or "qwen"
    # Not beside a tokenizer: its imports and Numba's would run on two threads at once.
    with kernels_warmed_for(None if tokenizer else input_path):
        table = inputs.read(input_path)
    selection = select_prompts(table, config, tokenizer)
    table = take_rows(table, selection.keep)
    progress.done()
    progress.stage("predict")
    if inputs.length_field is not None:
        if config.predictor is not None:
            raise ConfigError("give --length-field or --predictor, not both")
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
            # Each --history source is one earlier epoch, oldest first: RL policies drift, so
            # with several epochs the recent ones weigh more (HistoryPredictor.from_epochs).
            observed = [
                read_history(
                    source,
                    id_field=inputs.id_field,
                    length_field=config.history_length_field,
                    prompts=(table.ids, table.prompts),
                    tokenizer=tokenizer,
                    verl_stats=rollouts,
                )
                for source in config.history
            ]
        predictor = load_predictor(config.predictor or "default")
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


def _verl_config(config: CompileConfig) -> CompileConfig:
    from aspc.profiles import verl_config

    return verl_config(config, DEFAULT_BATCH_SIZE, DEFAULT_GROUP_SIZE)



def _constant(p: LengthPrediction) -> bool:
    return all(np.all(a == a[0]) for a in (p.mean, p.q10, p.q50, p.q90))


def _fixed_bounds(n: int, b: int) -> np.ndarray:
    return np.r_[np.arange(0, n, b), n].astype(np.int64)


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

    Notes
    -----
    The Adaptive Scheduling Pipeline of Chikhi et al. (arXiv 2611.08864):
    prompts are sorted by predicted length, a DP picks minibatch boundaries
    minimising padded tokens, annealing balances minibatches into groups of
    equal predicted work, and groups are dispatched in an interleaved order
    so the trainer sees a steady stream of samples.
    """
    from aspc.anneal import balance, dispatch_order, lpt_keys, lpt_order
    from aspc.costs import MINIBATCH_COSTS, minibatch_costs
    from aspc.emit.metrics import plan_metrics
    from aspc.partition import partition

    check_compile_config(config)
    if config.target == "verl":
        config = _verl_config(config)
    strategy = parse_strategy(config.strategy)
    if config.minibatch_cost not in MINIBATCH_COSTS:
        raise ConfigError(
            f"unknown cost model {config.minibatch_cost!r} (--minibatch-cost); use one of {', '.join(MINIBATCH_COSTS)}"
        )
    n = len(table)
    b, d = resolve_sizes(config, n)
    mean = np.asarray(prediction.mean, dtype=np.float64)
    if mean.shape != (n,):
        raise ConfigError(f"prediction has {mean.size} rows for {n} prompts")
    check_lengths("predicted lengths", mean, prediction.q10, prediction.q50, prediction.q90)
    nseq = np.full(n, config.samples_per_prompt, dtype=np.int64)
    if config.order not in ORDERS:
        raise ConfigError(f"unknown order {config.order!r}; use one of {', '.join(ORDERS)}")
    # Predictions that are all the same carry no information: asp then
    # arranges exactly as the random baseline does (same seed), rather than
    # in the input's line order, which a sort of equal keys would keep.
    uninformed = strategy is Strategy.ASP and _constant(prediction)

    progress.stage("partition")
    shuffled = np.random.default_rng(config.seed).permutation(n)
    if strategy is Strategy.RANDOM or uninformed:
        rows = shuffled
        bounds = _fixed_bounds(n, b)
    else:
        # asp breaks equal predictions by a seeded permutation, not by input
        # order: its plan must not depend on how the input's lines are sorted.
        # The sorted baseline keeps input order among ties (an exported sorted
        # plan recompiles to itself).
        rows = shuffled[np.argsort(mean[shuffled], kind="stable")] if strategy is Strategy.ASP else np.argsort(mean, kind="stable")
        if strategy is Strategy.ASP and config.order != "ascending":
            bounds = partition(mean[rows], b, d, overhead=config.minibatch_overhead)
        else:  # equal minibatches: under a staleness bound unequal ones end apart (aspc.choices.ORDERS)
            bounds = _fixed_bounds(n, b)
    progress.done()

    # Every per-row input of the cost and order kernels, in partition order (gathered once).
    mean_r, nseq_r = mean[rows], nseq[rows]
    q_r = {k: np.asarray(getattr(prediction, k), dtype=np.float64)[rows] for k in ("q10", "q50", "q90")}

    cap = config.max_response_length
    costs = minibatch_costs(
        config.minibatch_cost, bounds, nseq_r, mean_r, q_r["q10"], q_r["q50"], q_r["q90"], cap=cap
    )
    m = costs.size
    n_groups = resolve_groups(config, m)
    seq_sizes = np.diff(bounds) * config.samples_per_prompt
    extra: dict[str, Any] = {}

    if strategy is Strategy.ASP and not uninformed and config.order != "ascending":
        # balance reports its own "anneal" stage: one step per temperature level.
        res = balance(
            costs,
            n_groups,
            seed=config.seed,
            iterations=config.anneal_iterations,
            sample_sizes=np.diff(bounds),
            equal_samples=config.equal_samples,
            progress=progress,
        )
        assignment = np.asarray(res.assignment, dtype=np.int64)
        extra.update({"init_imbalance": float(res.init_imbalance), "anneal_iterations_run": int(res.iterations_run)})
    else:
        # Baselines: consecutive minibatches form groups, as a trainer that
        # consumes the dispatch stream in order would see them.
        progress.stage("anneal")
        assignment = np.minimum(np.arange(m) * n_groups // m, n_groups - 1)
        progress.done()

    progress.stage("order")
    if config.workers is not None and config.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {config.workers}")
    if strategy is Strategy.ASP and uninformed:
        mb_order = np.arange(m, dtype=np.int64)
        extra["order"] = "random (constant predictions)"
    elif strategy is Strategy.ASP and config.order == "ascending":
        mb_order = np.arange(m, dtype=np.int64)  # the partition's own order: predicted mean, shortest first
        extra["order"] = "ascending"
    elif strategy is Strategy.ASP and config.order == "lpt":
        key = lpt_keys(bounds, nseq_r, mean_r, q_r["q10"], q_r["q50"], q_r["q90"])
        mb_order = lpt_order(key, assignment, n_groups)
        extra["order"] = "lpt"
    elif strategy is Strategy.ASP:
        mb_order = np.asarray(dispatch_order(costs, seq_sizes, assignment, n_groups), dtype=np.int64)
        if config.workers is not None:
            mb_order = _front_load_heavy(mb_order, costs, assignment, config.workers)
        extra["order"] = "interleave"
    else:
        mb_order = np.arange(m, dtype=np.int64)
    progress.done()

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
    del q_r, mean_r, nseq_r, pos, rows, shuffled  # gathered: their memory goes before the metrics' own
    # Metrics read numeric columns only: computed while the prompts are gathered.
    numeric = {k: v for k, v in arrays.items() if k != S.PROMPT_ID}
    numeric = pa.Table.from_arrays(list(numeric.values()), names=list(numeric))
    metrics = plan_metrics(numeric, config.minibatch_cost, costs=costs[mb_order], cap=cap)
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
    )


def _front_load_heavy(order: np.ndarray, costs: np.ndarray, assignment: np.ndarray, workers: int) -> np.ndarray:
    """Move groups holding very long minibatches, and those minibatches, to the front.

    A minibatch of cost ``c`` dispatched after work ``w`` ends no earlier than
    ``w / W + c``; to keep the makespan at its bound ``total / W`` a minibatch
    longer than half a worker's share must start near the beginning (the LPT
    rule of Graham 1969 for the few jobs that dominate). Groups stay
    contiguous: heavy groups go first, heaviest first, each with its heavy
    minibatches leading; everything else keeps the interleaved order.
    """
    threshold = 0.5 * float(costs.sum()) / workers
    heavy = costs > threshold
    if not heavy.any():
        return order
    groups_in_order = list(dict.fromkeys(assignment[order].tolist()))
    members: dict[int, list[int]] = {g: [] for g in groups_in_order}
    for k in order.tolist():
        members[int(assignment[k])].append(k)
    peak = {g: max(costs[m] for m in members[g]) for g in groups_in_order}
    heavy_groups = sorted((g for g in groups_in_order if peak[g] > threshold), key=lambda g: (-peak[g], g))
    rest = [g for g in groups_in_order if peak[g] <= threshold]
    out: list[int] = []
    for g in heavy_groups:
        big = sorted((k for k in members[g] if heavy[k]), key=lambda k: (-costs[k], k))
        out.extend(big)
        out.extend(k for k in members[g] if not heavy[k])
    for g in rest:
        out.extend(members[g])
    return np.asarray(out, dtype=np.int64)


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
    for key in ("target", "max_response_length", "max_prompt_length"):
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
    table, prediction, identity, selection = _prepare(input_path, inputs, config, progress)
    table.lengths = None  # read here, now in the predictions: freed before the plan's columns are built
    plan = compile_plan(table, prediction, config, predictor_identity=identity, inputs=inputs, progress=progress)
    plan.metrics.update(selection.metrics())
    return plan
