"""What engines report, and the engine contract: who owns the clock and the concurrency.

An engine executes the scheduler's decisions by calling a backend and a
trainer, and reports back what finished, with timestamps on its own clock.
The ``local`` engine runs ``sim`` on a virtual clock
(:mod:`aspc.runtime.engines.virtual`) and real backends in threads
(:mod:`aspc.runtime.engines.threads`); ``ray`` runs workers as Ray actors
(:mod:`aspc.runtime.engines.ray`). Every engine feeds the same
:func:`aspc.runtime.core.loop.drive`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from aspc.errors import ConfigError, InputError, PlanError, WorkerLostError
from aspc.runtime.contracts import GenerationResult, TrainBatch, TrainResult
from aspc.runtime.core.scheduler import Dispatch

if TYPE_CHECKING:
    from aspc.runtime.core.scheduler import Scheduler
    from aspc.runtime.core.timeline import Timeline
    from aspc.runtime.work import MinibatchWork, WorkPlan


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
    again (:meth:`~aspc.runtime.core.scheduler.Scheduler.on_minibatch_failed`).
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

    backend: Any  # the GenerationBackend it drives, set by each engine

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

    def run_all(self, work: WorkPlan, scheduler: Scheduler) -> Timeline | None:
        """Play the whole run in one call and return its record, or ``None`` to be driven event by event.

        Called once by :func:`aspc.runtime.core.loop.drive`, before anything
        started, with the scheduler in its initial state. An engine that can
        (every duration known up front, as with the ``sim`` backend and trainer
        on the virtual clock) returns exactly what the event loop would have
        recorded; the scheduler is then not used again.
        """
        return None

    def load_start_weights(self, weights: Any, workers: int) -> None:
        """Put ``weights`` into every worker's model as version 0, before the run's first dispatch.

        A trainer carried over from an earlier run (``aspc run --epochs``)
        hands its current weights to the next run this way. Engines whose
        workers live in this process load them through the backend; the Ray
        engine overrides it for its actors.
        """
        for w in range(workers):
            self.backend.load_weights(w, 0, weights)

    def speed_probe(self, worker: int) -> float | None:
        """Seconds ``worker`` takes for the backend's reference generation (``aspc run --speed-probe``).

        Runs where the worker's model lives: here through the backend; the
        Ray engine overrides it to run in the worker's actor.
        """
        return self.backend.speed_probe(worker)

    def close(self, *, keep_workers: bool = False) -> None:  # noqa: B027 - optional hook
        """Stop threads or actors; called once, also after a failure.

        ``keep_workers``: the backend stays open for another run (``aspc run
        --epochs``); workers that live apart from it (Ray actors) are left
        running, for the next run's engine to take over.
        """

    def advance_clock(self, seconds: float) -> None:  # noqa: B027 - optional hook
        """Start the clock at ``seconds`` instead of 0 (a resumed run continues its log's timeline)."""


def is_worker_fault(exc: BaseException) -> bool:
    """Whether a generation call's exception is a worker fault, worth another try on a worker.

    Errors about the input or the configuration (``ConfigError``,
    ``InputError``, ``PlanError``) would fail the same way again and stop the
    run at once; so do a dead engine (``WorkerLostError``: vLLM's engine
    process killed, by the OOM killer say) and interrupts (``KeyboardInterrupt``,
    ``SystemExit``).
    """
    return isinstance(exc, Exception) and not isinstance(exc, (ConfigError, InputError, PlanError, WorkerLostError))


def fault_message(exc: BaseException) -> str:
    """``exc`` as one short line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__
