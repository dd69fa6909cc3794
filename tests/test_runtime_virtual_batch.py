"""The one-call virtual run against its oracle, the event loop: every recorded column bit-identical."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.dataset as ds
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspc.runtime import RunConfig, SimCostModel, run
from aspc.runtime.backends.sim import SimBackend
from aspc.runtime.config import ReturnMode
from aspc.runtime.engines.virtual import VirtualClockEngine
from aspc.runtime.engines.virtual_batch import run_virtual
from aspc.testing.plans import plan_table, synthetic_plan


def _both(monkeypatch, *args, **kwargs):
    """(one-call result, event-loop result) of the same run."""
    calls = []
    real = VirtualClockEngine.run_all

    def spy(self, work, scheduler):
        out = real(self, work, scheduler)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(VirtualClockEngine, "run_all", spy)
    fast = run(*args, **kwargs)
    assert calls == [True], "the one-call path was not taken"
    monkeypatch.setattr(VirtualClockEngine, "one_call", False)
    slow = run(*args, **kwargs)
    monkeypatch.setattr(VirtualClockEngine, "one_call", True)
    return fast, slow


def _same(fast, slow):
    assert fast.summary.to_dict() == slow.summary.to_dict()
    assert fast.columns.keys() == slow.columns.keys()
    for kind, cols in slow.columns.items():
        assert fast.columns[kind].keys() == cols.keys(), kind
        for name, want in cols.items():
            got = fast.columns[kind][name]
            assert got.dtype == want.dtype, (kind, name)
            np.testing.assert_array_equal(got, want, err_msg=f"{kind}.{name}")


@st.composite
def scenarios(draw):
    n_mb = draw(st.integers(1, 14))
    rows_per_mb = draw(st.lists(st.integers(1, 4), min_size=n_mb, max_size=n_mb))
    mb = np.repeat(np.arange(n_mb), rows_per_mb)
    n = mb.size
    n_samples = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    # Few distinct lengths: ties between finish times, and between events, are the hard part.
    lengths = {f"p{i:07d}": draw(st.lists(st.integers(0, 12), min_size=1, max_size=4)) for i in range(n)}
    total = int(np.sum(n_samples))
    gb = draw(st.integers(1, max(1, total)))
    cap = draw(st.sampled_from(["auto", str(gb), str(gb + draw(st.integers(0, 20))), "2b"]))
    largest = max(int(np.sum(np.asarray(n_samples)[mb == k])) for k in range(n_mb))
    staleness = draw(st.sampled_from([None, 1, 2, 5]))
    if staleness is not None and largest > gb * staleness:
        staleness = None  # check_staleness refuses a bound no minibatch can meet
    cfg = RunConfig(
        workers=draw(st.integers(1, 5)),
        global_batch=gb,
        queue_capacity=cap,
        reload_time=draw(st.sampled_from([0.0, 0.5, 3.0])),
        return_mode=draw(st.sampled_from(list(ReturnMode))),
        max_staleness=staleness,
    )
    cost = SimCostModel(
        decode_base=draw(st.sampled_from([0.0, 1.0, 0.01])),
        decode_per_seq=draw(st.sampled_from([0.0, 0.1, 3e-5])),
        decode_per_context_token=draw(st.sampled_from([0.0, 6.5e-8])),
        prefill_base=draw(st.sampled_from([0.0, 0.01])),
        train_base=draw(st.sampled_from([0.0, 0.5, 20.0])),
        train_per_token=draw(st.sampled_from([0.0, 1e-5, 0.3])),
    )
    table = plan_table(mb, n_samples=n_samples, prompt_tokens=draw(st.integers(0, 30)))
    return table, lengths, cfg, cost


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(scenarios())
def test_one_call_run_equals_the_event_loop(monkeypatch, sc):
    table, lengths, cfg, cost = sc
    try:
        fast, slow = _both(monkeypatch, table, config=cfg, sim_cost_model=cost, actual_lengths=lengths)
    except Exception as exc:  # a configuration the runtime refuses is refused the same way by both
        monkeypatch.setattr(VirtualClockEngine, "one_call", False)
        with pytest.raises(type(exc)):
            run(table, config=cfg, sim_cost_model=cost, actual_lengths=lengths)
        return
    _same(fast, slow)


@pytest.mark.parametrize("mode", list(ReturnMode))
def test_a_larger_plan_with_drawn_lengths_is_identical(monkeypatch, mode):
    table = synthetic_plan(3000, 16, n_samples=4, seed=3)
    cfg = RunConfig(workers=8, global_batch=64, reload_time=2.0, return_mode=mode, max_staleness=3)
    fast, slow = _both(monkeypatch, table, config=cfg)
    _same(fast, slow)


def test_run_logs_are_identical(monkeypatch, tmp_path):
    table = synthetic_plan(600, 8, n_samples=2, seed=5)
    cfg = RunConfig(workers=4, global_batch=32, return_mode="continuous")
    logs = [tmp_path / "fast", tmp_path / "slow"]
    calls = iter(logs)
    fast, slow = _both(monkeypatch, table, config=cfg, log_dir=None)
    _same(fast, slow)
    real = run

    def logged(log_dir):
        return real(table, config=cfg, log_dir=log_dir)

    logged(next(calls))
    monkeypatch.setattr(VirtualClockEngine, "one_call", False)
    logged(next(calls))
    for kind in ("samples", "minibatches", "steps", "queue"):
        a, b = (ds.dataset(p / kind).to_table() for p in logs)
        assert a.equals(b), kind
    metas = [json.loads((p / "meta.json").read_text()) for p in logs]
    for m in metas:
        m.pop("started", None), m.pop("finished", None), m.pop("updated", None)
    assert metas[0]["summary"] == metas[1]["summary"]
    assert metas[0]["run"] == metas[1]["run"]


def test_the_event_loop_is_used_when_a_log_commits_every_turn(monkeypatch, tmp_path):
    seen = []
    real = VirtualClockEngine.run_all
    monkeypatch.setattr(VirtualClockEngine, "run_all", lambda self, w, s: seen.append(1) or real(self, w, s))
    table = synthetic_plan(200, 8, seed=1)
    run(table, config=RunConfig(workers=2, global_batch=16, log_flush_seconds=0.0), log_dir=tmp_path / "R")
    assert seen == []
    run(table, config=RunConfig(workers=2, global_batch=16))
    assert seen == [1]


def test_a_sim_backend_subclass_runs_event_by_event():
    class Slower(SimBackend):
        def generate(self, worker, work):
            res = super().generate(worker, work)
            return type(res)(res.response_len, res.finish_offset * 2, res.elapsed * 2)

    b = Slower(SimCostModel(), np.ones(4, dtype=np.int64))
    b._duration, b._finish = np.ones(1), np.ones(4)
    assert b.known_timing() is None
    plain = SimBackend(SimCostModel(), np.ones(4, dtype=np.int64))
    assert plain.known_timing() is None  # before setup
    plain._duration, plain._finish = np.ones(1), np.ones(4)
    assert plain.known_timing() is not None


def test_wrapper_checks_its_inputs():
    ok = dict(n_workers=1, global_batch=1, queue_capacity=1, max_staleness=None, reload_time=0.0,
              train_base=0.0, train_per_token=0.0, return_mode=ReturnMode.STATIC)
    args = (np.array([0, 2]), np.ones(1), np.ones(2), np.ones(2, dtype=np.int64), np.zeros(2, dtype=np.int64))
    tl = run_virtual(*args, **ok)
    assert tl is not None and tl.n_steps == 2 and tl.leftover.size == 0
    with pytest.raises(ValueError, match="finish_offset has shape"):
        run_virtual(args[0], args[1], np.ones(3), *args[3:], **ok)
    with pytest.raises(ValueError, match="queue_capacity"):
        run_virtual(*args, **{**ok, "queue_capacity": 0})
    with pytest.raises(ValueError, match="must be finite"):
        run_virtual(args[0], np.array([-1.0]), *args[2:], **ok)


def test_a_patched_generate_runs_event_by_event(monkeypatch):
    from aspc.runtime.backends import sim as simb

    original = simb.SimBackend.generate
    seen = []

    def spy(self, worker, work):
        seen.append(work.index)
        return original(self, worker, work)

    monkeypatch.setattr(simb.SimBackend, "generate", spy)
    run(synthetic_plan(64, 8, seed=2), config=RunConfig(workers=2, global_batch=8))
    assert sorted(seen) == list(range(8))
