"""A plan's schedule: which prompts form which minibatch, which group, in which dispatch order.

The schedule needs the predictions and the prompt count only, never the
prompts themselves; :func:`aspc.compiler.compile_plan` lays the prompts out
by it. It is a deterministic function of ``(prediction, config, n)``: the
same inputs give the same schedule, on any thread and any machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aspc import portable_math as pm
from aspc.choices import ORDERS, Strategy, parse_strategy
from aspc.compile_config import CompileConfig, resolve_groups, resolve_sizes
from aspc.errors import ConfigError
from aspc.guards import check_lengths
from aspc.predict.base import LengthPrediction
from aspc.progress import NULL_PROGRESS, Progress


@dataclass
class Schedule:
    """The arrangement of ``n`` prompts (indices into the prediction's rows).

    ``rows`` is the partition order; minibatch ``k`` holds ``rows[bounds[k]:bounds[k+1]]``.
    The per-row arrays (``mean_r`` ...) are the predictions in that order, which the
    plan's columns and the costs read.
    """

    n: int
    b: int
    d: int
    rows: np.ndarray
    bounds: np.ndarray
    costs: np.ndarray  # per minibatch, partition numbering
    assignment: np.ndarray  # group of each minibatch
    mb_order: np.ndarray  # dispatch order of the minibatches
    n_groups: int
    mean_r: np.ndarray
    nseq_r: np.ndarray
    q_r: dict[str, np.ndarray]
    extra: dict[str, Any] = field(default_factory=dict)  # plan metrics the schedule decides


def _constant(p: LengthPrediction) -> bool:
    return all(np.all(a == a[0]) for a in (p.mean, p.q10, p.q50, p.q90))


def _fixed_bounds(n: int, b: int) -> np.ndarray:
    return np.r_[np.arange(0, n, b), n].astype(np.int64)


def schedule_prompts(
    prediction: LengthPrediction,
    config: CompileConfig,
    n: int,
    progress: Progress = NULL_PROGRESS,
    ids: Any = None,
) -> Schedule:
    """Partition, anneal and order ``n`` prompts by their predictions.

    ``config`` is already resolved for its target (:func:`aspc.compile_config.for_target`).
    ``ids``: the prompts' unique ids (an Arrow string array), by which asp orders equal
    predictions; without them a seeded permutation of the rows does, which follows line order.

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
    from aspc.partition import partition

    strategy = parse_strategy(config.strategy)
    if config.minibatch_cost not in MINIBATCH_COSTS:
        raise ConfigError(
            f"unknown cost model {config.minibatch_cost!r} (--minibatch-cost); use one of {', '.join(MINIBATCH_COSTS)}"
        )
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
        # asp breaks equal predictions by a seeded key of each prompt's id, not by
        # input order: its plan must not depend on how the input's lines are sorted.
        # The sorted baseline keeps input order among ties (an exported sorted
        # plan recompiles to itself).
        if strategy is not Strategy.ASP:
            rows = np.argsort(mean, kind="stable")
        elif ids is None:
            rows = shuffled[np.argsort(mean[shuffled], kind="stable")]
        else:
            rows = _by_prediction(mean, ids, config.seed)
        if strategy is Strategy.ASP and config.order != "ascending":
            bounds = partition(mean[rows], b, d, overhead=config.minibatch_overhead)
        else:  # equal minibatches: under a staleness bound unequal ones end apart (aspc.choices.ORDERS)
            bounds = _fixed_bounds(n, b)
    del shuffled
    progress.done()

    # Every per-row input of the cost and order kernels, in partition order (gathered once).
    mean_r, nseq_r = mean[rows], nseq[rows]
    q_r = {k: np.asarray(getattr(prediction, k), dtype=np.float64)[rows] for k in ("q10", "q50", "q90")}

    costs = minibatch_costs(
        config.minibatch_cost,
        bounds,
        nseq_r,
        mean_r,
        q_r["q10"],
        q_r["q50"],
        q_r["q90"],
        cap=config.max_response_length,
    )
    m = costs.size
    n_groups = resolve_groups(config, m)
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
    if config.equal_samples:  # as equal as the minibatches' sizes allow: recorded, and said when not equal
        per_group = np.bincount(assignment, weights=np.diff(bounds), minlength=n_groups) * config.samples_per_prompt
        extra["group_samples_range"] = [int(per_group.min()), int(per_group.max())]

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
        seq_sizes = np.diff(bounds) * config.samples_per_prompt
        mb_order = np.asarray(dispatch_order(costs, seq_sizes, assignment, n_groups), dtype=np.int64)
        if config.workers is not None:
            mb_order = _front_load_heavy(mb_order, costs, assignment, config.workers)
        extra["order"] = "interleave"
    else:
        mb_order = np.arange(m, dtype=np.int64)
    progress.done()
    return Schedule(n, b, d, rows, bounds, costs, assignment, mb_order, n_groups, mean_r, nseq_r, q_r, extra)


def _front_load_heavy(order: np.ndarray, costs: np.ndarray, assignment: np.ndarray, workers: int) -> np.ndarray:
    """Move groups holding very long minibatches, and those minibatches, to the front.

    A minibatch of cost ``c`` dispatched after work ``w`` ends no earlier than
    ``w / W + c``; to keep the makespan at its bound ``total / W`` a minibatch
    longer than half a worker's share must start near the beginning (the LPT
    rule of Graham 1969 for the few jobs that dominate). Groups stay
    contiguous: heavy groups go first, heaviest first, each with its heavy
    minibatches leading; everything else keeps the interleaved order.
    """
    threshold = 0.5 * pm.sum(costs) / workers  # np.sum's NumPy 2.3 bits on any NumPy
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


def _by_prediction(mean: np.ndarray, ids: Any, seed: int) -> np.ndarray:
    """Rows by predicted mean; equal means in a seeded order of their ids, never in the input's line order.

    A seeded permutation of row positions still followed the lines: which prompt a position
    holds is the file's order. Here a tied prompt's place comes from a seeded key of its id
    (:func:`aspc.schedule_kernel.id_keys`), so the same prompts in any order give the same rows
    (two ids of one key, a 64-bit hash collision, keep their input order).

    One radix sort by (mean, key): NumPy's stable sort of the means and a second of the tied
    rows' keys took 0.49 s for 1M rows of integer lengths, this 0.07 s.
    """
    from aspc.schedule_kernel import float_order_bits, lex_argsort

    if len(ids) != mean.size:  # the kernel indexes both without bounds checks
        raise ValueError(f"{len(ids)} ids for {mean.size} predictions")
    return lex_argsort(float_order_bits(np.ascontiguousarray(mean, dtype=np.float64)), _id_keys(ids, seed))


def _id_keys(ids: Any, seed: int) -> np.ndarray:
    """Seeded uint64 keys of ``ids`` from the Arrow string column's own buffers (no Python string per id).

    Every id, in row order: reading the buffers front to back costs less than reaching the tied rows.
    Chunk by chunk: a column of more than 2 GiB of ids cannot be combined into one.
    """
    import pyarrow as pa

    from aspc.schedule_kernel import id_keys

    chunks = ids.chunks if isinstance(ids, pa.ChunkedArray) else [ids]
    out = [np.empty(0, dtype=np.uint64)]
    for arr in chunks:
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            arr = arr.cast(pa.string())
        off_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
        offsets = np.frombuffer(arr.buffers()[1], dtype=off_type)[arr.offset : arr.offset + len(arr) + 1]
        data = arr.buffers()[2]
        buf = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(1, dtype=np.uint8)
        offsets = offsets.astype(np.int64)
        # FNV-1a and SplitMix64 wrap modulo 2**64 on purpose: interpreted (NUMBA_DISABLE_JIT=1),
        # NumPy scalars would warn at each wrap. Compiled code ignores NumPy's error state.
        with np.errstate(over="ignore"):
            out.append(id_keys(buf, offsets[:-1], offsets[1:], np.uint64(seed)))
    return np.concatenate(out)
