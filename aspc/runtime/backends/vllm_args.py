"""``vllm.LLM`` keyword arguments: ``--engine-arg`` parsed and checked before any engine starts, aspc's defaults.

An engine takes 30-120 s to start on a CPU (minutes for a large model on a
GPU), and vLLM reports a value of the wrong type as a comparison deep in its
config code (``'<' not supported between instances of 'int' and 'str'``), so
names and the simple types of values are checked here against ``EngineArgs``'s
own fields; anything subtler is left to vLLM.
"""

from __future__ import annotations

import math
import os
import types
import typing
from collections.abc import Mapping
from typing import Any

from aspc.errors import ConfigError

CPU_KV_CACHE_BYTES = 1 << 30  # per engine on CPU: ~30k tokens of a 135M model's KV cache
# CPU flags of native bf16 matrix arithmetic; without them vLLM's bf16 default is emulated.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
RESERVED_ENGINE_ARGS = {"model": "--model", "worker_extension_cls": "aspc's weight reload", "seed": "--seed"}
# Engine arguments a run needs as they are: aspc tokenizes prompts with the engine's tokenizer.
REFUSED_ENGINE_ARGS = {"skip_tokenizer_init": "aspc counts and checks prompt tokens with the engine's tokenizer"}
# Engine arguments that size memory or batching but leave what a sample is: a resume may change them
# (after running out of memory, say). Every other one is compared on --resume, as --dtype is.
OPERATIONAL_ENGINE_ARGS = frozenset({
    "gpu_memory_utilization", "kv_cache_memory_bytes", "swap_space", "cpu_offload_gb", "max_num_seqs",
    "max_num_batched_tokens", "enforce_eager", "enable_prefix_caching", "enable_chunked_prefill", "block_size",
    "disable_log_stats", "max_seq_len_to_capture", "compilation_config", "async_scheduling",
    "num_gpu_blocks_override", "distributed_executor_backend", "tensor_parallel_size", "pipeline_parallel_size",
    "data_parallel_size", "max_parallel_loading_workers", "disable_custom_all_reduce", "scheduling_policy",
})  # fmt: skip
# What a simple annotation of EngineArgs takes, and how to say it.
_SIMPLE = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}
_SAID = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU advertises native bf16 arithmetic (False where the flags cannot be read)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return any(f in line.split() for f in CPU_BF16_FLAGS)
    except OSError:
        pass
    return False


def configure_vllm_env() -> None:
    """Environment vLLM reads at import (and its engine subprocesses inherit); user settings win."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout belongs to --json
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are local; nothing downloads at run time


def parse_engine_args(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``--engine-arg KEY=VALUE`` strings as ``vllm.LLM`` keyword arguments; values parse as JSON when they can."""
    import json

    out: dict[str, Any] = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key.isidentifier():
            raise ConfigError(f"--engine-arg {p!r}: expected KEY=VALUE with KEY a vllm.LLM argument name "
                              "(e.g. max_num_seqs=64)")  # fmt: skip
        if key in RESERVED_ENGINE_ARGS:
            raise ConfigError(f"--engine-arg {key}: set by {RESERVED_ENGINE_ARGS[key]}, not an engine argument")
        if key in out:  # last-wins would drop one of the two silently
            raise ConfigError(f"--engine-arg {key} is given twice; pass it once")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
        except RecursionError:  # valid JSON, deeper than Python's parser goes: a traceback before
            raise ConfigError(f"--engine-arg {key}: its JSON value nests too deeply to read; pass a flatter value") from None
        if isinstance(out[key], float) and not math.isfinite(out[key]):  # json reads NaN, 1e999; no setting wants them
            raise ConfigError(f"--engine-arg {p!r}: not a finite number; pass a finite one")
    return out


def check_engine_args(args: Mapping[str, Any] | None) -> None:
    """Raise :class:`ConfigError` for a key ``vllm.LLM`` would not accept, or a value of the wrong simple type."""
    if not args:
        return
    import dataclasses

    configure_vllm_env()
    from vllm.engine.arg_utils import EngineArgs

    fields = {f.name: f for f in dataclasses.fields(EngineArgs)}
    bad = sorted(set(args) - set(fields))
    if bad:
        raise ConfigError(f"--engine-arg {bad[0]}: not an argument of vllm.LLM / EngineArgs "
                          f"(vLLM's engine arguments are listed by 'vllm serve --help')")  # fmt: skip
    clash = sorted(set(args) & set(RESERVED_ENGINE_ARGS))
    if clash:
        raise ConfigError(f"--engine-arg {clash[0]}: set by {RESERVED_ENGINE_ARGS[clash[0]]}")
    for key, why in REFUSED_ENGINE_ARGS.items():
        if args.get(key):
            raise ConfigError(f"--engine-arg {key}={args[key]!r}: {why}; drop it")
    for key in sorted(args):
        want = _wanted(fields[key])
        if want is not None and not _fits(args[key], *want):
            raise ConfigError(f"--engine-arg {key}={args[key]!r}: vllm.LLM takes {_said(*want)} here; "
                              f"pass e.g. {key}={_example(fields[key], *want, args[key])}")  # fmt: skip


def _wanted(field: Any) -> tuple[str, tuple[str, ...], bool] | None:
    """(simple kind or "literal", the literal's choices, whether null is taken), for an annotation simple enough."""
    t = field.type
    null = field.default is None
    if typing.get_origin(t) in (typing.Union, types.UnionType):  # Optional[Literal[...]], int | None
        parts = [a for a in typing.get_args(t) if a is not type(None)]
        null = null or len(parts) < len(typing.get_args(t))
        t = parts[0] if len(parts) == 1 else None
    if typing.get_origin(t) is typing.Literal:
        choices = typing.get_args(t)
        return ("literal", choices, null) if all(isinstance(c, str) for c in choices) else None
    name = t.__name__ if isinstance(t, type) else str(t)
    parts = [p.strip() for p in name.split("|")]
    null = null or "None" in parts
    kinds = [p for p in parts if p != "None"]
    return (kinds[0], (), null) if len(kinds) == 1 and kinds[0] in _SIMPLE else None


def _fits(value: Any, kind: str, choices: tuple[str, ...], null: bool) -> bool:
    if value is None:
        return null
    if kind == "literal":
        return value in choices
    return isinstance(value, _SIMPLE[kind]) and (kind == "bool" or not isinstance(value, bool))


def _said(kind: str, choices: tuple[str, ...], null: bool) -> str:
    said = f"one of {', '.join(choices)}" if kind == "literal" else _SAID[kind]
    return said + (" or null" if null else "")


def _example(field: Any, kind: str, choices: tuple[str, ...], null: bool, value: Any = None) -> str:
    if kind == "literal":
        return choices[0]
    if kind == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"'\"{value}\"' (a number read as JSON: quote it to pass it as text)"
    if kind == "int" and isinstance(value, float) and value.is_integer():
        return f"{int(value)}"
    d = field.default
    if isinstance(d, bool) or kind == "bool":
        return "true" if d is not True else "false"
    return str(d) if isinstance(d, (int, float, str)) and d != "" else {"int": "64", "float": "0.5"}.get(kind, "auto")


def engine_kwargs(options: Any, worker: int, share: float, on_cpu: bool) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for one worker's engine."""
    kwargs: dict[str, Any] = {
        "model": options.model,
        "seed": options.seed + worker,
        "worker_extension_cls": "aspc.runtime.backends.vllm.AspcWorkerExtension",
    }
    if on_cpu:
        kwargs["enforce_eager"] = True
        if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    else:
        kwargs["gpu_memory_utilization"] = share
    if options.dtype != "auto":
        kwargs["dtype"] = options.dtype
    elif on_cpu and not cpu_has_native_bf16():
        # vLLM picks bf16 on any CPU; emulated, each sequence then costs ~40 ms a step on
        # 2 AVX2 cores for a 135M model, so the step time grows with every active sequence.
        # float32 (aspc's documented --dtype auto on CPU) ran 2x faster at 4 sequences there.
        kwargs["dtype"] = "float32"
    extra = dict(options.engine_args or {})
    if "gpu_memory_utilization" in extra and on_cpu:  # the user sized the KV cache as a share of RAM
        kwargs.pop("kv_cache_memory_bytes", None)
    kwargs.update(extra)  # --engine-arg wins over every default above
    return kwargs


def generation_engine_args(args: Mapping[str, Any] | None) -> dict[str, Any]:
    """The engine arguments that shape what a sample is (all but the operational ones), as a resume compares them."""
    return {k: args[k] for k in sorted(args or {}) if k not in OPERATIONAL_ENGINE_ARGS}
