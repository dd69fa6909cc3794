"""What the trainer receives: global batches built from the samples the workers returned.

The run loop owns one :class:`BatchBuilder`. It learns each minibatch's
weights version at dispatch and each sample's length (and payload, for a real
trainer) when it returns, and turns the scheduler's
:class:`~aspc.runtime.core.scheduler.TrainStep` into a
:class:`~aspc.runtime.contracts.TrainBatch`. Payloads are dropped once
consumed, so the memory they hold is bounded by the queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from aspc.runtime.contracts import TrainBatch

if TYPE_CHECKING:
    from aspc.runtime.core.events import SamplesReturned
    from aspc.runtime.core.scheduler import Dispatch, TrainStep
    from aspc.runtime.work import WorkPlan


class BatchBuilder:
    """Per-sample lengths, prompt tokens and weights versions, until the trainer takes them."""

    def __init__(self, work: WorkPlan):
        m, n = work.n_minibatches, work.n_total_samples
        self._sample_mb = np.repeat(np.arange(m, dtype=np.int32), work.minibatch_sizes)
        self._prompt_tokens = work.sample_prompt_tokens()
        self._version = np.full(m, -1, dtype=np.int32)  # per minibatch: the version that generates it
        self._response_len = np.full(n, -1, dtype=np.int64)  # per sample, tokens; -1 until returned
        self._arrivals: list[SamplesReturned] = []  # returned, not yet written into the arrays
        self._payload: dict[int, Any] = {}  # sample id -> backend output, until consumed

    def on_dispatch(self, action: Dispatch) -> None:
        self._version[action.minibatch] = action.weights_version

    def on_samples(self, ev: SamplesReturned) -> None:
        # Buffered and applied in bulk when a batch is built (continuous mode
        # returns up to one event per sample; a scatter per event would dominate).
        self._arrivals.append(ev)
        if ev.payload is not None:
            self._payload.update(zip(ev.samples.tolist(), ev.payload, strict=True))

    def restore(self, response_len: np.ndarray, minibatch_version: np.ndarray) -> None:
        """Start from a run log's samples (a resumed run): their lengths and their minibatches' versions."""
        self._response_len[:] = response_len
        self._version[:] = minibatch_version

    def take(self, action: TrainStep) -> TrainBatch:
        """The batch of trainer step ``action.step``: its samples, oldest first."""
        if self._arrivals:
            evs, self._arrivals = self._arrivals, []
            ids = np.concatenate([ev.samples for ev in evs])
            self._response_len[ids] = np.concatenate([ev.response_len for ev in evs])
        ids = action.samples
        versions = self._version[self._sample_mb[ids]].astype(np.int64)
        payload = None
        if self._payload:
            payload = [self._payload.pop(int(i), None) for i in ids]
        return TrainBatch(action.step, ids, self._response_len[ids], self._prompt_tokens[ids], versions, payload)
