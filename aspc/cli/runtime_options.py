"""The runtime options ``aspc run``, ``simulate`` and ``probe`` share, and the RunConfig they make."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from aspc.cli.paths import PathArg

# Light modules (no numba, pyarrow or torch), so --help stays fast.
from aspc.runtime.config import RETURN_MODES, ReturnMode, RunConfig
from aspc.runtime.registry import BACKENDS, ENGINES, BackendKind, EngineKind

F = Callable[..., Any]


def runtime_options(
    fn: F, *, cost_model_flags: tuple[str, ...] = ("--cost-model", "--sim-cost-model"), sim_only: bool = False
) -> F:
    """Options every command that runs a plan takes (``run``, ``simulate``).

    The simulator's coefficients file is ``--cost-model`` (alias
    ``--sim-cost-model``); the compiler's minibatch cost is ``--minibatch-cost``.
    ``sim_only`` (``simulate``) hides ``--backend`` and ``--engine``: the
    command refuses any but the simulator's (:func:`refuse_real_backend`).
    """
    opts = [
        click.option(
            "--backend",
            type=click.Choice(BACKENDS),
            default=BackendKind.SIM.value,
            show_default=True,
            hidden=sim_only,
            help="Generation backend (sim: discrete-event simulator, no hardware).",
        ),
        click.option(
            "--engine",
            type=click.Choice(ENGINES),
            default=EngineKind.LOCAL.value,
            show_default=True,
            hidden=sim_only,
            help="Where workers run.",
        ),
        click.option("--workers", "-w", type=int, default=8, show_default=True, help="Generation workers W."),
        click.option(
            "--global-batch", type=int, default=64, show_default=True, help="Samples per trainer step."
        ),
        click.option(
            "--queue-capacity",
            default="auto",
            show_default=True,
            help="Queue high-water mark: samples (512), trainer batches (4b), or auto "
            "(one batch + one largest minibatch per worker).",
        ),
        click.option(
            "--reload-time",
            type=float,
            default=0.5,
            show_default=True,
            help="Seconds a worker spends loading new weights (sim).",
        ),
        click.option(
            "--return-mode",
            type=click.Choice(RETURN_MODES),
            default=ReturnMode.STATIC.value,
            show_default=True,
            help="static: a minibatch returns when its longest sequence ends; continuous: each sequence "
            "as it ends.",
        ),
        click.option(
            "--max-new-tokens", type=int, default=None, help="Cap every response at this many tokens."
        ),
        click.option(
            "--max-staleness",
            type=int,
            default=None,
            help="K: never start a minibatch whose samples could be consumed more than K weight versions "
            "after the version generating them (policy lag <= K). [default: unbounded]",
        ),
        click.option(
            *cost_model_flags,
            "sim_cost_model",
            type=PathArg(dir_okay=False, path_type=Path),
            default=None,
            help="JSON of simulator coefficients (as 'aspc calibrate' writes).",
        ),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def refuse_real_backend(kwargs: dict[str, Any], command: str) -> None:
    """``simulate`` runs the simulator only; it offered --backend hf|vllm and --engine ray and could run neither."""
    from aspc.errors import ConfigError

    backend, engine = kwargs.get("backend"), kwargs.get("engine")
    if backend != BackendKind.SIM.value:
        raise ConfigError(f"{command} runs the simulator only, not --backend {backend}: compile a plan and run it "
                          f"with 'aspc run PLAN --backend {backend} --model DIR'")  # fmt: skip
    if engine != EngineKind.LOCAL.value:
        raise ConfigError(f"{command} runs the simulator in this process, not --engine {engine}: drop --engine, or "
                          f"run a plan with 'aspc run PLAN --engine {engine}'")  # fmt: skip


_RUNTIME_KEYS = (
    "backend",
    "engine",
    "workers",
    "global_batch",
    "queue_capacity",
    "reload_time",
    "return_mode",
    "max_new_tokens",
    "max_staleness",
)


def run_config_from_kwargs(kwargs: dict[str, Any], **extra: Any) -> tuple[RunConfig, Any]:
    """Pop the runtime options out of a command's kwargs: (RunConfig, SimCostModel)."""
    from aspc.guards import check_run_config
    from aspc.runtime.backends.sim_cost import SimCostModel, load_sim_cost_model

    vals = {k: kwargs.pop(k) for k in _RUNTIME_KEYS if k in kwargs}
    path = kwargs.pop("sim_cost_model", None)
    cost = load_sim_cost_model(path) if path is not None else SimCostModel()
    config = RunConfig(**vals, **extra)
    config.validate()
    check_run_config(config)
    return config, cost
