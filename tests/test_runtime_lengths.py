"""Where simulated lengths come from: joined actual lengths, or draws from the plan."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from aspc.errors import InputError
from aspc.runtime import RunConfig, run, work_from_table
from aspc.runtime.lengths import join_actual_lengths, sample_predicted_lengths
from aspc.testing.plans import plan_table


def test_sample_i_uses_the_ith_length_and_short_lists_cycle():
    work = work_from_table(plan_table([0, 0, 1], n_samples=3))
    got = join_actual_lengths(work, {"p0000000": [1, 2, 3], "p0000001": [7], "p0000002": [4, 5]})
    assert got.response_len.tolist() == [1, 2, 3, 7, 7, 7, 4, 5, 4]
    assert got.source == "actual" and "cyclically" in got.notes[0]


def test_max_new_tokens_caps_lengths_and_bad_values_fail():
    work = work_from_table(plan_table([0, 1], n_samples=1))
    got = join_actual_lengths(work, {"p0000000": [900], "p0000001": [20]}, max_new_tokens=64)
    assert got.response_len.tolist() == [64, 20]
    with pytest.raises(InputError, match="finite and >= 0"):
        join_actual_lengths(work, {"p0000000": [np.nan], "p0000001": [20]})


def test_draws_follow_the_predicted_quantiles():
    n = 20000
    table = plan_table(np.arange(n) // 100, predicted=400.0, spread=0.5)
    work = work_from_table(table)
    got = sample_predicted_lengths(work, seed=3)
    q10, q50, q90 = np.quantile(got.response_len, [0.1, 0.5, 0.9])
    t = table.to_pydict()
    assert q50 == pytest.approx(400, rel=0.03)
    assert q10 == pytest.approx(t["predicted_q10"][0], rel=0.05)
    assert q90 == pytest.approx(t["predicted_q90"][0], rel=0.05)
    assert got.source == "sampled" and "seed 3" in got.notes[0]
    again = sample_predicted_lengths(work, seed=3)
    assert np.array_equal(got.response_len, again.response_len)


@pytest.mark.parametrize("q", [(100.0, 400.0, 500.0), (300.0, 320.0, 2000.0), (50.0, 50.0, 50.0)])
def test_draws_honour_quantiles_whose_median_is_off_centre(q):
    # The default predictor's q50 is not the geometric middle of q10 and q90: one spread fitted to
    # q10..q90 put those percentiles near 1.3 x q10 and 1.3 x q90.
    n = 20000
    table = plan_table(np.arange(n) // 100, predicted=q[1])
    for name, value in zip(("predicted_q10", "predicted_q50", "predicted_q90"), q, strict=True):
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(np.full(n, value)))
    drawn = sample_predicted_lengths(work_from_table(table), seed=1).response_len
    # Shares at or below each quantile (a heavy tail's 90th percentile itself moves 5% from seed to seed).
    shares = [float(np.mean(drawn <= v)) for v in q]
    assert shares == pytest.approx([0.1, 0.5, 0.9] if q[0] < q[2] else [1.0] * 3, abs=0.012)


def test_a_wide_upper_band_never_draws_a_negative_length():
    # q90 / q50 = 1e9 drew past int64's range: the cast made those samples negative, caps or not.
    n = 20000
    table = plan_table(np.arange(n) // 100, predicted=1.0)
    for name, value in zip(("predicted_q10", "predicted_q50", "predicted_q90"), (1.0, 1.0, 1e9), strict=True):
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(np.full(n, value)))
    work = work_from_table(table)
    drawn = sample_predicted_lengths(work, seed=0).response_len
    assert drawn.min() >= 1 and drawn.max() <= 1e9
    assert sample_predicted_lengths(work, seed=0, max_new_tokens=4096).response_len.max() == 4096


def test_samples_per_prompt_overrides_the_plan():
    table = plan_table(np.arange(10) // 5, n_samples=1)
    res = run(table, config=RunConfig(workers=2, global_batch=5, samples_per_prompt=3))
    assert res.summary.samples_planned == 30
    assert res.summary.samples_consumed == 30
