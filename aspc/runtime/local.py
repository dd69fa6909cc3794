"""The local engine on the wall clock: one thread per running minibatch or trainer step.

Real backends (``hf``, ``vllm``) run here: the scheduler and the run loop are
the same as in the simulator, only the clock is real. A backend or trainer
that declares a virtual clock can still run here: its simulated seconds are
slept (times ``time_scale``), which is how a real generation backend can be
paired with a simulated trainer, and how tests check that both clocks give
the same decisions.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import numpy as np

from aspc.errors import AspcError, ConfigError, RunError
from aspc.runtime.backend import Clock, GenerationBackend, TrainBatch, Trainer
from aspc.runtime.config import ReturnMode
from aspc.runtime.engine import (
    EVENT_PRIORITY,
    Engine,
    Event,
    MinibatchFinished,
    SamplesReturned,
    TrainFinished,
)
from aspc.runtime.scheduler import Dispatch
from aspc.runtime.work import MinibatchWork


class ThreadEngine(Engine):
    """Runs backend and trainer calls in threads; timestamps are wall seconds since start.

    Parameters
    ----------
    backend, trainer
        What to run. Calls for different workers may overlap; one worker's
        calls never do.
    return_mode
        Only ``static`` for now: the backend contract returns a minibatch
        whole (streaming backends will add continuous returns).
    time_scale
        Factor on simulated seconds slept for virtual-clock components.
    """

    def __init__(
        self,
        backend: GenerationBackend,
        trainer: Trainer,
        return_mode: ReturnMode,
        *,
        time_scale: float = 1.0,
    ):
        if ReturnMode(return_mode) is not ReturnMode.STATIC:
            raise ConfigError("--return-mode continuous needs a streaming backend; use --return-mode static")
        self.backend = backend
        self.trainer = trainer
        self.time_scale = time_scale
        self._t0 = time.monotonic()
        self._done: queue.Queue[tuple[int, list[Event]] | BaseException] = queue.Queue()
        self._running = 0  # jobs started and not yet reported
        self._seq = 0  # start order, breaks ties between events of one wait

    def now(self) -> float:
        return time.monotonic() - self._t0

    def _sleep_virtual(self, clock: Clock, seconds: float) -> None:
        if clock is Clock.VIRTUAL and seconds > 0:
            time.sleep(seconds * self.time_scale)

    def _spawn(self, job: Any) -> None:
        seq = self._seq
        self._seq += 1
        self._running += 1

        def target() -> None:
            try:
                self._done.put((seq, job()))
            except BaseException as exc:  # handed to the driver thread, which raises it
                self._done.put(exc)

        threading.Thread(target=target, daemon=True).start()

    def start_generation(self, action: Dispatch, work: MinibatchWork, weights: Any) -> None:
        t0 = self.now()
        b = self.backend

        def job() -> list[Event]:
            if action.reload_version is not None:
                self._sleep_virtual(b.clock, b.load_weights(action.worker, action.reload_version, weights))
            start = self.now()
            res = b.generate(action.worker, work)
            self._sleep_virtual(b.clock, res.elapsed)
            end = self.now()
            ids = np.arange(work.sample_start, work.sample_end, dtype=np.int64)
            w, m = action.worker, work.index
            return [
                SamplesReturned(end, w, m, ids, np.asarray(res.response_len, dtype=np.int64), res.payload),
                MinibatchFinished(end, w, m, t0, start, end, action.reload_version is not None, res),
            ]

        self._spawn(job)

    def start_train(self, batch: TrainBatch) -> None:
        start = self.now()

        def job() -> list[Event]:
            res = self.trainer.step(batch)
            self._sleep_virtual(self.trainer.clock, res.elapsed)
            end = self.now()
            return [TrainFinished(end, batch.step, start, end, res)]

        self._spawn(job)

    def wait(self) -> list[Event]:
        if self._running == 0:
            raise RunError(
                "the run stalled with nothing running (a bug in aspc's scheduler); please report it"
            )
        items = [self._done.get()]
        while True:
            try:
                items.append(self._done.get_nowait())
            except queue.Empty:
                break
        self._running -= len(items)
        for it in items:
            if isinstance(it, AspcError):
                raise it
            if isinstance(it, BaseException):
                raise RunError(f"a worker or the trainer failed: {type(it).__name__}: {it}") from it
        keyed = [(EVENT_PRIORITY[type(ev)], seq, i, ev) for seq, evs in items for i, ev in enumerate(evs)]
        return [ev for *_k, ev in sorted(keyed, key=lambda k: k[:3])]
