"""Calibrating on continuous returns (how vLLM runs are fitted): sample finish times, checked by brute force.

Runs in the main venv (the simulator stands in for vLLM: it times every
sample's own finish the way vLLM's continuous returns report it).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.runtime import RunConfig, run
from aspc.runtime.backends.sim_cost import SimCostModel
from aspc.runtime.calibrate import calibrate, is_continuous, sample_features
from aspc.runtime.record import runlog as R
from aspc.testing.plans import synthetic_plan
from tests.test_runtime_calibrate import TRUE  # the same known coefficients


def brute_features(lens: list[int], ptok: list[int], i: int) -> tuple[float, float, float]:
    """(steps, Σ active, Σ context) up to sample i's last token, step by step."""
    steps = active = context = 0.0
    for t in range(1, lens[i] + 1):
        on = [j for j in range(len(lens)) if lens[j] >= t]
        steps += 1
        active += len(on)
        context += sum(ptok[j] + t - 1 for j in on)
    return steps, active, context


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 9)), min_size=1, max_size=6),
                min_size=1, max_size=5), st.randoms(use_true_random=False))
def test_sample_features_match_a_step_by_step_count(groups, rnd):
    rows = [(m, ln, p) for m, g in enumerate(groups) for ln, p in g]
    rnd.shuffle(rows)  # the log's sample order is not the minibatch order
    samples = {
        "minibatch": np.array([r[0] for r in rows]),
        "response_len": np.array([r[1] for r in rows]),
        "prompt_tokens": np.array([r[2] for r in rows]),
        "finish_time": np.arange(len(rows), dtype=float),
    }
    mbs = {"minibatch": np.arange(len(groups))[::-1].copy(), "start": np.zeros(len(groups)),
           "prompt_tokens": np.arange(len(groups))[::-1] * 10}
    x, y = sample_features(samples, mbs)
    for k, (m, _, _) in enumerate(rows):
        lens = [r[1] for r in rows if r[0] == m]
        ptok = [r[2] for r in rows if r[0] == m]
        mine = [j for j, r in enumerate(rows) if r[0] == m].index(k)
        assert x[k, 0] == 1.0 and x[k, 1] == 10 * m
        assert tuple(x[k, 2:]) == pytest.approx(brute_features(lens, ptok, mine))
    assert np.array_equal(y, samples["finish_time"])


def _cols(log_dir):
    log = R.read_run_log(log_dir)
    return R.to_columns(log.tables[R.SAMPLES]), R.to_columns(log.tables[R.MINIBATCHES])


def test_continuous_log_recovers_coefficients_from_equal_sized_minibatches(tmp_path):
    # Equal minibatch sizes (synthetic_plan) are the case where minibatch rows
    # alone leave the per-step and per-sequence terms poorly separated; the
    # sample finish times of a continuous run pin every coefficient.
    table = synthetic_plan(240, 8, n_samples=2, seed=3)
    cfg = RunConfig(workers=2, global_batch=16, return_mode="continuous")
    run(table, config=cfg, sim_cost_model=TRUE, log_dir=tmp_path / "C")
    samples, mbs = _cols(tmp_path / "C")
    assert is_continuous(samples, mbs)
    cal = calibrate(tmp_path / "C")
    assert any("sample finish times" in n for n in cal.notes)
    got, want = cal.sim_cost_model.to_dict(), TRUE.to_dict()
    for k in ("decode_base", "decode_per_seq", "decode_per_context_token", "prefill_base", "prefill_per_token"):
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-12), k
    assert cal.generation_rel_error < 1e-9


def test_static_log_is_fitted_on_minibatch_rows(tmp_path):
    table = synthetic_plan(240, 8, n_samples=2, seed=3)
    run(table, config=RunConfig(workers=2, global_batch=16), sim_cost_model=TRUE, log_dir=tmp_path / "S")
    samples, mbs = _cols(tmp_path / "S")
    assert not is_continuous(samples, mbs)
    cal = calibrate(tmp_path / "S")
    assert not any("sample finish times" in n for n in cal.notes)


def test_minibatch_overhead_is_step_over_sequence_cost(tmp_path):
    from aspc.runtime.calibrate import MAX_MINIBATCH_OVERHEAD, Calibration

    cal = Calibration(TRUE, 10, 0, None, None, None, [])
    assert cal.minibatch_overhead == pytest.approx(0.021 / 7e-5)
    flat = Calibration(SimCostModel(decode_base=0.08, decode_per_seq=0.0), 10, 0, None, None, None, [])
    assert flat.minibatch_overhead == MAX_MINIBATCH_OVERHEAD  # steps are all that cost
    none = Calibration(SimCostModel(decode_base=0.0, decode_per_seq=0.0), 10, 0, None, None, None, [])
    assert none.minibatch_overhead is None
