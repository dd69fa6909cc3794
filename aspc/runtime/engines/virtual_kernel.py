"""Numba kernel of the one-call virtual run: the scheduler and the event heap, played to the end.

No validation here; :func:`aspc.runtime.engines.virtual_batch.run_virtual` is
the checked wrapper, and the event loop it replaces
(:func:`aspc.runtime.core.loop.drive` with
:class:`~aspc.runtime.core.scheduler.Scheduler` and
:class:`~aspc.runtime.engines.virtual.VirtualClockEngine`) is its oracle:
the same decisions in the same order, the same floating-point operations on
the same values, so every recorded number is bit-identical.

What it mirrors, step by step (the names of the Python loop in brackets):

- ``decide``: the trainer first (a global batch, oldest samples first, when
  it is idle), then dispatches in plan order to the lowest idle worker while
  queued + in-flight samples stay below the capacity and the staleness bound
  allows [``Scheduler.decide``, ``_fresh_enough``]; a worker holding an older
  version than the newest reloads first;
- each dispatch is executed at once [``VirtualClockEngine.start_generation``]:
  its sample-return events (one per distinct finish time in continuous mode,
  shortest first) and its finished event go on a heap ordered by (time,
  priority, push order) [``EVENT_PRIORITY``, ``_seq``];
- ``wait``: every event at the earliest time, in heap order; a queue row is
  kept whenever (depth, in flight) changed [``Recorder.on_queue``].
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from aspc.numba_config import NJIT_FLAGS

# Event kinds double as priorities at one instant (EVENT_PRIORITY).
TRAIN_DONE, SAMPLES, MB_DONE = 0, 1, 2
STALLED = 1  # status: nothing running, work left


class VirtualRun(NamedTuple):
    """Inputs of :func:`_run_virtual` (contiguous arrays, plain scalars)."""

    sizes: np.ndarray  # int64 (M,): samples per minibatch, plan order
    offsets: np.ndarray  # int64 (M+1,): minibatch m owns samples offsets[m]:offsets[m+1]
    duration: np.ndarray  # float64 (M,): seconds from generation start to its last token
    finish: np.ndarray  # float64 (N,): seconds from its minibatch's start to each sample's last token
    lens: np.ndarray  # int64 (N,): response tokens per sample
    ptok: np.ndarray  # int64 (N,): prompt tokens per sample
    n_workers: int  # W >= 1
    global_batch: int  # B >= 1: samples per trainer step
    capacity: int  # queue high-water mark, samples (>= B)
    max_staleness: int  # K >= 1, or -1 for no bound
    reload_time: float  # seconds per weight reload
    train_base: float  # α: seconds per trainer step
    train_per_token: float  # β: seconds per prompt + response token of the step
    continuous: bool  # samples return at their own finish time (else with their minibatch)
    clock: float  # the engine's clock when the run starts


@njit(**NJIT_FLAGS)
def _less(i, j, ht, hp, hs):
    """Slot i's event comes before slot j's: (time, priority, push order)."""
    if ht[i] != ht[j]:
        return ht[i] < ht[j]
    if hp[i] != hp[j]:
        return hp[i] < hp[j]
    return hs[i] < hs[j]


@njit(**NJIT_FLAGS)
def _push(heap, n, slot, ht, hp, hs):
    """Sift ``slot`` up into ``heap[:n+1]``; returns the new size."""
    k = n
    heap[k] = slot
    while k > 0:
        parent = (k - 1) // 2
        if _less(heap[k], heap[parent], ht, hp, hs):
            heap[k], heap[parent] = heap[parent], heap[k]
            k = parent
        else:
            break
    return n + 1


@njit(**NJIT_FLAGS)
def _pop(heap, n, ht, hp, hs):
    """Remove the top of ``heap[:n]`` (the caller read it); returns the new size."""
    n -= 1
    heap[0] = heap[n]
    k = 0
    while True:
        left = 2 * k + 1
        if left >= n:
            break
        c = left
        if left + 1 < n and _less(heap[left + 1], heap[left], ht, hp, hs):
            c = left + 1
        if _less(heap[c], heap[k], ht, hp, hs):
            heap[k], heap[c] = heap[c], heap[k]
            k = c
        else:
            break
    return n


@njit(**NJIT_FLAGS)
def _int_push(heap, n, v):
    """Min-heap of ints (idle worker ids)."""
    k = n
    heap[k] = v
    while k > 0:
        parent = (k - 1) // 2
        if heap[k] < heap[parent]:
            heap[k], heap[parent] = heap[parent], heap[k]
            k = parent
        else:
            break
    return n + 1


@njit(**NJIT_FLAGS)
def _int_pop(heap, n):
    top = heap[0]
    n -= 1
    heap[0] = heap[n]
    k = 0
    while True:
        left = 2 * k + 1
        if left >= n:
            break
        c = left
        if left + 1 < n and heap[left + 1] < heap[left]:
            c = left + 1
        if heap[c] < heap[k]:
            heap[k], heap[c] = heap[c], heap[k]
            k = c
        else:
            break
    return top, n


@njit(**NJIT_FLAGS)
def _run_virtual(r):  # noqa: C901 - one state machine, kept whole so it reads like the loop it mirrors
    """Play the run to the end; see the module notes. Returns (status, arrays...)."""
    m_total = r.sizes.size
    n_total = r.lens.size
    w_total = r.n_workers
    bsz = r.global_batch
    sample_mb = np.empty(n_total, dtype=np.int64)
    max_size = 0
    for m in range(m_total):
        sample_mb[r.offsets[m] : r.offsets[m + 1]] = m
        max_size = max(max_size, r.sizes[m])

    mb_worker = np.full(m_total, -1, dtype=np.int32)
    mb_version = np.full(m_total, -1, dtype=np.int32)
    mb_reload = np.zeros(m_total, dtype=np.bool_)
    mb_dispatch = np.full(m_total, np.nan)
    mb_start = np.full(m_total, np.nan)
    mb_end = np.full(m_total, np.nan)
    done_order = np.empty(m_total, dtype=np.int64)
    n_done = 0
    finish_time = np.full(n_total, np.nan)
    returned = np.zeros(n_total, dtype=np.int32)
    consumed = np.full(n_total, -1, dtype=np.int32)
    s_max = n_total // bsz
    step_start = np.empty(s_max, dtype=np.float64)
    step_end = np.empty(s_max, dtype=np.float64)
    step_tokens = np.empty(s_max, dtype=np.int64)
    step_lag_sum = np.empty(s_max, dtype=np.int64)
    step_lag_max = np.empty(s_max, dtype=np.int64)
    qbuf = np.empty(n_total, dtype=np.int64)  # the queue: samples in arrival order; [head, tail) waiting
    head = 0
    tail = 0
    ret = np.empty(n_total, dtype=np.int64)  # per minibatch range: its sample ids in return order
    q_cap = 2 * (m_total + s_max) + 16  # grown by doubling when continuous returns need more
    q = (np.empty(q_cap, dtype=np.float64), np.empty(q_cap, dtype=np.int64), np.empty(q_cap, dtype=np.int64), 0)

    # Pending events live in slots; at most every running minibatch's return groups, its
    # finished event and one trainer step are pending at once.
    slots = w_total * (max_size + 1) + 2
    ht = np.empty(slots, dtype=np.float64)
    hp = np.empty(slots, dtype=np.int64)
    hs = np.empty(slots, dtype=np.int64)
    ha = np.empty(slots, dtype=np.int64)
    hb = np.empty(slots, dtype=np.int64)
    free = np.arange(slots - 1, -1, -1).astype(np.int64)  # stack of free slots
    n_free = slots
    heap = np.empty(slots, dtype=np.int64)
    n_heap = 0
    seq = 0

    idle = np.arange(w_total).astype(np.int64)  # already a min-heap
    n_idle = w_total
    worker_version = np.zeros(w_total, dtype=np.int64)
    running = np.zeros(w_total, dtype=np.bool_)
    run_version = np.zeros(w_total, dtype=np.int64)
    busy = 0
    latest = 0
    next_step = 0
    trainer_busy = False
    queued = 0
    in_flight = 0
    pos = 0
    now = r.clock
    status = 0

    while True:
        # ---- decide and execute (the trainer first: its batch frees room in the queue)
        if not trainer_busy and queued >= bsz:
            step = next_step
            tok = 0
            lag_sum = 0
            lag_max = -(2**62)
            for i in qbuf[head : head + bsz]:
                consumed[i] = step
                tok += r.lens[i] + r.ptok[i]
                lag = step - mb_version[sample_mb[i]]
                lag_sum += lag
                lag_max = max(lag_max, lag)
            head += bsz
            queued -= bsz
            trainer_busy = True
            next_step += 1
            step_start[step] = now
            step_tokens[step] = tok
            step_lag_sum[step] = lag_sum
            step_lag_max[step] = lag_max
            end = now + (r.train_base + r.train_per_token * float(tok))
            n_free -= 1
            s = free[n_free]
            ht[s], hp[s], hs[s], ha[s], hb[s] = end, TRAIN_DONE, seq, step, 0
            seq += 1
            n_heap = _push(heap, n_heap, s, ht, hp, hs)
        while n_idle > 0 and pos < m_total and queued + in_flight < r.capacity:
            m = pos
            if r.max_staleness >= 0:
                oldest = latest
                any_running = False
                for w in range(w_total):
                    if running[w] and (not any_running or run_version[w] < oldest):
                        oldest = run_version[w]
                        any_running = True
                last_step = next_step + (queued + in_flight + r.sizes[m] - 1) // bsz
                if last_step > min(oldest, latest) + r.max_staleness:
                    break
            w, n_idle = _int_pop(idle, n_idle)
            reload = worker_version[w] < latest
            if reload:
                worker_version[w] = latest
            v = worker_version[w]
            pos += 1
            running[w] = True
            run_version[w] = v
            in_flight += r.sizes[m]
            busy += 1
            mb_worker[m] = w
            mb_version[m] = v
            mb_reload[m] = reload
            mb_dispatch[m] = now
            start = now + r.reload_time if reload else now
            end = start + r.duration[m]
            mb_start[m] = start
            s0 = r.offsets[m]
            s1 = r.offsets[m + 1]
            if not r.continuous:
                for i in range(s0, s1):
                    ret[i] = i
                n_free -= 1
                s = free[n_free]
                ht[s], hp[s], hs[s], ha[s], hb[s] = end, SAMPLES, seq, s0, s1
                seq += 1
                n_heap = _push(heap, n_heap, s, ht, hp, hs)
            else:
                order = np.argsort(r.finish[s0:s1], kind="mergesort")
                for j in range(s1 - s0):
                    ret[s0 + j] = s0 + order[j]
                a = s0
                while a < s1:
                    t_a = r.finish[ret[a]]
                    b = a + 1
                    while b < s1 and r.finish[ret[b]] == t_a:
                        b += 1
                    n_free -= 1
                    s = free[n_free]
                    ht[s], hp[s], hs[s], ha[s], hb[s] = start + t_a, SAMPLES, seq, a, b
                    seq += 1
                    n_heap = _push(heap, n_heap, s, ht, hp, hs)
                    a = b
            n_free -= 1
            s = free[n_free]
            ht[s], hp[s], hs[s], ha[s], hb[s] = end, MB_DONE, seq, m, 0
            seq += 1
            n_heap = _push(heap, n_heap, s, ht, hp, hs)
        q = _queue_row(q, now, queued, in_flight)  # after the decisions
        if pos >= m_total and busy == 0 and not trainer_busy and queued < bsz:
            break
        if n_heap == 0:
            status = STALLED
            break
        # ---- wait: every event at the earliest time, in heap order
        t = ht[heap[0]]
        while n_heap > 0 and ht[heap[0]] == t:
            s = heap[0]
            n_heap = _pop(heap, n_heap, ht, hp, hs)
            free[n_free] = s
            n_free += 1
            kind = hp[s]
            if kind == TRAIN_DONE:
                trainer_busy = False
                latest = max(latest, ha[s] + 1)
                step_end[ha[s]] = t
            elif kind == SAMPLES:
                for i in ret[ha[s] : hb[s]]:
                    qbuf[tail] = i
                    tail += 1
                    finish_time[i] = t
                    returned[i] += 1
                queued += hb[s] - ha[s]
                in_flight -= hb[s] - ha[s]
            else:
                m = ha[s]
                w = mb_worker[m]
                busy -= 1
                running[w] = False
                n_idle = _int_push(idle, n_idle, w)
                mb_end[m] = t
                done_order[n_done] = m
                n_done += 1
        now = t
        q = _queue_row(q, now, queued, in_flight)  # right after the arrivals: the queue's peak
    q_time, q_depth, q_fly, n_q = q
    return (
        status, mb_worker, mb_version, mb_reload, mb_dispatch, mb_start, mb_end, done_order[:n_done],
        finish_time, returned, consumed, qbuf[:head], step_start[:next_step], step_end[:next_step],
        step_tokens[:next_step], step_lag_sum[:next_step], step_lag_max[:next_step],
        q_time[:n_q], q_depth[:n_q], q_fly[:n_q], qbuf[head:tail], now,
    )


@njit(**NJIT_FLAGS)
def _queue_row(q, now, depth, in_flight):
    """Keep a queue row when (depth, in flight) changed since the last one (Recorder.on_queue)."""
    q_time, q_depth, q_fly, n = q
    if n > 0 and q_depth[n - 1] == depth and q_fly[n - 1] == in_flight:
        return q
    if n == q_time.size:
        q_time = _grow_f(q_time, 2 * n)
        q_depth = _grow_i(q_depth, 2 * n)
        q_fly = _grow_i(q_fly, 2 * n)
    q_time[n] = now
    q_depth[n] = depth
    q_fly[n] = in_flight
    return q_time, q_depth, q_fly, n + 1


@njit(**NJIT_FLAGS)
def _grow_f(a, n):
    out = np.empty(n, dtype=np.float64)
    out[: a.size] = a
    return out


@njit(**NJIT_FLAGS)
def _grow_i(a, n):
    out = np.empty(n, dtype=np.int64)
    out[: a.size] = a
    return out
