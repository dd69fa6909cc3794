"""The decide half of the runtime: a pure state machine, no clock, no I/O.

An engine reports what happened (a worker finished, samples arrived, the
trainer published weights); :meth:`Scheduler.decide` answers what to start
next. The same scheduler runs under the simulator's virtual clock and under a
real engine's wall clock, so every backend follows one logic:

- the dispatcher hands minibatches out in plan order to free workers
  (lowest worker id first, for determinism);
- a bounded queue: a minibatch is dispatched only while the samples queued
  plus the samples in flight stay below the capacity. Counting samples in
  flight is what bounds the queue depth by capacity + one minibatch: samples
  already being generated cannot be recalled;
- the trainer takes a fixed global batch, oldest samples first, and its step
  ``k`` publishes weights version ``k + 1``;
- a worker reloads weights only between minibatches, when a newer version
  than its own exists, so reloads follow the workers' staggered finish times;
- a minibatch whose worker failed (raised, hung, died) goes back to the
  dispatcher ahead of every undispatched one; after ``max_retries`` failures
  of one minibatch the run stops (:class:`~aspc.errors.RunError`). A worker
  reported *lost* (hung past its timeout) gets no work until it is restored;
- held samples (a rolling scout's responses, :mod:`aspc.runtime.hold`) do
  not enter the queue when they return; each is queued just before the
  first sample of the row it was kept for, and a *pending* minibatch
  (planned from the prior, to be planned again from its window's scout) is
  not dispatched: dispatch waits at it until a revision replaces it;
- a resumed run (:meth:`Scheduler.restore`) starts from what its log holds:
  the minibatches not yet generated, the samples generated but not consumed
  (queued oldest first), the next trainer step and its weights version.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from aspc.errors import RunError

if TYPE_CHECKING:
    from aspc.runtime.work import Holds


@dataclass(frozen=True)
class Dispatch:
    """Start minibatch ``minibatch`` on ``worker``."""

    worker: int  # 0..W-1, idle until now
    minibatch: int  # next minibatch in plan order
    reload_version: int | None  # load this weights version first; None = keep current weights
    weights_version: int  # version that will generate the minibatch (after any reload)


@dataclass(frozen=True)
class TrainStep:
    """Run trainer step ``step`` on ``samples``."""

    step: int  # 0, 1, 2, ...; the trainer holds weights version ``step`` while it runs
    samples: np.ndarray  # int64 global sample ids, exactly one global batch, oldest first


Action = Dispatch | TrainStep


class Scheduler:
    """Dispatcher, bounded queue, trainer gate and reload policy.

    Parameters
    ----------
    minibatch_sizes
        Samples in each minibatch, in plan order.
    n_workers, global_batch, queue_capacity
        W, samples per trainer step, and the queue's high-water mark in
        samples (at least one global batch; see
        :func:`aspc.runtime.config.resolve_queue_capacity`).
    """

    def __init__(
        self,
        minibatch_sizes: np.ndarray,
        n_workers: int,
        global_batch: int,
        queue_capacity: int,
        *,
        max_retries: int = 0,
        max_staleness: int | None = None,
        holds: Holds | None = None,
    ):
        if n_workers < 1 or global_batch < 1 or queue_capacity < global_batch or max_retries < 0:
            raise ValueError(
                "need n_workers >= 1, global_batch >= 1, queue_capacity >= global_batch and max_retries >= 0"
            )
        if max_staleness is not None and max_staleness < 1:
            raise ValueError("max_staleness must be >= 1 (0 would be a synchronous pipeline)")
        # K: no sample may be consumed more than K versions after the one that generated it.
        self.max_staleness = max_staleness
        self._running: dict[int, tuple[int, int]] = {}  # worker -> (minibatch, weights version) in flight
        self.sizes = [int(s) for s in minibatch_sizes]
        self.n_workers = n_workers
        self.global_batch = global_batch
        self.capacity = queue_capacity
        self.max_retries = max_retries  # failures of one minibatch tolerated before the run stops
        self._order: list[int] = list(range(len(self.sizes)))  # minibatches to dispatch, plan order
        self._pos = 0  # next index into _order
        self._retry: list[int] = []  # min-heap of failed minibatches, dispatched before _order[_pos:]
        self.failures: dict[int, int] = {}  # minibatch -> times its worker failed on it
        self._lost: set[int] = set()  # workers hung or dead: no dispatch until restored
        self.restored_minibatches = 0  # minibatches already generated when the run was resumed
        self._idle = list(range(n_workers))  # min-heap of idle worker ids
        self.worker_version = [0] * n_workers  # weights version each worker holds
        self.busy_workers = 0  # workers with a minibatch (or reload) under way
        self.latest_version = 0  # newest published weights version
        self._queue: deque[np.ndarray] = deque()  # chunks of queued sample ids, oldest first
        self.queued = 0  # samples in the queue (== sum of chunk lengths)
        self.in_flight = 0  # samples dispatched but not yet returned
        self.trainer_busy = False
        self.next_step = 0  # index of the next trainer step
        self.holds = holds
        # Samples of each minibatch never consumed (a rolling scout's under --max-staleness: held, never
        # released), None where every sample may be; and how many of them are in flight.
        self._never = _never_consumed(holds, self.sizes)
        self.never_in_flight = 0

    # ---- events reported by the engine ----------------------------------------

    def on_samples(self, samples: np.ndarray) -> None:
        """Samples finished generating and enter the queue (call in return order)."""
        if not samples.size:
            return
        self.in_flight -= int(samples.size)
        if self.holds is not None:
            if self._never is not None:
                self.never_in_flight -= int(np.count_nonzero(self.holds.held[samples]))
            samples = samples[~self.holds.held[samples]]
            release = self.holds.release_with[samples]
            at = np.flatnonzero(release >= 0)
            if at.size:  # each just before its group's first sample: in its group's trainer step
                samples = np.insert(samples, at, release[at])
        if samples.size:
            self._queue.append(samples)
            self.queued += int(samples.size)

    def on_minibatch_done(self, worker: int) -> None:
        """``worker`` finished its minibatch; all its samples were reported first."""
        self.busy_workers -= 1
        self._running.pop(worker, None)
        heapq.heappush(self._idle, worker)

    def on_minibatch_failed(self, worker: int, minibatch: int, error: str = "", *, lost: bool = False) -> None:
        """``worker`` failed on ``minibatch`` (raised, hung or died); none of its samples were reported.

        The minibatch goes back to the dispatcher, ahead of every undispatched
        one. ``worker`` is idle again unless ``lost`` (hung, or its process
        died), in which case it gets no work until :meth:`on_worker_restored`.
        Its weights are treated as unknown: its next dispatch reloads.

        Raises
        ------
        RunError
            ``minibatch`` failed more than ``max_retries`` times.
        """
        n = self.failures.get(minibatch, 0) + 1
        self.failures[minibatch] = n
        self.busy_workers -= 1
        self._running.pop(worker, None)
        self.in_flight -= self.sizes[minibatch]
        self.never_in_flight -= self._never_of(minibatch)
        self.worker_version[worker] = -1
        if lost:
            self._lost.add(worker)
        else:
            heapq.heappush(self._idle, worker)
        heapq.heappush(self._retry, minibatch)
        if n > self.max_retries:
            raise RunError(
                f"minibatch {minibatch} failed {n} times (--max-retries {self.max_retries}); "
                f"last: worker {worker}: {error or 'failed'}"
            )

    def on_worker_restored(self, worker: int) -> None:
        """A lost worker is usable again (its hung call finally returned)."""
        if worker in self._lost:
            self._lost.discard(worker)
            heapq.heappush(self._idle, worker)

    def restore(self, done: np.ndarray, queued: np.ndarray, next_step: int) -> None:
        """Start from a run log: ``done`` minibatches are generated, ``queued`` sample ids await the trainer.

        Parameters
        ----------
        done
            bool per minibatch: its samples are durable in the log.
        queued
            int64 sample ids generated but not consumed, oldest first.
        next_step
            Trainer steps already durable; the trainer resumes at this step
            and the newest weights version is ``next_step``. Workers start
            from version 0 (fresh processes) and reload before their first
            minibatch.
        """
        self._order = np.flatnonzero(~np.asarray(done, dtype=bool)).tolist()
        self.restored_minibatches = len(self.sizes) - len(self._order)
        self._pos = 0
        self._retry = []
        self._queue = deque([np.asarray(queued, dtype=np.int64)] if len(queued) else [])
        self.queued = int(len(queued))
        self.next_step = int(next_step)
        self.latest_version = int(next_step)

    def on_train_done(self, version: int) -> None:
        """The trainer finished a step and published weights ``version``."""
        self.trainer_busy = False
        self.latest_version = max(self.latest_version, version)

    # ---- decisions -------------------------------------------------------------

    def decide(self) -> list[Action]:
        """What to start now. Call after applying every event of one instant.

        The trainer is served first, so that a batch it takes frees room in
        the queue for the dispatches decided in the same call.
        """
        actions: list[Action] = []
        if not self.trainer_busy and self.queued >= self.global_batch:
            actions.append(TrainStep(self.next_step, self._take(self.global_batch)))
            self.trainer_busy = True
            self.next_step += 1
        while self._idle and self.work_remaining and self.queued + self.in_flight < self.capacity:
            if not self._fresh_enough(self.next_minibatch) or self._pending(self.next_minibatch):
                break
            worker = heapq.heappop(self._idle)
            reload = self.latest_version if self.worker_version[worker] < self.latest_version else None
            if reload is not None:
                self.worker_version[worker] = reload
            if self._retry:
                m = heapq.heappop(self._retry)
            else:
                m = self._order[self._pos]
                self._pos += 1
            actions.append(Dispatch(worker, m, reload, self.worker_version[worker]))
            self._running[worker] = (m, self.worker_version[worker])
            self.in_flight += self.sizes[m]
            self.never_in_flight += self._never_of(m)
            self.busy_workers += 1
        return actions

    def _fresh_enough(self, m: int) -> bool:
        """Whether starting ``m`` now keeps every in-flight sample's policy lag <= K.

        The trainer takes samples oldest arrival first, so queued samples are
        consumed in the next ``queued / B`` steps whatever is dispatched later;
        a sample still being generated is consumed, at the latest, after every
        sample queued or in flight, i.e. by step ``next_step + (queued +
        in_flight - 1) // B``. Dispatching adds its samples to that count, so it
        waits until the count stays within K versions of the oldest version in
        flight and of the version it would generate with (the newest). Arrivals
        and trainer steps never raise the bound, so it holds for the whole run.
        Samples never consumed (:attr:`_never`) count nowhere: a minibatch of
        only those always starts.
        """
        k = self.max_staleness
        if k is None:
            return True
        size = self.sizes[m] - self._never_of(m)
        if size == 0:
            return True
        oldest = min((v for mb, v in self._running.values() if self.sizes[mb] > self._never_of(mb)),
                     default=self.latest_version)  # fmt: skip
        newest = self.latest_version
        flying = self.in_flight - self.never_in_flight
        last_step = self.next_step + (self.queued + flying + size - 1) // self.global_batch
        return last_step <= min(oldest, newest) + k

    def _never_of(self, m: int) -> int:
        """Samples of minibatch ``m`` never consumed (0 unless held scouts are never released)."""
        return 0 if self._never is None else int(self._never[m])

    def _pending(self, m: int) -> bool:
        """Whether ``m`` waits for a revision to replace it (a rolling scout's window not yet scouted)."""
        return self.holds is not None and bool(self.holds.pending[m])

    @property
    def pristine(self) -> bool:
        """Nothing decided or restored yet: plan order from minibatch 0, empty queue, no step taken."""
        return (
            self._pos == 0
            and self.next_step == 0
            and self.latest_version == 0
            and self.restored_minibatches == 0
            and not self._retry
            and not self._queue
            and not self._lost
            and self.busy_workers == 0
            and self.in_flight == 0
            and not self.trainer_busy
            and self._order == list(range(len(self.sizes)))
            and not any(self.worker_version)
        )

    @property
    def work_remaining(self) -> bool:
        """Minibatches not yet dispatched (or handed back after a failure)."""
        return bool(self._retry) or self._pos < len(self._order)

    @property
    def first_undispatched(self) -> int | None:
        """``k`` such that minibatches ``>= k`` were never handed out and all others were; None if not so."""
        rest = self._order[self._pos :]
        if not rest:
            return None
        k = rest[0]
        return k if rest == list(range(k, len(self.sizes))) else None

    def revise(self, first: int, sizes: np.ndarray, holds: Holds | None = None) -> None:
        """Minibatches ``>= first`` (never dispatched) are replaced by ones of ``sizes`` samples (and ``holds``)."""
        if self.first_undispatched != first:
            raise ValueError("revise() only replaces minibatches never dispatched")
        if (holds is None) != (self.holds is None):
            raise ValueError("a revision keeps a run's held samples, and adds none to a run without")
        k = self.max_staleness
        sizes = [int(x) for x in sizes]
        never = _never_consumed(holds, self.sizes[:first] + sizes)
        tail = np.asarray(sizes, dtype=np.int64) - (0 if never is None else never[first:])
        if k is not None and tail.size and int(tail.max()) > k * self.global_batch:
            raise RunError(f"a plan revision made a minibatch of {int(tail.max())} samples, larger than its replanner "
                           "declared (it could never start); please report this bug")  # fmt: skip
        self.holds, self._never = holds, never
        self.sizes = self.sizes[:first] + sizes
        self._order = list(range(len(self.sizes)))
        self._pos = first

    @property
    def next_minibatch(self) -> int:
        """The minibatch the next dispatch hands out (a retried one first); only while work remains."""
        return self._retry[0] if self._retry else self._order[self._pos]

    @property
    def done(self) -> bool:
        """Nothing is running and nothing more can start."""
        return (
            not self.work_remaining
            and self.busy_workers == 0
            and not self.trainer_busy
            and self.queued < self.global_batch
        )

    def leftover(self) -> np.ndarray:
        """Sample ids still queued: fewer than one global batch once :attr:`done`."""
        if not self._queue:
            return np.empty(0, dtype=np.int64)
        return np.concatenate(list(self._queue)).astype(np.int64)

    def _take(self, k: int) -> np.ndarray:
        parts = []
        need = k
        while need:
            chunk = self._queue[0]
            if chunk.size <= need:
                parts.append(self._queue.popleft())
                need -= chunk.size
            else:
                parts.append(chunk[:need])
                self._queue[0] = chunk[need:]
                need = 0
        self.queued -= k
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _never_consumed(holds: Holds | None, sizes: list[int]) -> np.ndarray | None:
    """Per minibatch (``sizes`` samples each, in sample-id order), its held samples where none is ever released."""
    if holds is None or holds.keeps:
        return None
    return np.add.reduceat(holds.held.astype(np.int64), np.r_[0, np.cumsum(sizes)[:-1]].astype(np.int64)) if sizes else None

