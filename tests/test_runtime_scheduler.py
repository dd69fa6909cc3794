"""The pure scheduler: dispatch order, back-pressure, trainer gate, reload decisions."""

from __future__ import annotations

import numpy as np
import pytest

from aspc.runtime.core.scheduler import Dispatch, Scheduler, TrainStep


def test_dispatches_in_plan_order_to_lowest_idle_worker():
    s = Scheduler(np.array([2, 2, 2, 2, 2]), n_workers=3, global_batch=2, queue_capacity=100)
    acts = s.decide()
    assert [(a.worker, a.minibatch) for a in acts] == [(0, 0), (1, 1), (2, 2)]
    assert all(a.reload_version is None for a in acts)
    s.on_samples(np.array([4, 5]))  # mb2's samples
    s.on_minibatch_done(2)
    acts = s.decide()
    assert isinstance(acts[0], TrainStep) and acts[0].samples.tolist() == [4, 5]
    assert isinstance(acts[1], Dispatch) and (acts[1].worker, acts[1].minibatch) == (2, 3)


def test_backpressure_counts_samples_in_flight():
    # Capacity 4, minibatches of 3: after one dispatch 3 samples are committed (< 4), so a
    # second is admitted (6 committed) and then no more: depth <= capacity + one minibatch.
    s = Scheduler(np.array([3, 3, 3, 3]), n_workers=4, global_batch=2, queue_capacity=4)
    acts = s.decide()
    assert [a.minibatch for a in acts] == [0, 1]
    assert s.in_flight == 6
    s.on_samples(np.array([0, 1, 2]))
    s.on_minibatch_done(0)
    acts = s.decide()
    # Trainer takes 2 of the 3 queued; committed = 1 + 3 = 4, not below capacity: no dispatch.
    assert len(acts) == 1 and isinstance(acts[0], TrainStep)
    assert s.queued == 1 and s.in_flight == 3


def test_trainer_takes_oldest_samples_first_across_chunks():
    s = Scheduler(np.array([3, 3]), n_workers=2, global_batch=4, queue_capacity=10)
    s.decide()
    s.on_samples(np.array([3, 4, 5]))
    s.on_samples(np.array([0, 1, 2]))
    acts = s.decide()
    assert acts[0].samples.tolist() == [3, 4, 5, 0]
    assert s.leftover().tolist() == [1, 2]


def test_reload_only_when_newer_version_and_between_minibatches():
    s = Scheduler(np.array([1, 1, 1, 1]), n_workers=2, global_batch=1, queue_capacity=10)
    s.decide()  # mb0 -> w0, mb1 -> w1
    s.on_samples(np.array([0]))
    s.on_minibatch_done(0)
    acts = s.decide()  # trainer step 0; mb2 -> w0 with version 0 (no newer yet)
    assert acts[1].reload_version is None and acts[1].weights_version == 0
    s.on_train_done(1)
    s.on_samples(np.array([1]))
    s.on_minibatch_done(1)
    acts = s.decide()
    d = [a for a in acts if isinstance(a, Dispatch)][0]
    assert (d.worker, d.reload_version, d.weights_version) == (1, 1, 1)
    assert s.worker_version == [0, 1]  # w0 is mid-minibatch: it keeps its version


def test_done_and_leftover():
    s = Scheduler(np.array([3]), n_workers=1, global_batch=2, queue_capacity=2)
    s.decide()
    s.on_samples(np.arange(3))
    s.on_minibatch_done(0)
    assert isinstance(s.decide()[0], TrainStep)
    assert not s.done
    s.on_train_done(1)
    assert s.decide() == [] and s.done
    assert s.leftover().tolist() == [2]


def test_rejects_capacity_below_global_batch():
    with pytest.raises(ValueError):
        Scheduler(np.array([1]), n_workers=1, global_batch=4, queue_capacity=3)
