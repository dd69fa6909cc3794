"""The one runtime loop every backend and engine shares.

decide (scheduler) → execute (engine) → wait for completions → report them
back, until the scheduler has nothing left to start or finish. The loop
builds each trainer batch itself (:class:`~aspc.runtime.core.batches.BatchBuilder`);
the observer (the run's recorder) only watches, so recording can never change
what runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from aspc.progress import NULL_PROGRESS, Progress
from aspc.runtime.carry import drop_stale_carries
from aspc.runtime.contracts import ReplanView
from aspc.runtime.core.batches import BatchBuilder
from aspc.runtime.core.events import (
    Engine,
    MinibatchFailed,
    MinibatchFinished,
    SamplesReturned,
    TrainFinished,
    WorkerRestored,
)
from aspc.runtime.core.revise import revise_work
from aspc.runtime.core.scheduler import Dispatch, Scheduler

if TYPE_CHECKING:
    from aspc.runtime.contracts import Replanner, TrainBatch
    from aspc.runtime.core.timeline import Timeline
    from aspc.runtime.work import WorkPlan


class RunObserver(Protocol):
    """What the loop reports as it goes (:class:`aspc.runtime.record.recorder.Recorder` implements it)."""

    def on_dispatch(self, action: Dispatch, now: float) -> None: ...
    def on_train_start(self, batch: TrainBatch, now: float) -> None: ...
    def on_queue(self, now: float, depth: int, in_flight: int) -> None: ...
    def on_train_done(self, ev: TrainFinished) -> None: ...
    def on_samples(self, ev: SamplesReturned) -> None: ...
    def on_minibatch_done(self, ev: MinibatchFinished) -> None: ...
    def on_minibatch_failed(self, ev: MinibatchFailed) -> None: ...
    # Whether the observer may be handed the whole run at once (on_timeline) instead of event by event.
    takes_whole_run: bool

    def on_timeline(self, timeline: Timeline) -> None: ...
    def maybe_flush(self) -> None: ...
    def finish(self, leftover: np.ndarray) -> None: ...


def _next_window(steps_done: int, replanner: Replanner | None) -> int | None:
    """The trainer step of the next window: the next multiple of ``every_steps`` past ``steps_done``.

    A fixed grid, not ``every_steps`` after the last window, so that a resumed
    run, which knows only the steps its log holds, keeps the windows an
    uninterrupted run has.
    """
    if replanner is None or not replanner.every_steps:
        return None
    return (steps_done // replanner.every_steps + 1) * replanner.every_steps


def drive(
    work: WorkPlan,
    scheduler: Scheduler,
    engine: Engine,
    observer: RunObserver,
    progress: Progress = NULL_PROGRESS,
    weights: Any = None,
    batches: BatchBuilder | None = None,
    replanner: Replanner | None = None,
    on_revision: Callable[[WorkPlan, int, np.ndarray, int], None] | None = None,
    *,
    steps_done: int = 0,
    revision: int = 0,
) -> None:
    """Run ``work`` to completion.

    ``weights`` is the handle of the newest published version when the run
    starts: ``None`` for a fresh run, the trainer's restored version when
    resumed. ``batches`` builds the trainer's batches; a resumed run passes
    one restored from its log, a fresh run gets a new one. ``replanner``
    revises the undispatched remainder after every ``replanner.every_steps``
    trainer steps, or whenever it ``wants_revision`` (:mod:`aspc.runtime.core.revise`); ``on_revision(work,
    first, new_to_old, revision)`` tells the backend and the recorder. A
    resumed run passes the trainer steps its log holds (``steps_done``) and
    the revisions already applied to ``work`` (``revision``), so windows and
    revision ids continue where the log ended.

    An engine that can play the whole run in one call
    (:meth:`~aspc.runtime.core.events.Engine.run_all`: the sim on the virtual
    clock) does so when nothing can change the run part-way (no replanner),
    nothing has started and the observer agrees (``takes_whole_run``: a run
    log committed every loop turn wants the turns); the observer then gets the run's
    :class:`~aspc.runtime.core.timeline.Timeline` instead of the events.

    Raises
    ------
    RunError
        The run stalled (nothing running, work left: a bug, reported as such),
        or a backend or trainer failed.
    """
    batches = batches or BatchBuilder(work)
    m_total = work.n_minibatches
    progress.stage("run", total=m_total)
    if scheduler.restored_minibatches:
        progress.advance(scheduler.restored_minibatches)
    # Advancing a rich bar per minibatch would cost more than simulating it.
    tick = max(1, m_total // 200)
    pending_ticks = 0
    next_window = _next_window(steps_done, replanner)
    one_call = replanner is None and steps_done == 0 and getattr(observer, "takes_whole_run", False)
    timeline = engine.run_all(work, scheduler) if one_call else None
    if timeline is not None:
        observer.on_timeline(timeline)
        progress.advance(m_total)
        progress.done()
        observer.finish(timeline.leftover)
        return
    while True:
        now = engine.now()
        for action in scheduler.decide():
            if isinstance(action, Dispatch):
                drop_stale_carries(work, action.minibatch, action.weights_version)
                batches.on_dispatch(action)
                observer.on_dispatch(action, now)
                engine.start_generation(action, work.minibatch(action.minibatch), weights)
            else:
                batch = batches.take(action)
                observer.on_train_start(batch, now)
                engine.start_train(batch)
        observer.on_queue(now, scheduler.queued, scheduler.in_flight)
        if scheduler.done:
            break
        # Engines raise RunError from wait() when nothing is running: a stalled run.
        for ev in engine.wait():
            if isinstance(ev, TrainFinished):
                steps_done += 1
                weights = ev.result.weights
                scheduler.on_train_done(ev.result.version)
                observer.on_train_done(ev)
            elif isinstance(ev, SamplesReturned):
                scheduler.on_samples(ev.samples)
                batches.on_samples(ev)
                observer.on_samples(ev)
            elif isinstance(ev, MinibatchFinished):
                scheduler.on_minibatch_done(ev.worker)
                observer.on_minibatch_done(ev)
                pending_ticks += 1
                if pending_ticks >= tick:
                    progress.advance(pending_ticks)
                    pending_ticks = 0
            elif isinstance(ev, MinibatchFailed):
                observer.on_minibatch_failed(ev)
                # Raises RunError once the minibatch has failed more than max_retries times.
                scheduler.on_minibatch_failed(ev.worker, ev.minibatch, ev.error, lost=ev.lost)
            elif isinstance(ev, WorkerRestored):
                scheduler.on_worker_restored(ev.worker)
        # Depth right after arrivals (before the trainer takes a batch) is the
        # peak the queue-bound guarantee is about.
        observer.on_queue(engine.now(), scheduler.queued, scheduler.in_flight)
        if replanner is not None:
            due = next_window is not None and steps_done >= next_window
            if due:
                next_window = _next_window(steps_done, replanner)
            # wants_revision first: it is cheap, first_undispatched walks the dispatch order.
            first = scheduler.first_undispatched if due or replanner.wants_revision(work, batches.observed) else None
            if first is not None:
                view = ReplanView(work, first, batches.observed(), steps_done, revision)
                tail = replanner.revise(view)
                if tail is not None:
                    revision += 1
                    new_to_old = revise_work(work, first, tail, view.response_len)
                    scheduler.revise(first, work.minibatch_sizes[first:], work.holds)
                    batches.on_revision(work, first, new_to_old)
                    if on_revision is not None:
                        on_revision(work, first, new_to_old, revision)
        observer.maybe_flush()
    progress.advance(pending_ticks)
    progress.done()
    observer.finish(scheduler.leftover())
