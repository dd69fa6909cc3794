"""The compile options' named choices: schedule strategies and minibatch cost models.

A leaf module (no numpy, pyarrow or numba), so the CLI lists the names in
``--help`` without loading the compiler. :mod:`aspc.compiler` implements the
strategies, :mod:`aspc.costs` the minibatch costs.
"""

from __future__ import annotations

from enum import Enum

from aspc.errors import ConfigError

__all__ = ["MINIBATCH_COSTS", "STRATEGIES", "Strategy", "parse_strategy"]


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
