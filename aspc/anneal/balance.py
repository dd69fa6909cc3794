"""Checked wrapper and Python driver of the group-balancing annealer."""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

from aspc.anneal.equal_samples import level_samples
from aspc.anneal.kernel import (
    AnnealState,
    _anneal_chunk,
    _best_assignment,
    _kk_kernel,
    _lpt_kernel,
    _tree_build,
)
from aspc.errors import ConfigError, InputError
from aspc.progress import NULL_PROGRESS, Progress

INITS = ("kk", "lpt")

# Geometric schedule T_k = T0 * ALPHA**k over LEVELS levels (Kirkpatrick et al.
# 1983), T0 = T0_FRACTION * mean minibatch cost. Literals and repeated
# multiplication, not pow(), keep it bitwise identical on every machine. Tuned
# on lognormal costs with 1-20 minibatches per group and 2-5000 groups: hot
# enough that tiny instances escape their local optima (all of 300 random
# M <= 8 instances reach the brute-force optimum), cool enough that large
# ones keep the start's structure; 0.8**40 ~ 1e-4 ends below any useful swap.
LEVELS = 40
ALPHA = 0.8
T0_FRACTION = 0.1
# Proposal mix (see _anneal_chunk): P(heaviest group x cheaper minibatch) = 0.25,
# P(heaviest group x halving partner in a random group) = 0.5, the rest uniform
# pairs. Targeted moves do the work; uniform ones keep the chain ergodic.
MOVE_MIX = np.array([0.25, 0.75])
MAX_DEFAULT_ITERATIONS = 400_000  # ~0.2 s compiled for 60k minibatches
ITERATIONS_PER_MINIBATCH = 100
MIN_DEFAULT_ITERATIONS = 20_000  # small instances: a few ms
EARLY_STOP_RTOL = 1e-9  # a max load this close to the bound is optimal


class BalanceResult(NamedTuple):
    """Groups of minibatches with near-equal predicted work."""

    assignment: np.ndarray  # int32[M], group (0..G-1) of each minibatch; every group non-empty
    loads: np.ndarray  # float64[G], summed cost of each group, same unit as costs
    lower_bound: float  # max(total / G, largest single cost): no assignment beats it
    cardinality_bound: float  # lower_bound tightened by group sizes (see _cardinality_bound)
    imbalance: float  # max(loads) / lower_bound - 1 (0 when all costs are 0)
    iterations_run: int  # swap proposals the annealer made (0: start kept as is)
    init_imbalance: float  # imbalance of the KK / LPT start; imbalance <= this always
    init: str  # start used: "kk", "lpt" or "samples-lpt" (equal_samples)


def default_iterations(n_minibatches: int) -> int:
    """Default proposal budget for ``n_minibatches`` minibatches."""
    return min(MAX_DEFAULT_ITERATIONS, max(MIN_DEFAULT_ITERATIONS, ITERATIONS_PER_MINIBATCH * n_minibatches))


def _seed_state(seed: int) -> np.ndarray:
    # splitmix64 (Steele et al. 2014) in Python ints spreads nearby seeds apart.
    z = (seed + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return np.array([z or 0x9E3779B97F4A7C15], dtype=np.uint64)


def _int(name: str, value: object, minimum: int, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}; {hint}")
    return int(value)


def _int_array(name: str, values: object, length: int, minimum: int) -> np.ndarray:
    arr = np.asarray(values)
    if arr.shape != (length,):
        raise InputError(f"{name} must have shape ({length},), got {arr.shape}; pass one value per entry")
    if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and np.all(np.mod(arr, 1) == 0)):
        raise InputError(f"{name} must hold whole numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if length and arr.min() < minimum:
        raise InputError(f"{name} must be >= {minimum} everywhere; got {arr.min()}")
    return arr


def _check_costs(costs: object) -> np.ndarray:
    try:
        arr = np.ascontiguousarray(costs, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"costs must be real numbers ({exc}); pass a 1-D numeric array") from None
    if arr.ndim != 1 or arr.size == 0:
        raise InputError(f"costs must be a non-empty 1-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or arr.min() < 0:
        raise InputError("costs must be finite and >= 0; fix the cost model's output")
    return arr


def _check_groups(m, g, group_sizes, sample_sizes, equal_samples) -> tuple[np.ndarray, np.ndarray | None]:
    """Validated group capacities and sample sizes."""
    if group_sizes is None:
        caps = _capacities(m, g)
    else:
        caps = _int_array("group_sizes", group_sizes, g, 1)
        if int(caps.sum()) != m:
            raise ConfigError(f"group_sizes sum to {int(caps.sum())}, not M = {m}; make them add up to M")
    samples = None if sample_sizes is None else _int_array("sample_sizes", sample_sizes, m, 1)
    if equal_samples and samples is None:
        raise ConfigError("equal_samples=True needs sample_sizes (sequences per minibatch)")
    return caps, samples


def _capacities(n_items: int, n_groups: int) -> np.ndarray:
    q, r = divmod(n_items, n_groups)
    caps = np.full(n_groups, q, np.int64)
    # The larger groups go last: LPT gives the costliest minibatches to the
    # lowest-numbered groups, and an outlier belongs in a smaller group.
    caps[n_groups - r :] += 1
    return caps


def _cardinality_bound(costs: np.ndarray, caps: np.ndarray, lower_bound: float) -> float:
    """``lower_bound`` tightened by the group sizes.

    The group holding the costliest minibatch holds at least ``min(caps) - 1``
    others, each no cheaper than the cheapest remaining ones.
    """
    k = int(caps.min()) - 1
    if k == 0:
        return lower_bound
    top = int(np.argmax(costs))
    rest = np.delete(costs, top)
    return max(lower_bound, float(costs[top]) + math.fsum(np.partition(rest, k - 1)[:k]))


def _relabel_to_caps(group_of: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Rename groups so that group g holds caps[g] items (counts must match as multisets)."""
    counts = np.bincount(group_of, minlength=caps.size)
    src = np.argsort(-counts, kind="stable")
    dst = np.argsort(-caps, kind="stable")
    rename = np.empty(caps.size, np.int32)
    rename[src] = dst
    return rename[group_of]


def _start(costs, caps, init, sample_sizes, equal_samples):
    idx = np.arange(costs.size)
    by_cost = np.lexsort((idx, -costs))
    if equal_samples:
        order = np.lexsort((idx, -costs, -sample_sizes))
        start = _lpt_kernel(order, sample_sizes.astype(np.float64), costs, caps)
        return level_samples(start, sample_sizes, caps.size), "samples-lpt"
    if init == "lpt":
        return _lpt_kernel(by_cost, costs, np.zeros_like(costs), caps), "lpt"
    if caps.max() - caps.min() > 1:
        raise ConfigError("init='kk' needs group sizes that differ by at most one; use init='lpt'")
    return _relabel_to_caps(_kk_kernel(costs, by_cost, caps.size), caps), "kk"


def _state(costs, group_of, n_groups, classes, seed) -> AnnealState:
    """The annealer's arrays for a start ``group_of`` (fields: see AnnealState)."""
    m = costs.size
    by_group = np.argsort(group_of, kind="stable")
    slot = np.empty(m, np.int64)
    slot[by_group] = np.arange(m)
    group_start = np.concatenate(([0], np.cumsum(np.bincount(group_of, minlength=n_groups)))).astype(np.int64)
    loads = np.bincount(group_of, weights=costs, minlength=n_groups)
    half = 1 << max(0, (n_groups - 1).bit_length())
    tree_max = np.empty(2 * half)
    tree_arg = np.empty(2 * half, np.int64)
    _tree_build(tree_max, tree_arg, loads)
    _, class_of = np.unique(classes, return_inverse=True)
    class_of = class_of.astype(np.int64)
    class_start = np.concatenate(([0], np.cumsum(np.bincount(class_of)))).astype(np.int64)
    class_members = np.lexsort((np.arange(m), costs, class_of)).astype(np.int64)
    rank = np.empty(m, np.int64)
    rank[class_members] = np.arange(m) - class_start[class_of[class_members]]
    return AnnealState(
        costs=costs,
        group_of=group_of.astype(np.int32),
        slot=slot,
        members=by_group.astype(np.int64),
        group_start=group_start,
        loads=loads,
        tree_max=tree_max,
        tree_arg=tree_arg,
        class_of=class_of,
        class_start=class_start,
        class_members=class_members,
        rank=rank,
        snapshot=group_of.astype(np.int32),
        journal=np.zeros((max(m, 1024), 2), np.int64),
        marks=np.zeros(2, np.int64),
        best_max=np.array([loads.max()]),
        rng=_seed_state(seed),
    )


def _anneal(state: AnnealState, budget: int, t0: float, target: float, progress: Progress) -> int:
    """Drive the temperature schedule level by level; return proposals made."""
    # Scaled so the sum-of-squares term moves by d * (d - load gap) / (G * mean):
    # second order next to the max load, a tie-breaker on its plateaus.
    kappa = 1.0 / (2.0 * math.fsum(state.costs))  # 1 / (2 G mean load)
    # Costs summing below ~1e-308 overflow it to inf, and inf * 0 makes the energy
    # NaN; the term it weighs underflows to 0 at such costs anyway, so drop it.
    kappa = kappa if math.isfinite(kappa) else 0.0
    temperature = t0
    done = 0
    progress.stage("anneal", LEVELS)
    for level in range(LEVELS):
        n = budget * (level + 1) // LEVELS - budget * level // LEVELS
        ran = _anneal_chunk(state, n, temperature, kappa, target, MOVE_MIX)
        done += ran
        progress.advance()
        if ran < n:
            break
        temperature *= ALPHA
    progress.done()
    return done


def balance(
    costs: np.ndarray,
    n_groups: int,
    *,
    seed: int = 0,
    iterations: int | None = None,
    group_sizes: np.ndarray | None = None,
    sample_sizes: np.ndarray | None = None,
    equal_samples: bool = False,
    init: str = "kk",
    progress: Progress | None = None,
) -> BalanceResult:
    """Assign minibatches to groups of near-equal total cost.

    Parameters
    ----------
    costs : array_like of float, shape (M,)
        Predicted cost of each minibatch (e.g. padded tokens), finite, ``>= 0``.
    n_groups : int
        Number of groups ``G``, ``1 <= G <= M``.
    seed : int, default 0
        Seed of the annealer's random stream, ``>= 0``. Same inputs and seed
        give a byte-identical result, compiled or under ``NUMBA_DISABLE_JIT=1``.
    iterations : int, optional
        Swap proposals to make at most (``0``: return the start). Default
        :func:`default_iterations`: ``100 * M`` clipped to ``[20_000, 400_000]``.
    group_sizes : array_like of int, shape (G,), optional
        Minibatches per group, each ``>= 1``, summing to ``M``. Default: every
        group holds ``M // G`` or ``M // G + 1``, the last ``M mod G`` groups
        the larger number.
    sample_sizes : array_like of int, shape (M,), optional
        Sequences per minibatch, each ``>= 1``; used only with ``equal_samples``.
    equal_samples : bool, default False
        Balance the groups' sample counts before their cost (see Notes).
    init : {"kk", "lpt"}, default "kk"
        Start: balanced Karmarkar–Karp differencing, or LPT under the group
        sizes. ``"kk"`` needs group sizes that differ by at most one.
    progress : Progress, optional
        Receives one ``advance`` per temperature level.

    Returns
    -------
    BalanceResult
        ``assignment``, ``loads``, ``lower_bound``, ``cardinality_bound``,
        ``imbalance``, ``iterations_run``, ``init_imbalance`` and ``init``.

    Raises
    ------
    InputError
        If costs, group sizes or sample sizes are malformed.
    ConfigError
        If ``n_groups`` is not in ``[1, M]``, or another option is invalid.

    Notes
    -----
    Objective: the largest group load (makespan), against the lower bound
    ``LB = max(sum(costs) / G, max(costs))``. The start is the balanced
    largest differencing method (Karmarkar & Karp 1982; its balanced form:
    Michiels, Korst, Aarts & van Leeuwen 2003) or largest-processing-time
    first restricted to groups with room (Graham 1969). Simulated annealing
    (Kirkpatrick, Gelatt & Vecchi 1983) then swaps two minibatches between
    groups, which keeps every group's cardinality; energy is the max load
    plus a small sum-of-squared-loads term so moves off the heaviest group
    still level the others. It runs a geometric schedule of ``LEVELS``
    temperatures from a tenth of the mean minibatch cost, keeps the best
    state seen (never worse than the start), and stops early once the max
    load is within ``1e-9`` of ``cardinality_bound``. This is the grouping
    stage of ASP (Chikhi et al., arXiv 2611.08864), which balances groups'
    predicted output so short and long minibatches can be interleaved.

    Equal samples. With ``equal_samples=True`` the start is "samples-lpt":
    minibatches by sample count descending (then cost descending, then
    index) each go to the group with room holding the fewest samples (then
    the least cost, then the lowest index); swaps of unequal sizes between
    groups then level the sample counts where the sizes allow
    (:func:`aspc.anneal.equal_samples.level_samples`). The annealer then swaps only
    minibatches of equal sample count, so every group's sample count and
    cardinality stay those of the start, and only cost is balanced. ``init``
    is ignored in that mode.
    """
    arr = _check_costs(costs)
    m = arr.size
    g = _int("n_groups", n_groups, 1, f"use --groups between 1 and M = {m}")
    if g > m:
        raise ConfigError(f"n_groups = {g} exceeds the {m} minibatches; use --groups <= M ({m})")
    seed = _int("seed", seed, 0, "pass a non-negative seed")
    budget = (
        default_iterations(m) if iterations is None else _int("iterations", iterations, 0, "pass 0 or more")
    )
    if init not in INITS:
        raise ConfigError(f"init must be one of {', '.join(INITS)}, got {init!r}")
    caps, samples = _check_groups(m, g, group_sizes, sample_sizes, equal_samples)

    group_of, init_used = _start(arr, caps, init, samples, equal_samples)
    lower_bound = max(math.fsum(arr) / g, float(arr.max()))
    bound = _cardinality_bound(arr, caps, lower_bound)
    target = bound * (1.0 + EARLY_STOP_RTOL)
    init_loads = np.bincount(group_of, weights=arr, minlength=g)
    init_max = float(init_loads.max())

    progress = progress or NULL_PROGRESS
    ran = 0
    loads = init_loads
    if g > 1 and budget > 0 and init_max > target:
        classes = samples if equal_samples else np.zeros(m, np.int64)
        state = _state(arr, group_of, g, classes, seed)
        t0 = T0_FRACTION * math.fsum(arr) / m
        ran = _anneal(state, budget, t0, target, progress)
        found = _best_assignment(state)
        found_loads = np.bincount(found, weights=arr, minlength=g)
        # Recomputed loads decide, not the kernel's running sums, so the
        # result is never worse than the start even by rounding.
        if found_loads.max() <= init_max:
            group_of, loads = found, found_loads
    else:  # nothing to anneal: the stage still shows, done at once
        progress.stage("anneal")
        progress.done()

    assignment = np.ascontiguousarray(group_of, dtype=np.int32)
    if not np.array_equal(np.bincount(assignment, minlength=g), caps):
        raise AssertionError("balance broke its cardinality invariant; please report this bug")

    def imbalance(max_load: float) -> float:
        return max_load / lower_bound - 1.0 if lower_bound > 0 else 0.0

    return BalanceResult(
        assignment=assignment,
        loads=loads,
        lower_bound=lower_bound,
        cardinality_bound=bound,
        imbalance=imbalance(float(loads.max())),
        iterations_run=ran,
        init_imbalance=imbalance(init_max),
        init=init_used,
    )
