"""Calibration recovers the coefficients a simulated run log was generated with."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aspc.errors import ConfigError, RunError
from aspc.runtime import RunConfig, run
from aspc.runtime.backends.sim_cost import SimCostModel, load_sim_cost_model, save_sim_cost_model
from aspc.runtime.calibrate import calibrate, calibrate_columns, nnls
from aspc.testing.plans import synthetic_plan

TRUE = SimCostModel(
    decode_base=0.021,
    decode_per_seq=7e-5,
    decode_per_context_token=3e-8,
    prefill_base=0.05,
    prefill_per_token=2e-5,
    train_base=1.7,
    train_per_token=4e-6,
)


def test_calibrate_recovers_known_coefficients(tmp_path):
    # Minibatch sizes must vary, or prefill_base and decode_base are confounded
    # with the per-sequence terms; a few sizes is enough.
    table = synthetic_plan(1200, 12, n_samples=2, seed=9)
    run(table, config=RunConfig(workers=4, global_batch=24), sim_cost_model=TRUE, log_dir=tmp_path / "RUN")
    cal = calibrate(tmp_path / "RUN")
    got, want = cal.sim_cost_model.to_dict(), TRUE.to_dict()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-12), k
    assert cal.r2_generation == pytest.approx(1.0)
    assert cal.generation_rel_error < 1e-9
    # The fitted model round-trips through JSON and reproduces the run.
    save_sim_cost_model(cal.sim_cost_model, tmp_path / "cost.json")
    assert load_sim_cost_model(tmp_path / "cost.json") == cal.sim_cost_model


def test_calibrate_needs_enough_minibatches():
    cols = {"end": np.ones(3), "start": np.zeros(3)}
    with pytest.raises(RunError, match="at least"):
        calibrate_columns(cols, {"end": np.ones(0), "start": np.zeros(0)})


def test_nnls_never_negative():
    rng = np.random.default_rng(0)
    x = rng.random((50, 3))
    y = x @ np.array([2.0, 0.0, 1.0]) - 0.3 * x[:, 1]
    coef = nnls(x, y)
    assert np.all(coef >= 0)
    assert coef[1] == 0


def test_cost_model_file_errors(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"decode_base": 0.1, "decode_bsae": 1}))
    with pytest.raises(ConfigError, match="unknown keys.*decode_bsae"):
        load_sim_cost_model(p)
    p.write_text(json.dumps({"decode_base": -1}))
    with pytest.raises(ConfigError, match=">= 0"):
        load_sim_cost_model(p)
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_sim_cost_model(p)
    p.write_text(json.dumps({"train_base": 3}))
    assert load_sim_cost_model(p) == SimCostModel(train_base=3.0)
