"""The ``sim`` backend: replayed lengths timed by the simulator's cost model, no hardware.

It declares a virtual clock: its ``elapsed`` values are simulated seconds
that :class:`~aspc.runtime.engines.virtual.VirtualClockEngine` adds to its
clock. The Numba kernel is :mod:`aspc.runtime.backends.sim_kernel`; the
matching trainer is :class:`aspc.runtime.trainers.sim.SimTrainer`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aspc.errors import ConfigError
from aspc.runtime.backends.sim_cost import SimCostModel
from aspc.runtime.backends.sim_kernel import _minibatch_times
from aspc.runtime.contracts import Clock, GenerationBackend, GenerationResult
from aspc.runtime.work import MinibatchWork, WorkPlan


def minibatch_times(
    work: WorkPlan, response_len: np.ndarray, cost: SimCostModel
) -> tuple[np.ndarray, np.ndarray]:
    """Simulated duration of every minibatch and finish offset of every sample.

    Parameters
    ----------
    work
        The expanded plan.
    response_len
        int64 tokens per global sample id (length ``work.n_total_samples``), >= 0.
    cost
        The step-time coefficients.

    Returns
    -------
    (duration, finish_offset)
        float64 seconds per minibatch (prefill + every decode step up to its
        longest sequence), and per sample (prefill + decode steps up to its
        own last token). ``max(finish_offset[m]) == duration[m]``.
    """
    lens = np.ascontiguousarray(response_len, dtype=np.int64)
    if lens.shape != (work.n_total_samples,):
        raise ConfigError(f"got {lens.size} response lengths for {work.n_total_samples} planned samples")
    if lens.size and lens.min() < 0:
        raise ConfigError("response lengths must be >= 0")
    prefill = np.add.reduceat(work.prompt_tokens.astype(np.float64), work.row_offsets[:-1])
    coef = np.array(
        [
            cost.decode_base,
            cost.decode_per_seq,
            cost.decode_per_context_token,
            cost.prefill_base,
            cost.prefill_per_token,
        ],
        dtype=np.float64,
    )
    ptok = np.ascontiguousarray(work.sample_prompt_tokens(), dtype=np.int64)
    duration, finish = _minibatch_times(np.ascontiguousarray(work.sample_offsets), lens, ptok, prefill, coef)
    return duration, finish


class SimBackend(GenerationBackend):
    """Generation by cost model: replays given lengths, times them with :class:`SimCostModel`."""

    clock = Clock.VIRTUAL

    def __init__(self, cost: SimCostModel, response_len: np.ndarray, *, reload_time: float = 0.0):
        self.cost = cost  # step-time coefficients
        self.response_len = np.asarray(response_len, dtype=np.int64)  # per global sample id, tokens
        self.reload_time = float(reload_time)  # seconds per weight reload
        self._duration: np.ndarray | None = None  # per minibatch, seconds (set by setup)
        self._finish: np.ndarray | None = None  # per sample, seconds from generation start
        # With carried samples (set by setup): timing and lengths of each minibatch with its
        # carried samples kept (no decode step spent on them: they finish at prefill).
        self._carried: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._work: WorkPlan | None = None

    def setup(self, work: WorkPlan, n_workers: int) -> None:
        # All lengths are known up front, so every minibatch is timed in one
        # vectorised pass instead of once per dispatch.
        self._duration, self._finish = minibatch_times(work, self.response_len, self.cost)
        self._work, self._carried = work, None
        if work.carried is not None:
            assert work.carried_len is not None
            duration, finish = minibatch_times(work, np.where(work.carried, 0, self.response_len), self.cost)
            self._carried = (duration, finish, np.where(work.carried, work.carried_len, self.response_len))

    def on_revision(self, work: WorkPlan, first: int, new_to_old: np.ndarray) -> None:
        """The undispatched remainder was revised: lengths follow their (prompt, sample) pairs."""
        self.response_len = self.response_len[new_to_old]
        self.setup(work, 0)

    def load_weights(self, worker: int, version: int, weights: Any) -> float:
        return self.reload_time

    def known_timing(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, float] | None:
        """(duration per minibatch, finish offset per sample, lengths, reload seconds), all fixed before the run.

        What lets the virtual engine play the run in one call
        (:meth:`~aspc.runtime.engines.virtual.VirtualClockEngine.run_all`).
        ``None`` before :meth:`setup`, or for a subclass whose ``generate`` or
        ``load_weights`` may answer otherwise.
        """
        cls = type(self)
        if self._duration is None or self._finish is None:
            return None
        if self._carried is not None:
            return None  # the one-call kernel knows no per-sample weights version; the event loop does
        if self._work is not None and self._work.holds is not None:
            return None  # nor held samples and dispatches gated on scouts
        if (cls.generate, cls.load_weights) != _AS_DEFINED:
            return None
        return self._duration, self._finish, self.response_len, self.reload_time

    def generate(self, worker: int, work: MinibatchWork) -> GenerationResult:
        assert self._duration is not None and self._finish is not None, "setup() not called"
        s0, s1 = work.sample_start, work.sample_end
        duration, finish, lens = self._duration, self._finish, self.response_len
        if self._carried is not None:
            carried = self._work.carried if self._work is not None else None
            if carried is not None and carried[s0:s1].any():  # kept (not dropped at dispatch)
                duration, finish, lens = self._carried
        return GenerationResult(
            response_len=lens[s0:s1],
            finish_offset=finish[s0:s1],
            elapsed=float(duration[work.index]),
        )


# The methods known_timing vouches for, as defined here: a subclass or a patch that
# replaces one (tests inject faults so) makes the run go event by event.
_AS_DEFINED = (SimBackend.generate, SimBackend.load_weights)
