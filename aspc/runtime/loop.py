"""The one runtime loop every backend and engine shares.

decide (scheduler) → execute (engine) → wait for completions → report them
back, until the scheduler has nothing left to start or finish.
"""

from __future__ import annotations

from typing import Any

from aspc.progress import NULL_PROGRESS, Progress
from aspc.runtime.engine import (
    Engine,
    MinibatchFailed,
    MinibatchFinished,
    SamplesReturned,
    TrainFinished,
    WorkerRestored,
)
from aspc.runtime.recorder import Recorder
from aspc.runtime.scheduler import Dispatch, Scheduler
from aspc.runtime.work import WorkPlan


def drive(
    work: WorkPlan,
    scheduler: Scheduler,
    engine: Engine,
    recorder: Recorder,
    progress: Progress = NULL_PROGRESS,
    weights: Any = None,
) -> None:
    """Run ``work`` to completion.

    ``weights`` is the handle of the newest published version when the run
    starts: ``None`` for a fresh run, the trainer's restored version when resumed.

    Raises
    ------
    RunError
        The run stalled (nothing running, work left: a bug, reported as such),
        or a backend or trainer failed.
    """
    # ``weights``: handle of the newest published version, passed to reloads.
    m_total = work.n_minibatches
    progress.stage("run", total=m_total)
    if scheduler.restored_minibatches:
        progress.advance(scheduler.restored_minibatches)
    # Advancing a rich bar per minibatch would cost more than simulating it.
    tick = max(1, m_total // 200)
    pending_ticks = 0
    while True:
        now = engine.now()
        for action in scheduler.decide():
            if isinstance(action, Dispatch):
                recorder.on_dispatch(action, now)
                engine.start_generation(action, work.minibatch(action.minibatch), weights)
            else:
                engine.start_train(recorder.on_train_start(action, now))
        recorder.on_queue(now, scheduler.queued, scheduler.in_flight)
        if scheduler.done:
            break
        # Engines raise RunError from wait() when nothing is running: a stalled run.
        for ev in engine.wait():
            if isinstance(ev, TrainFinished):
                weights = ev.result.weights
                scheduler.on_train_done(ev.result.version)
                recorder.on_train_done(ev)
            elif isinstance(ev, SamplesReturned):
                scheduler.on_samples(ev.samples)
                recorder.on_samples(ev)
            elif isinstance(ev, MinibatchFinished):
                scheduler.on_minibatch_done(ev.worker)
                recorder.on_minibatch_done(ev)
                pending_ticks += 1
                if pending_ticks >= tick:
                    progress.advance(pending_ticks)
                    pending_ticks = 0
            elif isinstance(ev, MinibatchFailed):
                recorder.on_minibatch_failed(ev)
                # Raises RunError once the minibatch has failed more than max_retries times.
                scheduler.on_minibatch_failed(ev.worker, ev.minibatch, ev.error, lost=ev.lost)
            elif isinstance(ev, WorkerRestored):
                scheduler.on_worker_restored(ev.worker)
        # Depth right after arrivals (before the trainer takes a batch) is the
        # peak the queue-bound guarantee is about.
        recorder.on_queue(engine.now(), scheduler.queued, scheduler.in_flight)
        recorder.maybe_flush()
    progress.advance(pending_ticks)
    progress.done()
    recorder.finish(scheduler.leftover())
