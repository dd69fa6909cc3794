"""--return-mode continuous on the local engine with a streaming backend (the vllm backend's contract).

A stand-in streaming backend (no vLLM needed, so these run in the default
suite) reports each sample as it ends; the engine must queue it then, before
its minibatch ends, count every sample exactly once, and refuse to retry a
minibatch that already handed some samples out.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from aspc.errors import ConfigError, RunError
from aspc.runtime import RunConfig, SimCostModel, run
from aspc.runtime.config import ReturnMode
from aspc.runtime.contracts import Clock, GenerationBackend, GenerationResult
from aspc.runtime.engines.threads import ThreadEngine
from aspc.testing.plans import plan_table

TICK = 0.004  # wall seconds per generated token


class Streaming(GenerationBackend):
    """Wall-clock backend: sample k of a minibatch takes lengths[k] ticks and is reported when it ends."""

    clock = Clock.WALL
    streams = True

    def __init__(self, lengths: np.ndarray, fail_after_first: bool = False):
        self.lengths = lengths
        self.fail_after_first = fail_after_first
        self.calls = 0

    def load_weights(self, worker, version, weights):
        return 0.0

    def generate(self, worker, work, on_samples=None):
        self.calls += 1
        lens = self.lengths[work.sample_start : work.sample_end]
        order = np.argsort(lens, kind="stable")
        t0 = time.perf_counter()
        finish = np.zeros(lens.size)
        for k, p in enumerate(order):
            time.sleep(max(0.0, t0 + lens[p] * TICK - time.perf_counter()))
            finish[p] = time.perf_counter() - t0
            if on_samples is not None:
                on_samples(np.array([p]), lens[[p]], None)
            if self.fail_after_first and k == 0:
                raise RuntimeError("engine died mid-minibatch")
        return GenerationResult(response_len=lens.copy(), finish_offset=finish, elapsed=time.perf_counter() - t0)


def _plan(n_rows=8):
    table = plan_table(np.arange(n_rows) // 4, n_samples=2)
    rng = np.random.default_rng(0)
    return table, rng.integers(1, 60, size=2 * n_rows).astype(np.int64)


def test_continuous_returns_samples_before_their_minibatch_ends():
    table, lens = _plan()
    res = run(table, config=RunConfig(workers=1, global_batch=4, return_mode="continuous"),
              backend=Streaming(lens), sim_cost_model=SimCostModel())
    s, mb = res.columns["samples"], res.columns["minibatches"]
    assert res.summary.samples_generated == lens.size == len(s["response_len"])
    assert np.array_equal(np.sort(s["response_len"]), np.sort(lens))
    end = dict(zip(mb["minibatch"].tolist(), mb["end"].tolist(), strict=True))
    early = [t < end[m] - 5 * TICK for t, m in zip(s["finish_time"], s["minibatch"], strict=True)]
    assert sum(early) >= lens.size // 2  # short samples reach the queue well before the longest ends
    static = run(table, config=RunConfig(workers=1, global_batch=4, return_mode="static"),
                 backend=Streaming(lens), sim_cost_model=SimCostModel())
    st, smb = static.columns["samples"], static.columns["minibatches"]
    send = dict(zip(smb["minibatch"].tolist(), smb["end"].tolist(), strict=True))
    assert all(t == pytest.approx(send[m]) for t, m in zip(st["finish_time"], st["minibatch"], strict=True))


def test_a_failure_after_early_returns_stops_the_run():
    table, lens = _plan()
    with pytest.raises(RunError, match="continuous"):
        run(table, config=RunConfig(workers=1, global_batch=4, return_mode="continuous"),
            backend=Streaming(lens, fail_after_first=True), sim_cost_model=SimCostModel())


def test_continuous_needs_a_streaming_backend():
    class Whole(Streaming):
        streams = False

    from aspc.runtime.trainers.sim import SimTrainer

    with pytest.raises(ConfigError, match="streaming backend"):
        ThreadEngine(Whole(np.zeros(1, dtype=np.int64)), SimTrainer(SimCostModel()), ReturnMode.CONTINUOUS)
