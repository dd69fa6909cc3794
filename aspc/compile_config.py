"""The compile configuration: every option of ``aspc compile``, and the sizes it resolves to.

Shared by the schedule (:mod:`aspc.schedule`) and the compile pipeline
(:mod:`aspc.compiler`, which re-exports it); it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass

from aspc.errors import ConfigError, InputError

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
    head: str | None = None  # target-model head of a multi-model predictor (--target); None -> pooled
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


def for_target(config: CompileConfig) -> CompileConfig:
    """``config`` as its trainer target implies (``--for verl``: every minibatch exactly B prompts, K per group)."""
    if config.target != "verl":
        return config
    from aspc.profiles import verl_config

    return verl_config(config, DEFAULT_BATCH_SIZE, DEFAULT_GROUP_SIZE)
