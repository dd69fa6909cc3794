"""The compile options' named choices: schedule strategies and minibatch cost models.

A leaf module (no numpy, pyarrow or numba), so the CLI lists the names in
``--help`` without loading the compiler. :mod:`aspc.compiler` implements the
strategies, :mod:`aspc.costs` the minibatch costs.
"""

from __future__ import annotations

from enum import Enum

from aspc.errors import ConfigError

__all__ = [
    "EXPORT_FORMATS",
    "MINIBATCH_COSTS",
    "ON_BAD_LINE",
    "ORDERS",
    "DEFAULT_ORDER",
    "BOUNDED_ORDER",
    "PREDICTOR_KINDS",
    "REPLAN_EVERY",
    "STRATEGIES",
    "TARGETS",
    "Strategy",
    "parse_strategy",
]


class Strategy(str, Enum):
    """How prompts become minibatches and in which order they are dispatched."""

    ASP = "asp"  # sort + DP boundaries + annealed groups + interleaved order
    SORTED = "sorted"  # sort + fixed-size minibatches dispatched shortest first
    RANDOM = "random"  # shuffled fixed-size minibatches: the unscheduled baseline


STRATEGIES = tuple(s.value for s in Strategy)


def parse_strategy(name: str) -> Strategy:
    try:
        return Strategy(name)
    except ValueError:
        raise ConfigError(f"unknown strategy {name!r}; use one of {', '.join(STRATEGIES)}") from None


# --minibatch-cost: "padded" = sequences x max predicted mean; "expected-max" =
# sequences x the expected maximum of their sampled lengths (see aspc.costs).
MINIBATCH_COSTS = ("padded", "expected-max")

# --order: "lpt" = groups, and minibatches within them, longest first on the upper
# quantile (aspc.anneal.lpt); "interleave" = the preprint's short/long interleaving.
# "ascending" = for runs under --max-staleness K: equal minibatches (no slack) of prompts sorted by
# prediction, shortest first, consecutive ones grouped, no annealing. A bound makes the pipeline nearly
# synchronous: a long minibatch in flight holds the trainer at its version + K, so minibatches running
# side by side should end together, the opposite of asp's interleaving (README: on the reference
# scenario, K = 2/4/8, lpt 1.10/1.06/1.03 x random under the same bound, ascending 0.95/0.98/0.98).
ORDERS = ("lpt", "interleave", "ascending")
# The order a plan gets when none is asked for: lpt, or ascending for a run under a staleness bound.
DEFAULT_ORDER, BOUNDED_ORDER = "lpt", "ascending"

# --for: trainer profiles (aspc.profiles).
TARGETS = ("verl",)

# --on-bad-line: fail on a malformed input row, or skip it and report it.
ON_BAD_LINE = ("error", "skip")

# --kind: predictors that aspc.predict can train and load.
PREDICTOR_KINDS = ("lexical", "transformer", "static")

# aspc export --format.
EXPORT_FORMATS = ("verl", "jsonl")

# --replan re-plans after every this many trainer steps by default (8 beat 2
# and 4 on the CASTILLO reference scenario: a correction needs enough new
# prompts). Here so the CLI shows it without loading the re-planner.
REPLAN_EVERY = 8
