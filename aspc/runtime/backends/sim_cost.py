"""The simulator's cost model (:class:`SimCostModel`): seconds per decode step, prefill and trainer step.

Not the compiler's minibatch cost (``--minibatch-cost``, :mod:`aspc.costs`),
which ranks minibatches in token-slots; this one times them in seconds.

A decode step of a worker with ``active`` sequences holding ``Σcontext``
tokens of context (prompt plus tokens generated so far, summed over the active
sequences) costs ``a + b·active + c·Σcontext`` seconds: the linear step model
of published LLM-serving simulators (weights read once per step, per-sequence
compute, attention over the KV cache). A minibatch adds a prefill term
``p0 + p1·prompt_tokens`` (parallel samples of one prompt share its prefill).
A trainer step over a global batch costs ``α + β·tokens`` with tokens = prompt
+ response tokens of its samples.

Defaults are illustrative assumptions, not measurements: an 8B-parameter
dense model in bf16 on one H100-class device per worker.

- ``decode_base`` a = 10 ms: reading 16 GB of weights at ~2 TB/s effective
  (8 ms) plus launch overhead.
- ``decode_per_seq`` b = 50 µs: 16 GFLOP per token at ~320 TFLOP/s effective,
  plus sampling.
- ``decode_per_context_token`` c = 65 ns: a Llama-3-8B KV cache holds
  128 KiB per token, read once per step at ~2 TB/s.
- ``prefill_base`` = 10 ms, ``prefill_per_token`` = 40 µs: compute-bound
  prefill at ~400 TFLOP/s.
- ``train_per_token`` β = 10 µs: a policy-gradient step costs ~80 GFLOP per
  token for an 8B model (6N forward + backward, plus 4N for the old-policy
  and reference log-probabilities), on a trainer of 20 such devices at
  ~400 TFLOP/s effective each. ``train_base`` α = 0.5 s: optimizer step and
  publishing the new weights.

The trainer is the assumption that matters most for comparing schedules. An
asynchronous RL pipeline is sized so that generation is the bottleneck and
the trainer is busy 30-50% of the run (it must absorb bursts of samples
without stalling the workers, and it costs less than generation); with these
coefficients the CASTILLO reference scenario (``benchmarks/rl_reference.py``:
8 samples per prompt, responses capped at 4,096 tokens, W = 8, global batch
256) keeps the trainer busy 25-49% of the run under the random schedule,
44-68% under the oracle's. With the earlier β = 25 µs (8 trainer devices) the
trainer was busy 70-95%: a trainer-bound pipeline, where no generation
schedule can shorten iterations much.

``aspc calibrate RUN`` fits every coefficient from a real run log.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aspc.atomic import atomic_write_bytes
from aspc.errors import ConfigError

# Seconds per step, per sequence or per token. A million seconds (11.6 days) is
# far past any device; the bound keeps every simulated time finite (a step of
# 10^9 context tokens for 10^9 steps stays below 1e33 s), where 1e306 made the
# simulator's sums overflow to inf and its kernels index out of range.
COEFFICIENT_MAX = 1e6


@dataclass(frozen=True)
class SimCostModel:
    """Coefficients of the simulator's step-time model, seconds; all >= 0."""

    decode_base: float = 0.010  # a: seconds per decode step, whatever the batch
    decode_per_seq: float = 5e-5  # b: seconds per active sequence per decode step
    decode_per_context_token: float = 6.5e-8  # c: seconds per context token of the active sequences, per step
    prefill_base: float = 0.010  # seconds per minibatch before its first decode step
    prefill_per_token: float = 4e-5  # seconds per prompt token (once per prompt, not per sample)
    train_base: float = 0.5  # α: seconds per trainer step
    train_per_token: float = 1e-5  # β: seconds per prompt+response token in the global batch (20 devices)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            # An int is compared as it is: math.isfinite() of a 400-digit JSON integer raised OverflowError.
            number = isinstance(v, (int, float)) and not isinstance(v, bool)
            huge = number and isinstance(v, int) and abs(v) > 1e300
            digits = f"an integer of {len(str(abs(v)))} digits" if huge else ""
            if not number or not (isinstance(v, int) or math.isfinite(v)) or v < 0:
                raise ConfigError(f"cost model {f.name} must be a finite number >= 0, got {digits or repr(v)}")
            if v > COEFFICIENT_MAX:
                raise ConfigError(
                    f"cost model {f.name} must be <= {COEFFICIENT_MAX:g} seconds, got {digits or repr(v)}; "
                    "fix the cost-model file (aspc calibrate writes one)"
                )

    def to_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in dataclasses.fields(self)}


SIM_COST_MODEL_KEYS = tuple(f.name for f in dataclasses.fields(SimCostModel))


def sim_cost_model_from_dict(values: dict, *, source: str = "cost model") -> SimCostModel:
    """A :class:`SimCostModel` with the given coefficients; the rest keep their defaults.

    Raises
    ------
    ConfigError
        Unknown keys (a typo would otherwise silently keep a default), or values
        that are not finite numbers >= 0.
    """
    from aspc.io.readers import HugeInt

    if not isinstance(values, dict):
        raise ConfigError(f"{source}: expected a JSON object of coefficients, got {type(values).__name__}")
    unknown = sorted(set(values) - set(SIM_COST_MODEL_KEYS))
    if unknown:
        raise ConfigError(f"{source}: unknown keys {unknown}; allowed keys are {', '.join(SIM_COST_MODEL_KEYS)}")
    for k, v in values.items():  # json_int kept an integer past Python's 4,300-digit conversion limit unconverted
        if isinstance(v, HugeInt):
            bound = "a finite number >= 0" if v.negative else f"<= {COEFFICIENT_MAX:g} seconds"
            raise ConfigError(f"{source}: cost model {k} must be {bound}, got a {'-' * v.negative}{v.digits:,}-digit "
                              "integer; fix the cost-model file (aspc calibrate writes one)")  # fmt: skip
    try:
        return SimCostModel(**{k: v for k, v in values.items()})
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_sim_cost_model(path: str | os.PathLike) -> SimCostModel:
    """Read a cost-model JSON file (as ``aspc calibrate`` writes)."""
    from aspc.io.readers import json_int

    path = Path(path)
    if path.exists() and not path.is_dir() and not path.is_file():  # a FIFO waited forever; /dev/zero filled memory
        raise ConfigError(f"{path}: not a regular file (a pipe, socket or device); save the cost model to a file "
                          "and pass that to --cost-model")  # fmt: skip
    try:
        # json_int and the RecursionError: the dataset readers' guards, so a 5,001-digit integer or a deep nest
        # is one line, not Python's ValueError or RecursionError traceback.
        values = json.loads(path.read_text(encoding="utf-8"), parse_int=json_int, object_pairs_hook=_no_repeats(path))
    except FileNotFoundError:
        raise ConfigError(f"{path}: cost-model file not found; check --cost-model") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path.name}: not valid JSON ({exc}); fix the cost-model file") from None
    except RecursionError:
        raise ConfigError(f"{path.name}: JSON nested too deeply; fix the cost-model file") from None
    return sim_cost_model_from_dict(values, source=path.name)


def _no_repeats(path: Path) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """An ``object_pairs_hook`` refusing a key given twice: json.loads kept the last and dropped the first unsaid."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for k, v in items:
            if k in seen:
                raise ConfigError(f"{path.name}: key {k!r} is given twice; keep one value per coefficient")
            seen[k] = v
        return seen

    return pairs


def save_sim_cost_model(model: SimCostModel, path: str | os.PathLike) -> None:
    """Write ``model`` as JSON atomically."""
    atomic_write_bytes(path, (json.dumps(model.to_dict(), indent=2, sort_keys=True) + "\n").encode())
