"""The same scheduler on the wall clock: the threaded local engine."""

from __future__ import annotations

import numpy as np
import pytest

from aspc.errors import AspcError, BackendError, ConfigError
from aspc.runtime import RunConfig, SimCostModel, run, work_from_table
from aspc.runtime.backends.sim import SimBackend
from aspc.runtime.config import ReturnMode
from aspc.runtime.contracts import BackendContext, Clock, GenerationBackend, GenerationResult
from aspc.runtime.core.loop import drive
from aspc.runtime.core.scheduler import Scheduler
from aspc.runtime.engines.threads import ThreadEngine
from aspc.runtime.record.metrics import summarize
from aspc.runtime.record.recorder import Recorder
from aspc.runtime.registry import make_backend, make_engine
from aspc.runtime.trainers.sim import SimTrainer
from aspc.testing.plans import plan_table


def test_thread_engine_runs_the_same_logic_on_the_wall_clock():
    rng = np.random.default_rng(1)
    n = 60
    table = plan_table(np.arange(n) // 3, n_samples=2, prompt_tokens=rng.integers(1, 50, n))
    lens = rng.integers(5, 60, 2 * n)
    work = work_from_table(table)
    cost = SimCostModel(
        decode_base=1.0,
        decode_per_seq=0.0,
        decode_per_context_token=0.0,
        prefill_base=0.0,
        prefill_per_token=0.0,
        train_base=2.0,
        train_per_token=0.0,
    )
    backend = SimBackend(cost, lens, reload_time=1.0)
    trainer = SimTrainer(cost)
    backend.setup(work, 3)
    # Simulated seconds are slept at 1/2000 scale: about 0.3 s of wall time in total.
    engine = ThreadEngine(backend, trainer, ReturnMode.STATIC, time_scale=5e-4)
    rec = Recorder(work)
    drive(work, Scheduler(work.minibatch_sizes, 3, 8, 40), engine, rec)
    s = summarize(rec.all_columns(), n_workers=3, samples_planned=2 * n, queue_capacity=40)
    assert s.samples_generated == 2 * n
    assert s.samples_consumed + s.samples_left_over == 2 * n
    assert s.samples_left_over < 8
    assert s.queue_depth_max <= 40 + 6
    assert s.n_reloads > 0
    mb = rec.all_columns()["minibatches"]
    assert np.all(mb["end"] >= mb["start"]) and np.all(mb["start"] >= mb["dispatch_time"])


def test_thread_engine_refuses_continuous_mode():
    backend = SimBackend(SimCostModel(), np.zeros(1, dtype=np.int64))
    with pytest.raises(ConfigError, match="streaming"):
        ThreadEngine(backend, SimTrainer(SimCostModel()), ReturnMode.CONTINUOUS)


def test_backend_and_engine_names_are_checked_before_anything_runs():
    table = plan_table(np.arange(4) // 2)
    with pytest.raises(AspcError):  # a real backend without its model
        run(table, config=RunConfig(backend="hf"))
    with pytest.raises(ConfigError, match="local engine"):
        run(table, config=RunConfig(engine="ray"))
    with pytest.raises(ConfigError, match="unknown backend"):
        make_backend("tpu", BackendContext(n_workers=1))
    with pytest.raises(ConfigError, match="unknown engine"):
        make_engine("slurm", SimBackend(SimCostModel(), np.zeros(1)), SimTrainer(SimCostModel()), ReturnMode.STATIC)


class _Probed(GenerationBackend):
    """Wall-clock backend of fixed 1 ms minibatches whose speed probe is scripted per call."""

    clock = Clock.WALL

    def __init__(self, probes):
        self.probes = list(probes)
        self.generated = 0

    def load_weights(self, worker, version, weights):
        return 0.0

    def generate(self, worker, work):
        self.generated += 1
        n = work.sample_end - work.sample_start
        return GenerationResult(response_len=np.full(n, 3, np.int64), finish_offset=np.full(n, 1e-3), elapsed=1e-3)

    def speed_probe(self, worker):
        value = self.probes.pop(0)
        if isinstance(value, Exception):
            raise value
        return value


def test_speed_probes_before_and_after_and_a_probe_that_fails_after_the_run_keeps_the_run():
    table = plan_table(np.arange(8) // 2, n_samples=2)
    config = RunConfig(workers=2, global_batch=4, speed_probe=True)
    backend = _Probed([0.5, 0.6, 0.7, BackendError("engine gone")])
    res = run(table, config=config, backend=backend, sim_cost_model=SimCostModel())
    assert res.summary.samples_generated == 16 and backend.generated == 4
    assert res.summary.extra["speed_probe_s"] == {"before": [0.5, 0.6], "after": [0.7, None]}
    assert any("speed probe after the run failed on worker 1" in n for n in res.notes)
    # Before the run, a probe that fails fails the run: nothing is generated.
    backend = _Probed([BackendError("no engine")])
    with pytest.raises(BackendError, match="no engine"):
        run(table, config=config, backend=backend, sim_cost_model=SimCostModel())
    assert backend.generated == 0
    # Without the option nothing is probed (the script would raise on the first call).
    res = run(table, config=RunConfig(workers=2, global_batch=4), backend=_Probed([]), sim_cost_model=SimCostModel())
    assert "speed_probe_s" not in res.summary.extra


@pytest.mark.parametrize("fails", ["backend", "trainer"])
def test_a_failure_while_setting_up_closes_the_backend_and_trainer_run_built(fails, monkeypatch):
    # Setup ran before the run's try: a vLLM backend whose plan check (or trainer's setup) failed stayed
    # open, and the process waited at exit for its engine-core process.
    table = plan_table(np.arange(8) // 2, n_samples=2)
    closed = []
    monkeypatch.setattr(SimBackend, "close", lambda self: closed.append("backend"))
    monkeypatch.setattr(SimTrainer, "close", lambda self: closed.append("trainer"), raising=False)
    target = SimBackend if fails == "backend" else SimTrainer

    def boom(self, *args):
        raise ConfigError("setup failed")

    monkeypatch.setattr(target, "setup", boom)
    with pytest.raises(ConfigError, match="setup failed"):
        run(table, config=RunConfig(workers=2, global_batch=4))
    assert sorted(closed) == ["backend", "trainer"]
