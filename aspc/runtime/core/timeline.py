"""A whole run as arrays: what an engine that runs a plan in one call hands the recorder.

The event loop (:func:`aspc.runtime.core.loop.drive`) reports a run one
decision and one event at a time. When every duration is known before the run
starts (the ``sim`` backend and trainer on the virtual clock), an engine can
play the same scheduler logic to the end in one compiled pass
(:meth:`aspc.runtime.core.events.Engine.run_all`) and return this record
instead; the recorder stores it as it would have stored the events one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Timeline:
    """Everything the run's observer would have been told, indexed by id.

    ``M`` minibatches, ``N`` samples, ``S`` trainer steps, ``Q`` queue rows.
    Times are seconds on the engine's clock.
    """

    mb_worker: np.ndarray  # int32 (M,): worker that generated the minibatch
    mb_version: np.ndarray  # int32 (M,): weights version it was generated with (after any reload)
    mb_reload: np.ndarray  # bool (M,): the worker reloaded weights before it
    mb_dispatch: np.ndarray  # float64 (M,): when it was dispatched (a reload starts here)
    mb_start: np.ndarray  # float64 (M,): when generation began
    mb_end: np.ndarray  # float64 (M,): when its last sample returned
    mb_done_order: np.ndarray  # int64 (M,): minibatch ids in the order they finished (event order)
    response_len: np.ndarray  # int64 (N,): tokens generated per sample
    finish_offset: np.ndarray  # float64 (N,): seconds from its minibatch's start to its last token
    finish_time: np.ndarray  # float64 (N,): when the sample reached the queue
    returned: np.ndarray  # int32 (N,): times the sample reached the queue (1 in a sound run)
    consumed_step: np.ndarray  # int32 (N,): trainer step that consumed it, -1 if left over
    step_samples: np.ndarray  # int64 (S·B,): sample ids consumed, step by step, oldest first
    step_start: np.ndarray  # float64 (S,)
    step_end: np.ndarray  # float64 (S,): when version step + 1 was published
    step_tokens: np.ndarray  # int64 (S,): prompt + response tokens of the step's samples
    step_lag_sum: np.ndarray  # int64 (S,): Σ (step − weights version) over the step's samples
    step_lag_max: np.ndarray  # int64 (S,)
    queue_time: np.ndarray  # float64 (Q,): queue rows, as Recorder.on_queue keeps them
    queue_depth: np.ndarray  # int64 (Q,): samples queued
    queue_in_flight: np.ndarray  # int64 (Q,): samples dispatched, not yet returned
    leftover: np.ndarray  # int64: sample ids still queued at the end (< one global batch)
    clock: float  # the engine's clock when the run ended

    @property
    def n_steps(self) -> int:
        return int(self.step_start.size)
