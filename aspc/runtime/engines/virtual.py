"""The local engine on a virtual clock: a discrete-event driver.

Nothing sleeps. Starting a minibatch asks the backend for its (simulated)
duration and schedules the completion on an event heap; :meth:`wait` jumps the
clock to the next completion. The loop runs once per minibatch and per trainer
step (and per distinct finish time in continuous mode), never per token.

A backend call that raises a worker fault (see
:func:`~aspc.runtime.core.events.is_worker_fault`) is reported as a
:class:`~aspc.runtime.core.events.MinibatchFailed` at the dispatch instant.

``ASPC_TEST_SIM_EVENT_DELAY`` (seconds, tests only) makes every :meth:`wait`
sleep that long in real time, so a test can kill a simulated run part-way;
it changes nothing else.
"""

from __future__ import annotations

import heapq
import os
import time
from typing import Any

import numpy as np

from aspc.errors import RunError
from aspc.runtime.config import ReturnMode
from aspc.runtime.contracts import GenerationBackend, TrainBatch, Trainer, take_step
from aspc.runtime.core.events import (
    EVENT_PRIORITY,
    Engine,
    Event,
    MinibatchFailed,
    MinibatchFinished,
    SamplesReturned,
    TrainFinished,
    fault_message,
    is_worker_fault,
)
from aspc.runtime.core.scheduler import Dispatch, Scheduler
from aspc.runtime.core.timeline import Timeline
from aspc.runtime.work import MinibatchWork, WorkPlan

# Test-only: real seconds slept per wait(), to make a simulated run killable mid-way.
TEST_DELAY_ENV = "ASPC_TEST_SIM_EVENT_DELAY"


class VirtualClockEngine(Engine):
    """Runs a virtual-clock backend and trainer as a discrete-event simulation.

    When the backend's timings and the trainer's step cost are known before the
    run (``known_timing`` / ``known_step_cost``: the ``sim`` pair), a fresh run
    is played in one compiled call (:meth:`run_all`,
    :mod:`aspc.runtime.engines.virtual_batch`) instead of event by event.
    """

    # Class switch for tests that compare the one-call run with the event loop it mirrors.
    one_call = True

    def __init__(self, backend: GenerationBackend, trainer: Trainer, return_mode: ReturnMode):
        self.backend = backend
        self.trainer = trainer
        self.return_mode = ReturnMode(return_mode)
        self._now = 0.0  # simulated seconds since the run started
        self._heap: list[tuple[float, int, int, Event]] = []  # (time, priority, start order, event)
        self._seq = 0  # start order, breaks ties deterministically
        self._test_delay = float(os.environ.get(TEST_DELAY_ENV) or 0.0)

    def now(self) -> float:
        return self._now

    def _push(self, event: Event) -> None:
        heapq.heappush(self._heap, (event.time, EVENT_PRIORITY[type(event)], self._seq, event))
        self._seq += 1

    def advance_clock(self, seconds: float) -> None:
        self._now = float(seconds)

    def start_generation(self, action: Dispatch, work: MinibatchWork, weights: Any) -> None:
        t0 = self._now
        start = t0
        try:
            if action.reload_version is not None:
                start = t0 + self.backend.load_weights(action.worker, action.reload_version, weights)
            res = self.backend.generate(action.worker, work)
        except BaseException as exc:
            if not is_worker_fault(exc):
                raise
            self._push(MinibatchFailed(t0, action.worker, work.index, fault_message(exc)))
            return
        end = start + res.elapsed
        ids = np.arange(work.sample_start, work.sample_end, dtype=np.int64)
        w, m = action.worker, work.index
        if self.return_mode is ReturnMode.STATIC:
            self._push(SamplesReturned(end, w, m, ids, res.response_len, res.payload))
        else:
            # Samples finishing at the same instant arrive together, shortest first.
            # Groups are contiguous in finish order, so each is a cheap slice.
            order = np.argsort(res.finish_offset, kind="stable")
            times = res.finish_offset[order]
            ids_sorted, lens_sorted = ids[order], res.response_len[order]
            cuts = np.flatnonzero(np.r_[True, times[1:] != times[:-1], True]).tolist()
            for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                payload = None if res.payload is None else [res.payload[i] for i in order[a:b]]
                self._push(
                    SamplesReturned(
                        start + float(times[a]), w, m, ids_sorted[a:b], lens_sorted[a:b], payload
                    )
                )
        self._push(MinibatchFinished(end, w, m, t0, start, end, action.reload_version is not None, res))

    def run_all(self, work: WorkPlan, scheduler: Scheduler) -> Timeline | None:
        timing = getattr(self.backend, "known_timing", None)
        step_cost = getattr(self.trainer, "known_step_cost", None)
        if not self.one_call or self._test_delay or self._heap or timing is None or step_cost is None:
            return None
        known, cost = timing(), step_cost()
        if known is None or cost is None or not scheduler.pristine:
            return None
        from aspc.runtime.engines.virtual_batch import run_virtual  # Numba: loaded only for sim runs

        duration, finish_offset, response_len, reload_time = known
        timeline = run_virtual(
            work.sample_offsets,
            duration,
            finish_offset,
            response_len,
            work.sample_prompt_tokens(),
            n_workers=scheduler.n_workers,
            global_batch=scheduler.global_batch,
            queue_capacity=scheduler.capacity,
            max_staleness=scheduler.max_staleness,
            reload_time=reload_time,
            train_base=cost[0],
            train_per_token=cost[1],
            return_mode=self.return_mode,
            clock=self._now,
        )
        if timeline is not None:
            self._now = timeline.clock
        return timeline

    def start_train(self, batch: TrainBatch) -> None:
        res = take_step(self.trainer, batch)
        end = self._now + res.elapsed
        self._push(TrainFinished(end, batch.step, self._now, end, res))

    def wait(self) -> list[Event]:
        if not self._heap:
            raise RunError(
                "the run stalled with nothing running (a bug in aspc's scheduler); please report it"
            )
        if self._test_delay:
            time.sleep(self._test_delay)
        t = self._heap[0][0]
        events = []
        while self._heap and self._heap[0][0] == t:
            events.append(heapq.heappop(self._heap)[3])
        self._now = t
        return events
