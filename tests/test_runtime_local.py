"""The same scheduler on the wall clock: the threaded local engine."""

from __future__ import annotations

import numpy as np
import pytest

from aspc.errors import AspcError, ConfigError
from aspc.runtime import RunConfig, SimCostModel, run, work_from_table
from aspc.runtime.backends.sim import SimBackend
from aspc.runtime.config import ReturnMode
from aspc.runtime.contracts import BackendContext
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
