"""The local engine on the wall clock: one thread per running minibatch or trainer step.

Real backends (``hf``, ``vllm``) run here: the scheduler and the run loop are
the same as in the simulator, only the clock is real. A backend or trainer
that declares a virtual clock can still run here: its simulated seconds are
slept (times ``time_scale``), which is how a real generation backend can be
paired with a simulated trainer, and how tests check that both clocks give
the same decisions.

Worker faults: a generation call that raises (a worker fault, see
:func:`~aspc.runtime.core.events.is_worker_fault`) is reported as a
:class:`~aspc.runtime.core.events.MinibatchFailed`, and the scheduler hands the
minibatch out again. With ``worker_timeout`` a generation call running longer
than that many wall seconds is *abandoned*: reported failed with its worker
lost. Python cannot stop a thread, so the call keeps running in its daemon
thread; whatever it returns is discarded, and its worker gets work again
(:class:`~aspc.runtime.core.events.WorkerRestored`) only once the call has
returned. Trainer failures are not retried: they stop the run.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import numpy as np

from aspc.errors import AspcError, ConfigError, RunError
from aspc.runtime.config import ReturnMode
from aspc.runtime.contracts import Clock, GenerationBackend, GenerationResult, TrainBatch, Trainer, take_step
from aspc.runtime.core.events import (
    EVENT_PRIORITY,
    Engine,
    Event,
    MinibatchFailed,
    MinibatchFinished,
    SamplesReturned,
    TrainFinished,
    WorkerRestored,
    fault_message,
    is_worker_fault,
)
from aspc.runtime.core.scheduler import Dispatch
from aspc.runtime.work import MinibatchWork


class _Partial:
    """Events a generation call reports before it returns (continuous mode)."""

    __slots__ = ("events",)

    def __init__(self, events: list[Event]):
        self.events = events


class _Job:
    """A call running in a thread: what it is, and when it is abandoned."""

    __slots__ = ("worker", "minibatch", "deadline")

    def __init__(self, worker: int | None, minibatch: int | None, deadline: float | None):
        self.worker = worker  # generation worker, None for the trainer
        self.minibatch = minibatch  # its minibatch, None for the trainer
        self.deadline = deadline  # monotonic seconds after which it is abandoned; None = never


class ThreadEngine(Engine):
    """Runs backend and trainer calls in threads; timestamps are wall seconds since start.

    Parameters
    ----------
    backend, trainer
        What to run. Calls for different workers may overlap; one worker's
        calls never do (a worker whose call was abandoned gets no work until
        that call returns).
    return_mode
        ``static``: a minibatch's samples return together when its call ends.
        ``continuous`` needs a streaming backend (``streams = True``, i.e.
        vllm): ``generate(worker, work, on_samples)`` reports samples as
        they finish, and each report reaches the queue at once. A call that
        fails after some of its samples were reported stops the run (a retry
        would generate them twice).
    time_scale
        Factor on simulated seconds slept for virtual-clock components.
    worker_timeout
        Wall seconds a generation call (reload included) may run before it is
        abandoned and its minibatch handed out again; ``None`` = no limit.
    """

    def __init__(
        self,
        backend: GenerationBackend,
        trainer: Trainer,
        return_mode: ReturnMode,
        *,
        time_scale: float = 1.0,
        worker_timeout: float | None = None,
    ):
        self.continuous = ReturnMode(return_mode) is ReturnMode.CONTINUOUS
        if self.continuous and not getattr(backend, "streams", False):
            raise ConfigError("--return-mode continuous needs a streaming backend (--backend vllm); "
                              "use --return-mode static")
        self._streamed: set[int] = set()  # start orders of calls that reported samples early
        self.backend = backend
        self.trainer = trainer
        self.time_scale = time_scale
        self.worker_timeout = worker_timeout
        self._t0 = time.monotonic()
        self._done: queue.Queue[tuple[int, list[Event] | BaseException]] = queue.Queue()
        self._live: dict[int, _Job] = {}  # start order -> job started and not yet reported
        self._abandoned: dict[int, _Job] = {}  # start order -> job reported failed that may still return
        self._seq = 0  # start order, breaks ties between events of one wait

    def now(self) -> float:
        return time.monotonic() - self._t0

    def advance_clock(self, seconds: float) -> None:
        self._t0 = time.monotonic() - float(seconds)

    def _sleep_virtual(self, clock: Clock, seconds: float) -> None:
        if clock is Clock.VIRTUAL and seconds > 0:
            time.sleep(seconds * self.time_scale)

    def _spawn(self, job: Any, worker: int | None = None, minibatch: int | None = None) -> None:
        """Run ``job`` in a thread; with ``worker`` and ``minibatch`` its exceptions are worker faults."""
        seq = self._seq
        self._seq += 1
        deadline = None
        if worker is not None and self.worker_timeout is not None:
            deadline = time.monotonic() + self.worker_timeout
        self._live[seq] = _Job(worker, minibatch, deadline)

        def target() -> None:
            try:
                self._done.put((seq, job()))
            except BaseException as exc:  # handed to the driver thread
                self._done.put((seq, exc))

        threading.Thread(target=target, daemon=True).start()

    def _samples_reporter(self, worker: int, work: MinibatchWork) -> tuple[Any, np.ndarray]:
        """``on_samples(positions, lens, payload)`` for the next spawned call, and its mask of samples reported early.

        Each report is queued at once under that call's start order (continuous
        mode), so the driver hears the samples before the minibatch ends.
        """
        seq = self._seq  # the order _spawn gives this job
        ids = np.arange(work.sample_start, work.sample_end, dtype=np.int64)
        early = np.zeros(ids.size, dtype=bool)

        def on_samples(pos: np.ndarray, lens: np.ndarray, payload: list[Any] | None) -> None:
            early[pos] = True
            ev = SamplesReturned(self.now(), worker, work.index, ids[pos], np.asarray(lens, dtype=np.int64), payload)
            self._done.put((seq, _Partial([ev])))

        return on_samples, early

    def _finished(self, action: Dispatch, work: MinibatchWork, early: np.ndarray, res: GenerationResult,
                  t0: float, start: float, end: float) -> list[Event]:  # fmt: skip
        """A generation call's last events: the samples not reported early, then the minibatch's end."""
        w, m = action.worker, work.index
        ids = np.arange(work.sample_start, work.sample_end, dtype=np.int64)
        rest = np.flatnonzero(~early)
        lens = np.asarray(res.response_len, dtype=np.int64)
        payload = None if res.payload is None else [res.payload[i] for i in rest]
        out: list[Event] = []
        if rest.size or not self.continuous:
            out.append(SamplesReturned(end, w, m, ids[rest], lens[rest], payload))
        return [*out, MinibatchFinished(end, w, m, t0, start, end, action.reload_version is not None, res)]

    def start_generation(self, action: Dispatch, work: MinibatchWork, weights: Any) -> None:
        t0 = self.now()
        b = self.backend
        on_samples, early = self._samples_reporter(action.worker, work)

        def job() -> list[Event]:
            if action.reload_version is not None:
                self._sleep_virtual(b.clock, b.load_weights(action.worker, action.reload_version, weights))
            start = self.now()
            res = b.generate(action.worker, work, on_samples) if self.continuous else b.generate(action.worker, work)
            self._sleep_virtual(b.clock, res.elapsed)
            return self._finished(action, work, early, res, t0, start, self.now())

        self._spawn(job, action.worker, work.index)

    def start_train(self, batch: TrainBatch) -> None:
        start = self.now()

        def job() -> list[Event]:
            res = take_step(self.trainer, batch)
            self._sleep_virtual(self.trainer.clock, res.elapsed)
            end = self.now()
            return [TrainFinished(end, batch.step, start, end, res)]

        self._spawn(job)

    def _expire(self) -> list[tuple[int, list[Event]]]:
        """Abandon generation calls past their deadline: a failure event each, worker lost."""
        now = time.monotonic()
        out = []
        for seq, job in list(self._live.items()):
            if job.deadline is not None and now >= job.deadline:
                if seq in self._streamed:
                    raise RunError(f"minibatch {job.minibatch} passed --worker-timeout {self.worker_timeout:g} s "
                                   "after some of its samples were returned (--return-mode continuous); "
                                   "rerun with --resume and a longer --worker-timeout")
                del self._live[seq]
                self._abandoned[seq] = job
                assert job.worker is not None and job.minibatch is not None
                msg = f"no answer within --worker-timeout {self.worker_timeout:g} s (call abandoned)"
                out.append((seq, [MinibatchFailed(self.now(), job.worker, job.minibatch, msg, lost=True)]))
        return out

    def _next_timeout(self) -> float | None:
        deadlines = [j.deadline for j in self._live.values() if j.deadline is not None]
        if not self._live and self._abandoned:
            # Only abandoned calls remain: give them one more timeout to come back.
            return self.worker_timeout
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def wait(self) -> list[Event]:
        if not self._live and not self._abandoned:
            raise RunError(
                "the run stalled with nothing running (a bug in aspc's scheduler); please report it"
            )
        while True:
            items: list[tuple[int, list[Event] | BaseException]] = []
            try:
                items.append(self._done.get(timeout=self._next_timeout()))
            except queue.Empty:
                if not self._live:
                    workers = sorted({j.worker for j in self._abandoned.values() if j.worker is not None})
                    raise RunError(
                        f"every worker still needed is hung (workers {', '.join(map(str, workers))} "
                        f"past --worker-timeout {self.worker_timeout:g} s); the run log keeps what was completed"
                    ) from None
            while True:
                try:
                    items.append(self._done.get_nowait())
                except queue.Empty:
                    break
            results: list[tuple[int, list[Event]]] = []
            for seq, it in items:
                if isinstance(it, _Partial):  # samples a running call reported early (continuous)
                    if seq in self._live:
                        self._streamed.add(seq)
                        results.append((seq, it.events))
                    continue
                if seq in self._streamed and isinstance(it, BaseException):
                    self._streamed.discard(seq)
                    raise RunError("a minibatch failed after some of its samples were returned "
                                   f"(--return-mode continuous): {it}; rerun with --resume")
                self._streamed.discard(seq)
                gone = self._abandoned.pop(seq, None)
                if gone is not None:  # an abandoned call returned: its result is discarded
                    assert gone.worker is not None
                    results.append((seq, [WorkerRestored(self.now(), gone.worker)]))
                    continue
                job = self._live.pop(seq)
                if isinstance(it, BaseException):
                    if job.worker is not None and job.minibatch is not None and is_worker_fault(it):
                        results.append((seq, [MinibatchFailed(self.now(), job.worker, job.minibatch,
                                                              fault_message(it))]))
                        continue
                    if isinstance(it, AspcError):
                        raise it
                    raise RunError(f"a worker or the trainer failed: {type(it).__name__}: {it}") from it
                results.append((seq, it))
            results += self._expire()
            if results:
                keyed = [(EVENT_PRIORITY[type(ev)], seq, i, ev) for seq, evs in results for i, ev in enumerate(evs)]
                return [ev for *_k, ev in sorted(keyed, key=lambda k: k[:3])]
