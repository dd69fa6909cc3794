"""Engines: who owns the clock and the concurrency.

An engine executes the scheduler's decisions by calling a backend and a
trainer, and reports back what finished, with timestamps on its own clock.
``local`` runs ``sim`` on a virtual clock (:mod:`aspc.runtime.sim.engine`) and
real backends in threads (:mod:`aspc.runtime.local`); ``ray`` (later) runs
workers as Ray actors. Every engine feeds the same :func:`aspc.runtime.loop.drive`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from aspc.errors import ConfigError, InputError, PlanError
from aspc.runtime.backend import Clock, GenerationBackend, GenerationResult, TrainBatch, Trainer, TrainResult
from aspc.runtime.config import ReturnMode
from aspc.runtime.scheduler import Dispatch
from aspc.runtime.work import MinibatchWork


@dataclass(frozen=True)
class TrainFinished:
    """The trainer finished a step and published a version."""

    time: float  # seconds since run start, engine clock (== end)
    step: int  # trainer step index
    start: float  # seconds, when the step began
    end: float  # seconds, when the version was published
    result: TrainResult  # version, elapsed, weights handle


@dataclass(frozen=True)
class SamplesReturned:
    """Samples reached the queue."""

    time: float  # seconds since run start, engine clock
    worker: int  # worker that generated them
    minibatch: int  # their minibatch
    samples: np.ndarray  # int64 global sample ids, in return order
    response_len: np.ndarray  # int64 per sample, tokens
    payload: list[Any] | None = None  # per-sample backend outputs, if any


@dataclass(frozen=True)
class MinibatchFinished:
    """A worker finished its minibatch; reported after all its samples returned."""

    time: float  # seconds since run start (== end)
    worker: int  # 0..W-1
    minibatch: int  # minibatch id
    reload_start: float  # seconds, when it was dispatched (a reload, if any, starts here)
    start: float  # seconds, when generation began (reload_start + reload time)
    end: float  # seconds, when its longest sequence finished
    reloaded: bool  # weights were reloaded before this minibatch
    result: GenerationResult  # lengths and per-sample finish offsets


@dataclass(frozen=True)
class MinibatchFailed:
    """A worker's call for a minibatch raised, hung past the timeout, or its worker died.

    None of the minibatch's samples were reported; the scheduler hands it out
    again (:meth:`~aspc.runtime.scheduler.Scheduler.on_minibatch_failed`).
    """

    time: float  # seconds since run start, engine clock
    worker: int  # 0..W-1
    minibatch: int  # minibatch id
    error: str  # one line: what went wrong
    lost: bool = False  # the worker is hung or dead: give it no work until WorkerRestored


@dataclass(frozen=True)
class WorkerRestored:
    """A worker reported lost is usable again (its abandoned call returned)."""

    time: float  # seconds since run start, engine clock
    worker: int  # 0..W-1


Event = TrainFinished | SamplesReturned | MinibatchFinished | MinibatchFailed | WorkerRestored

# Order of events at one instant: a published version first (so the records
# show it before any decision), then returned samples, then free workers.
EVENT_PRIORITY = {TrainFinished: 0, SamplesReturned: 1, MinibatchFinished: 2, MinibatchFailed: 3, WorkerRestored: 4}


class Engine(ABC):
    """Executes dispatches and trainer steps; reports completions on its clock."""

    @abstractmethod
    def now(self) -> float:
        """Seconds since the run started, on this engine's clock."""

    @abstractmethod
    def start_generation(self, action: Dispatch, work: MinibatchWork, weights: Any) -> None:
        """Start ``work`` on ``action.worker``, first reloading ``weights`` if ``action.reload_version``.

        Called right after the scheduler decided the dispatch; must not block
        for the generation itself.
        """

    @abstractmethod
    def start_train(self, batch: TrainBatch) -> None:
        """Start a trainer step on ``batch``; must not block for the step itself."""

    @abstractmethod
    def wait(self) -> list[Event]:
        """Block until something finishes; return every event of that instant.

        Events come in :data:`EVENT_PRIORITY` order, ties in start order.
        Raises :class:`~aspc.errors.RunError` if nothing is running.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Stop threads or actors; called once, also after a failure."""

    def advance_clock(self, seconds: float) -> None:  # noqa: B027 - optional hook
        """Start the clock at ``seconds`` instead of 0 (a resumed run continues its log's timeline)."""


def is_worker_fault(exc: BaseException) -> bool:
    """Whether a generation call's exception is a worker fault, worth another try on a worker.

    Errors about the input or the configuration (``ConfigError``,
    ``InputError``, ``PlanError``) would fail the same way again and stop the
    run at once; so do interrupts (``KeyboardInterrupt``, ``SystemExit``).
    """
    return isinstance(exc, Exception) and not isinstance(exc, (ConfigError, InputError, PlanError))


def fault_message(exc: BaseException) -> str:
    """``exc`` as one short line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


class EngineKind(str, Enum):
    """Engines ``--engine`` accepts."""

    LOCAL = "local"  # one process: the sim's virtual clock, or threads for real backends
    RAY = "ray"  # workers as Ray actors (aspc.runtime.ray_engine); hf and vllm backends


ENGINES = tuple(k.value for k in EngineKind)


def parse_engine(name: str | EngineKind) -> EngineKind:
    try:
        return EngineKind(name)
    except ValueError:
        raise ConfigError(f"unknown engine {name!r}; use one of {', '.join(ENGINES)}") from None


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
        from aspc.runtime.ray_engine import RayEngine  # the only place ray is imported

        return RayEngine(backend, trainer, return_mode, worker_timeout=worker_timeout)
    if backend.clock is Clock.VIRTUAL:
        from aspc.runtime.sim.engine import VirtualClockEngine

        return VirtualClockEngine(backend, trainer, return_mode)
    from aspc.runtime.local import ThreadEngine

    return ThreadEngine(backend, trainer, return_mode, worker_timeout=worker_timeout)
