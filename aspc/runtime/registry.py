"""Every backend, engine and trainer by name: the only module that knows the concrete classes.

The names (``--backend``, ``--engine``, ``--trainer``) and their parsers are
cheap to import, so the CLI's ``--help`` lists them without loading numba,
pyarrow or torch. The ``make_*`` factories import a concrete class only when
it is asked for; nothing else in aspc imports ``aspc.runtime.backends.*``,
``aspc.runtime.engines.*`` or ``aspc.runtime.trainers.*`` to build one.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

from aspc.errors import ConfigError
from aspc.runtime.config import ReturnMode
from aspc.runtime.contracts import BackendContext, Clock

if TYPE_CHECKING:
    from aspc.runtime.contracts import GenerationBackend, Trainer
    from aspc.runtime.core.events import Engine


class BackendKind(str, Enum):
    """Generation backends ``--backend`` accepts."""

    SIM = "sim"  # discrete-event simulation with a cost model; no hardware
    HF = "hf"  # transformers generate (CPU / CUDA / NPU): aspc.runtime.backends.hf
    VLLM = "vllm"  # vLLM / vLLM-Ascend engines: aspc.runtime.backends.vllm


BACKENDS = tuple(k.value for k in BackendKind)


class EngineKind(str, Enum):
    """Engines ``--engine`` accepts."""

    LOCAL = "local"  # one process: the sim's virtual clock, or threads for real backends
    RAY = "ray"  # workers as Ray actors (aspc.runtime.engines.ray); hf and vllm backends


ENGINES = tuple(k.value for k in EngineKind)

SIM_TRAINER = "sim"  # --trainer default; anything else is a package.module:factory spec


def parse_backend(name: str | BackendKind) -> BackendKind:
    """The :class:`BackendKind` called ``name``; :class:`ConfigError` if unknown."""
    try:
        return BackendKind(name)
    except ValueError:
        raise ConfigError(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}") from None


def parse_engine(name: str | EngineKind) -> EngineKind:
    """The :class:`EngineKind` called ``name``; :class:`ConfigError` if unknown."""
    try:
        return EngineKind(name)
    except ValueError:
        raise ConfigError(f"unknown engine {name!r}; use one of {', '.join(ENGINES)}") from None


def parse_engine_args(backend: str | BackendKind, pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``--engine-arg KEY=VALUE`` strings as keyword arguments of the backend's engine (vllm only)."""
    if parse_backend(backend) is not BackendKind.VLLM:
        from aspc.errors import ConfigError

        raise ConfigError("--engine-arg is for --backend vllm; drop it or use --backend vllm")
    from aspc.runtime.backends.vllm import parse_engine_args as parse_vllm_engine_args

    return parse_vllm_engine_args(pairs)


def make_backend(name: str | BackendKind, context: BackendContext) -> GenerationBackend:
    """The generation backend called ``name``.

    ``sim`` replays ``context.response_len`` timed by ``context.sim_cost_model``;
    ``hf`` and ``vllm`` take their options (model, device, sampling, replay
    lengths) from ``context.options`` (see :mod:`aspc.runtime.backends.options`).
    The model path is resolved (and a GGUF converted, once) here, so a bad
    ``--model`` fails before any run log is written.

    Raises
    ------
    ConfigError
        Unknown name, missing ``--model`` or invalid sampling options.
    BackendError
        A known backend that cannot run here (packages not installed, model unusable).
    """
    kind = parse_backend(name)
    if kind is BackendKind.SIM:
        from aspc.runtime.backends.sim import SimBackend

        if context.response_len is None:
            raise ConfigError("the sim backend needs response lengths (actual or sampled)")
        return SimBackend(context.sim_cost_model, context.response_len, reload_time=context.reload_time)
    import dataclasses

    from aspc.devices import check_device_request
    from aspc.runtime.backends.models import resolve_model
    from aspc.runtime.backends.options import options_from_context

    opts = options_from_context(context.options)
    check_device_request(opts.device)
    if kind is BackendKind.VLLM:
        from aspc.runtime.backends.vllm import VLLMBackend, check_vllm_device, require_vllm

        require_vllm()
        check_vllm_device(opts.device)  # vLLM ignored it: --device cuda:3 ran on the CPU without a word
        # vLLM's other load formats (dummy: random weights for timing, tensorizer, ...) read no weight files.
        files = str((opts.engine_args or {}).get("load_format", "auto")) in ("auto", "safetensors", "pt")
        return VLLMBackend(dataclasses.replace(opts, model=str(resolve_model(opts.model, need_weights=files))))
    from aspc.runtime.backends.hf import HFBackend

    return HFBackend(dataclasses.replace(opts, model=str(resolve_model(opts.model))))


def make_trainer(name: str, context: BackendContext) -> Trainer:
    """The trainer called ``name``.

    ``sim`` times each step with the cost model; ``package.module:factory``
    imports a user's trainer (the only import of user code, see
    :mod:`aspc.runtime.trainers.user`), called with ``context`` and
    ``context.options["trainer_args"]``.
    """
    if name == SIM_TRAINER:
        from aspc.runtime.trainers.sim import SimTrainer

        return SimTrainer(context.sim_cost_model)
    from aspc.runtime.trainers.user import is_factory_spec, make_user_trainer

    if is_factory_spec(name):
        return make_user_trainer(name, context, context.options.get("trainer_args"))
    raise ConfigError(f"unknown trainer {name!r}; use 'sim' or 'package.module:factory'")


def make_engine(
    name: str | EngineKind,
    backend: GenerationBackend,
    trainer: Trainer,
    return_mode: ReturnMode,
    *,
    worker_timeout: float | None = None,
) -> Engine:
    """The engine called ``name`` for this backend and trainer.

    ``local`` picks the virtual clock when the backend's timings are
    simulated, and threads on the wall clock otherwise. ``worker_timeout``
    (wall seconds per generation call) applies to the thread engine; the
    virtual clock has nothing that can hang.
    """
    kind = parse_engine(name)
    if kind is EngineKind.RAY:
        if backend.clock is Clock.VIRTUAL:
            raise ConfigError(
                "the sim backend runs on the local engine; drop --engine ray or pick a real backend"
            )
        from aspc.runtime.engines.ray import RayEngine  # the only place ray is imported

        return RayEngine(backend, trainer, return_mode, worker_timeout=worker_timeout)
    if backend.clock is Clock.VIRTUAL:
        from aspc.runtime.engines.virtual import VirtualClockEngine

        return VirtualClockEngine(backend, trainer, return_mode)
    from aspc.runtime.engines.threads import ThreadEngine

    return ThreadEngine(backend, trainer, return_mode, worker_timeout=worker_timeout)


# Real backends' options and the values that mean "not given" (the CLI's defaults).
_REAL_ONLY: dict[str, tuple[Any, ...]] = {
    "model": (None, ""),
    "device": (None, "auto"),
    "dtype": (None, "auto"),
    "temperature": (None, 1.0),
    "top_p": (None, 1.0),
    "top_k": (None, 0),
}


def make_components(
    config: Any,
    sim_cost_model: Any,
    *,
    trainer: str = SIM_TRAINER,
    trainer_args: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    lengths: dict[str, Any] | None = None,
    lengths_name: str = "",
) -> tuple[GenerationBackend | None, Trainer | None, list[str]]:
    """The backend and trainer a :class:`~aspc.runtime.config.RunConfig` names, plus notes for the user.

    Parameters
    ----------
    config
        The run's :class:`~aspc.runtime.config.RunConfig` (backend, workers,
        reload time, token cap, seed).
    sim_cost_model
        Step times of the simulated backend and trainer.
    trainer, trainer_args
        ``--trainer`` and its ``--trainer-arg`` pairs (parsed).
    options
        The real backends' options (model, device, dtype, sampling, ``replay``);
        see :mod:`aspc.runtime.backends.options`. ``max_new_tokens`` and
        ``seed`` come from ``config``; replay lengths from ``lengths``.
    lengths, lengths_name
        Observed lengths by prompt id (``--actual-lengths``) and their source's name.

    Returns
    -------
    (backend, trainer, notes)
        ``None`` for what :func:`aspc.runtime.run` builds itself (the sim
        backend with its replayed lengths, the sim trainer); ``notes`` are
        diagnostics about options that have no effect.
    """
    opts = dict(options or {})
    replay = bool(opts.pop("replay", False))
    notes: list[str] = []
    kind = parse_backend(config.backend)
    real = kind is not BackendKind.SIM
    if not real:
        ignored = [f"--{k.replace('_', '-')}" for k, unset in _REAL_ONLY.items() if opts.get(k) not in unset]
        ignored += ["--replay-lengths"] if replay else []
        # Wall-clock engines abandon a hung generation call after it; a simulated call cannot hang.
        ignored += ["--worker-timeout"] if getattr(config, "worker_timeout", None) is not None else []
        if ignored:
            notes.append(f"{', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} ignored by the sim backend, "
                         "which replays recorded lengths on a cost model; pass --backend hf or vllm to generate "
                         "for real")  # fmt: skip
    if real and lengths is not None and not replay:
        notes.append(f"--actual-lengths {lengths_name} is not used by --backend {kind.value} without "
                     "--replay-lengths: responses end where the model ends them")
    if not real and trainer == SIM_TRAINER:
        return None, None, notes
    opts.update(
        max_new_tokens=config.max_new_tokens,
        seed=config.seed,
        replay=replay,
        replay_lengths=lengths if replay else None,
        replay_source=lengths_name,
    )
    context = BackendContext(
        n_workers=config.workers, reload_time=config.reload_time, sim_cost_model=sim_cost_model, options=opts
    )
    backend = None
    if real:
        backend = make_backend(kind, context)
        # Trainers see the resolved model directory (a GGUF converted once, ...).
        opts["model"] = backend.options.model  # type: ignore[attr-defined]
    elif opts.get("model") is not None:
        from aspc.runtime.backends.models import resolve_model

        opts["model"] = str(resolve_model(opts["model"]))
    built_trainer = None
    if trainer != SIM_TRAINER:
        opts["trainer_args"] = dict(trainer_args or {})
        built_trainer = make_trainer(trainer, context)
    return backend, built_trainer, notes


def preload_kernels(name: str | BackendKind) -> None:
    """Load the compiled kernels a run of backend ``name`` calls (the ``sim`` pair's), compiling nothing.

    The first call of a cached Numba kernel in a process loads Numba's typing
    registries and the machine code (~0.5 s on a slow machine, more beside
    another job). ``aspc run`` does it on a thread while it reads a large plan,
    which runs in C++ without the GIL; tiny inputs of the real argument types,
    so the cached code is what gets loaded.
    """
    if parse_backend(name) is not BackendKind.SIM:
        return
    import numpy as np

    from aspc.runtime.backends.sim_kernel import _minibatch_times
    from aspc.runtime.config import ReturnMode
    from aspc.runtime.engines.virtual_batch import run_virtual

    offsets, one, ints = np.array([0, 1], dtype=np.int64), np.ones(1), np.ones(1, dtype=np.int64)
    _minibatch_times(offsets, ints, ints, one, np.zeros(5))
    run_virtual(offsets, one, one, ints, ints, n_workers=1, global_batch=1, queue_capacity=1, max_staleness=None,
                reload_time=0.0, train_base=0.0, train_per_token=0.0, return_mode=ReturnMode.STATIC)
