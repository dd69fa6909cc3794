"""Options of the real generation backends (``hf``, ``vllm``), parsed once from ``BackendContext.options``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aspc.errors import ConfigError

if TYPE_CHECKING:  # annotations only: the CLI reads DTYPES for --help without numpy
    import numpy as np

DTYPES = ("auto", "float32", "float16", "bfloat16")  # --dtype; auto = float32 on CPU, bfloat16 elsewhere

# Keys of BackendContext.options that the real backends read (the CLI fills them).
OPTION_KEYS = (
    "model",  # --model: local HF directory, .gguf file, or a bundled alias
    "device",  # --device: auto | cpu | cuda[:N] | npu[:N]
    "dtype",  # --dtype: auto | float32 | float16 | bfloat16
    "max_new_tokens",  # --max-new-tokens
    "temperature",  # --temperature
    "top_p",  # --top-p
    "top_k",  # --top-k
    "seed",  # --seed
    "replay",  # --replay-lengths
    "replay_lengths",  # prompt id -> observed lengths (from --actual-lengths)
    "replay_source",  # name of the lengths file, for messages
    "return_payload",  # hand tokens and text to the trainer (default True)
    "engine_args",  # --engine-arg KEY=VALUE: extra vllm.LLM keyword arguments (vllm only)
)


@dataclass(frozen=True)
class GenerationOptions:
    """What a real backend needs besides the plan; every field has a CLI flag."""

    model: str  # resolved local Hugging Face causal-LM directory
    device: str = "auto"  # auto = NPU > CUDA > CPU; a Ray actor picks among its own devices
    dtype: str = "auto"  # auto = float32 on CPU, bfloat16 on accelerators
    # Cap on generated tokens per sequence. None: the longest replayed length
    # (replay mode), else DEFAULT_MAX_NEW_TOKENS.
    max_new_tokens: int | None = None
    temperature: float = 1.0  # 0 = greedy; sampling otherwise (RL needs samples that differ)
    top_p: float = 1.0  # nucleus mass kept, (0, 1]; 1 = off
    top_k: int = 0  # tokens kept; 0 = off
    seed: int = 0  # seeds the sampling (hf: each minibatch from (seed, minibatch); vllm: worker w uses seed + w)
    replay: bool = False  # force each sequence to end at its recorded length
    replay_lengths: dict[str, np.ndarray] | None = None  # prompt id -> observed lengths, for replay
    replay_source: str = ""  # where replay lengths came from, for messages
    return_payload: bool = True  # per-sample token ids and text for a real trainer
    engine_args: dict[str, Any] | None = None  # extra vllm.LLM keyword arguments (--engine-arg); vllm only

    def validate(self) -> None:
        """Raise :class:`ConfigError` for values no generation could use."""
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        check_sampling(self.temperature, self.top_p, self.top_k)
        if self.replay and self.replay_lengths is None:
            raise ConfigError("--replay-lengths needs the recorded lengths: pass --actual-lengths FILE --length-field F")

    def for_worker_process(self) -> GenerationOptions:
        """A copy without the replay table, which only the driver needs (requests carry the lengths)."""
        return GenerationOptions(**{**self.__dict__, "replay_lengths": None, "replay": False})


# Below it vLLM treats a temperature as greedy (its sampling epsilon) and hf's logits / T overflow.
MIN_TEMPERATURE = 1e-5


def check_sampling(temperature: float | None, top_p: float | None, top_k: int | None) -> None:
    """Sampling values no generation could use (``None``: left at the default).

    Checked for every backend, the simulator too: a sim rehearsal must fail
    where the real run with the same options would.
    """
    if temperature is not None and (not math.isfinite(temperature) or temperature < 0):
        raise ConfigError(f"--temperature must be >= 0 (0 = greedy), got {temperature}")
    if temperature is not None and 0 < temperature < MIN_TEMPERATURE:
        # Logits divided by it overflow float32 (hf: every minibatch failed at run time); vLLM decodes greedily.
        raise ConfigError(f"--temperature {temperature} is too small to sample with (below {MIN_TEMPERATURE:g}); "
                          "pass 0 for greedy decoding")  # fmt: skip
    if top_p is not None and not (0 < top_p <= 1):
        raise ConfigError(f"--top-p must be in (0, 1], got {top_p}")
    if top_k is not None and not 0 <= top_k <= 2**31 - 1:  # engines hold k in an int32
        raise ConfigError(f"--top-k must be >= 0 (0 = off) and <= 2147483647, got {top_k}")


DEFAULT_MAX_NEW_TOKENS = 256  # without replay or --max-new-tokens: long enough for short RL answers


def options_from_context(options: dict[str, Any]) -> GenerationOptions:
    """Parse ``BackendContext.options`` into :class:`GenerationOptions` (model path not yet resolved)."""
    unknown = sorted(set(options) - set(OPTION_KEYS) - {"trainer_args"})
    if unknown:
        raise ConfigError(f"unknown backend options {unknown}; known: {', '.join(OPTION_KEYS)}")
    if not options.get("model"):
        raise ConfigError("real backends need a model: pass --model DIR (a local Hugging Face causal-LM directory)")
    vals = {k: v for k, v in options.items() if k in OPTION_KEYS and v is not None}
    vals["model"] = str(vals["model"])
    opts = GenerationOptions(**vals)
    opts.validate()
    return opts
