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

from aspc.errors import ConfigError
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


Event = TrainFinished | SamplesReturned | MinibatchFinished

# Order of events at one instant: a published version first (so the records
# show it before any decision), then returned samples, then free workers.
EVENT_PRIORITY = {TrainFinished: 0, SamplesReturned: 1, MinibatchFinished: 2}


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
    name: str | EngineKind, backend: GenerationBackend, trainer: Trainer, return_mode: ReturnMode
) -> Engine:
    """The engine called ``name`` for this backend and trainer.

    ``local`` picks the virtual clock when the backend's timings are
    simulated, and threads on the wall clock otherwise.
    """
    kind = parse_engine(name)
    if kind is EngineKind.RAY:
        if backend.clock is Clock.VIRTUAL:
            raise ConfigError(
                "the sim backend runs on the local engine; drop --engine ray or pick a real backend"
            )
        from aspc.runtime.ray_engine import RayEngine  # the only place ray is imported

        return RayEngine(backend, trainer, return_mode)
    if backend.clock is Clock.VIRTUAL:
        from aspc.runtime.sim.engine import VirtualClockEngine

        return VirtualClockEngine(backend, trainer, return_mode)
    from aspc.runtime.local import ThreadEngine

    return ThreadEngine(backend, trainer, return_mode)
