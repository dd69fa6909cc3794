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
from aspc.runtime.calibrate import GEN_COEFS, calibrate, calibrate_columns, is_continuous, sample_features, select_free
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


def test_static_log_records_decode_times_matching_the_cost_model(tmp_path):
    # Static return: every sample enters the queue with its minibatch, but its decode_time is
    # its own finish under the cost model (the sim kernel), the same offset a continuous run reports.
    table = synthetic_plan(240, 8, n_samples=2, seed=3)
    run(table, config=RunConfig(workers=2, global_batch=16), sim_cost_model=TRUE, log_dir=tmp_path / "S")
    run(table, config=RunConfig(workers=2, global_batch=16, return_mode="continuous"), sim_cost_model=TRUE,
        log_dir=tmp_path / "C")
    (ss, sm), (cs, cm) = _cols(tmp_path / "S"), _cols(tmp_path / "C")
    assert not is_continuous(ss, sm) and is_continuous(cs, cm)
    key = lambda s: np.lexsort((s["sample_index"], s["minibatch"]))  # noqa: E731
    s_dec, c_dec = ss["decode_time"][key(ss)], cs["decode_time"][key(cs)]
    c_fin = (cs["finish_time"] - cm["start"][np.searchsorted(cm["minibatch"], cs["minibatch"], sorter=None)])
    assert np.all(np.isfinite(s_dec)) and np.allclose(s_dec, c_dec, rtol=1e-12, atol=1e-9)
    order = np.argsort(cm["minibatch"])
    cm_start = dict(zip(cm["minibatch"][order].tolist(), cm["start"][order].tolist(), strict=True))
    c_fin = cs["finish_time"] - np.array([cm_start[m] for m in cs["minibatch"].tolist()])
    assert np.allclose(cs["decode_time"], c_fin, rtol=1e-12, atol=1e-9)
    # The longest sample of each minibatch ends with it.
    dur = dict(zip(sm["minibatch"].tolist(), (sm["end"] - sm["start"]).tolist(), strict=True))
    longest = {}
    for m, d in zip(ss["minibatch"].tolist(), ss["decode_time"].tolist(), strict=True):
        longest[m] = max(longest.get(m, 0.0), d)
    assert all(longest[m] == pytest.approx(dur[m], rel=1e-12) for m in dur)


def test_static_log_recovers_coefficients_and_predicts_another_plan(tmp_path):
    # Equal minibatch sizes, static return: fitted on the samples' decode times.
    table = synthetic_plan(240, 8, n_samples=2, seed=3)
    cfg = RunConfig(workers=2, global_batch=16)
    run(table, config=cfg, sim_cost_model=TRUE, log_dir=tmp_path / "S")
    cal = calibrate(tmp_path / "S")
    assert cal.fit_rows == "samples" and cal.n_fit_rows == 480
    assert any("480 sample decode times" in n for n in cal.notes)
    got, want = cal.sim_cost_model.to_dict(), TRUE.to_dict()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-12), k
    assert all(cal.std_errors[k] is not None and cal.std_errors[k] < 1e-6 * max(want[k], 1e-9) + 1e-12
               for k in want), cal.std_errors  # noise-free: (near) zero standard errors
    # Another plan (sorted, other sizes and seed): the fitted model predicts the true model's makespan.
    other = synthetic_plan(300, 5, n_samples=2, order="sorted", seed=11)
    truth = run(other, config=cfg, sim_cost_model=TRUE).summary.makespan
    pred = run(other, config=cfg, sim_cost_model=cal.sim_cost_model).summary.makespan
    assert pred == pytest.approx(truth, rel=1e-6)


def test_hf_static_log_is_fitted_on_minibatch_rows(tmp_path):
    # hf's static generate keeps computing finished rows: its sample times do not follow the step model.
    table = synthetic_plan(240, 8, n_samples=2, seed=3)
    run(table, config=RunConfig(workers=2, global_batch=16), sim_cost_model=TRUE, log_dir=tmp_path / "S")
    log = R.read_run_log(tmp_path / "S")
    cal = calibrate_columns(R.to_columns(log.tables[R.MINIBATCHES]), R.to_columns(log.tables[R.STEPS]),
                            samples=R.to_columns(log.tables[R.SAMPLES]), padded=True)
    assert cal.fit_rows == "minibatches" and cal.n_fit_rows == 30
    assert any("computes finished sequences" in n for n in cal.notes)


def _noisy_static_columns(rng, coef, n_mb, size, jitter):
    """A static run's minibatch and sample columns, step by step, each decode step's time scaled by 1 + jitter·N(0,1)."""
    p0, p1, a, b, c = coef
    smp = {k: [] for k in ("minibatch", "response_len", "prompt_tokens", "decode_time", "finish_time")}
    mbs = {k: [] for k in ("minibatch", "start", "end", "prompt_tokens", "max_len", "tokens", "context_tokens")}
    t = 0.0
    for m in range(n_mb):
        lens = rng.integers(1, 65, size)
        ptok = rng.integers(8, 65, size)
        now = p0 + p1 * ptok.sum()
        done = np.zeros(size)
        for step in range(1, lens.max() + 1):
            on = lens >= step
            now += (a + b * on.sum() + c * (ptok[on] + step - 1).sum()) * (1 + jitter * rng.standard_normal())
            done[lens == step] = now
        mbs["minibatch"].append(m)
        mbs["start"].append(t)
        mbs["end"].append(t + now)
        mbs["prompt_tokens"].append(ptok.sum())
        mbs["max_len"].append(lens.max())
        mbs["tokens"].append(lens.sum())
        mbs["context_tokens"].append(float((ptok * lens + lens * (lens - 1) / 2).sum()))
        for ln, pt, d in zip(lens, ptok, done, strict=True):
            for k, v in (("minibatch", m), ("response_len", ln), ("prompt_tokens", pt), ("decode_time", d),
                         ("finish_time", t + now)):
                smp[k].append(v)
        t += now + 0.01
    return {k: np.asarray(v) for k, v in smp.items()}, {k: np.asarray(v) for k, v in mbs.items()}


def test_noisy_static_log_fitted_on_decode_times_recovers_step_and_sequence_costs():
    # The benchmark's shape (24 minibatches of 4, lengths up to 64) with 15% noise on every decode step:
    # the decode times pin a (per step) and b (per sequence), and the standard errors cover the truth.
    coef = (0.05, 2e-4, 0.061, 0.0089, 0.0)  # float32 vLLM on 2 CPU cores (benchmarks/vllm_step_cost.py)
    rng = np.random.default_rng(4)
    smp, mbs = _noisy_static_columns(rng, coef, 24, 4, 0.15)
    steps = {"end": np.zeros(0), "start": np.zeros(0), "tokens": np.zeros(0)}
    cal = calibrate_columns(mbs, steps, samples=smp)
    assert cal.fit_rows == "samples" and cal.n_fit_rows == 96
    got = cal.sim_cost_model
    assert got.decode_base == pytest.approx(0.061, rel=0.05)
    assert got.decode_per_seq == pytest.approx(0.0089, rel=0.25)
    for k, true in (("decode_base", 0.061), ("decode_per_seq", 0.0089)):
        se = cal.std_errors[k]
        assert se is not None and 0 < se and abs(getattr(got, k) - true) < 4 * se, (k, se)
    # A plan of other minibatches (sorted lengths: fewer steps for the same tokens) is predicted within 3%.
    osmp, ombs = _noisy_static_columns(np.random.default_rng(5), coef, 24, 4, 0.0)
    x = np.column_stack([np.ones(24), ombs["prompt_tokens"], ombs["max_len"], ombs["tokens"], ombs["context_tokens"]])
    g = np.array([getattr(got, k) for k in GEN_COEFS])
    truth = float((ombs["end"] - ombs["start"]).sum())
    assert float((x @ g).sum()) == pytest.approx(truth, rel=0.03)


def test_old_static_log_without_decode_times_uses_minibatch_rows_and_cross_validation(tmp_path):
    # A log from before format 1.2 (no decode_time): 12 minibatch rows for five coefficients, so
    # cross-validation chooses the free ones; exact data keep every one the data need.
    table = synthetic_plan(96, 8, n_samples=2, seed=3)
    run(table, config=RunConfig(workers=2, global_batch=16), sim_cost_model=TRUE, log_dir=tmp_path / "S")
    _make_old_format(tmp_path / "S")
    log = R.read_run_log(tmp_path / "S")
    assert np.isnan(R.to_columns(log.tables[R.SAMPLES])["decode_time"]).all()
    cal = calibrate(tmp_path / "S")
    assert cal.fit_rows == "minibatches" and cal.n_fit_rows == 12
    assert any("cross-validation" in n for n in cal.notes)
    got, want = cal.sim_cost_model.to_dict(), TRUE.to_dict()
    for k in GEN_COEFS:
        assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-12), k


def test_cross_validation_holds_an_absent_term_at_zero():
    # Data made without the context and prefill-per-token terms: the smallest subset that fits is chosen.
    rng = np.random.default_rng(0)
    x = np.column_stack([np.ones(20), rng.integers(50, 250, 20), rng.integers(5, 64, 20), rng.integers(20, 200, 20),
                         rng.random(20) * 1e4])
    y = x @ np.array([0.05, 0.0, 0.061, 0.0089, 0.0])
    assert select_free(x, y, np.arange(20)).tolist() == [True, False, True, True, False]
    y_all = x @ np.array([0.05, 2e-4, 0.061, 0.0089, 1e-6])
    assert select_free(x, y_all, np.arange(20)).all()


def _make_old_format(run_dir):
    """Rewrite a run log as format 1.1 wrote it: sample parts without decode_time."""
    import json

    import pyarrow.parquet as pq

    for part in (run_dir / "samples").glob("part-*.parquet"):
        t = pq.read_table(part)
        pq.write_table(t.drop_columns(["decode_time"]), part)
    meta = json.loads((run_dir / "meta.json").read_text())
    meta["format_version"] = "1.1"
    (run_dir / "meta.json").write_text(json.dumps(meta))


def test_minibatch_overhead_is_step_over_sequence_cost(tmp_path):
    from aspc.runtime.calibrate import MAX_MINIBATCH_OVERHEAD, Calibration

    cal = Calibration(TRUE, 10, 0, None, None, None, [])
    assert cal.minibatch_overhead == pytest.approx(0.021 / 7e-5)
    flat = Calibration(SimCostModel(decode_base=0.08, decode_per_seq=0.0), 10, 0, None, None, None, [])
    assert flat.minibatch_overhead == MAX_MINIBATCH_OVERHEAD  # steps are all that cost
    none = Calibration(SimCostModel(decode_base=0.0, decode_per_seq=0.0), 10, 0, None, None, None, [])
    assert none.minibatch_overhead is None
