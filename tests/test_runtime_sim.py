"""The simulator: kernel vs brute force, a hand-computed timeline, determinism, reloads."""

from __future__ import annotations

import naive
import numpy as np
import pytest

from aspc.runtime import RunConfig, SimCostModel, run, work_from_table
from aspc.runtime.backends.sim import minibatch_times
from aspc.runtime.config import ReturnMode
from aspc.testing.plans import plan_table, synthetic_plan

UNIT = SimCostModel(
    decode_base=1.0,
    decode_per_seq=0.0,
    decode_per_context_token=0.0,
    prefill_base=0.0,
    prefill_per_token=0.0,
    train_base=1.0,
    train_per_token=0.0,
)


def test_kernel_matches_brute_force_and_closed_form():
    rng = np.random.default_rng(3)
    cost = SimCostModel(
        decode_base=0.01,
        decode_per_seq=1e-3,
        decode_per_context_token=1e-5,
        prefill_base=0.2,
        prefill_per_token=1e-3,
    )
    n_rows = 40
    mb = np.repeat(np.arange(8), 5)
    ptok = rng.integers(0, 50, n_rows)
    table = plan_table(mb, n_samples=rng.integers(1, 4, n_rows), prompt_tokens=ptok)
    work = work_from_table(table)
    lens = rng.integers(0, 60, work.n_total_samples)
    dur, fin = minibatch_times(work, lens, cost)
    sp = work.sample_prompt_tokens()
    for m in range(work.n_minibatches):
        s0, s1 = work.sample_offsets[m], work.sample_offsets[m + 1]
        r0, r1 = work.row_offsets[m], work.row_offsets[m + 1]
        t, f = naive.sim_minibatch_times(lens[s0:s1], sp[s0:s1], float(ptok[r0:r1].sum()), cost)
        assert dur[m] == pytest.approx(t, rel=1e-12)
        np.testing.assert_allclose(fin[s0:s1], f, rtol=1e-12)
        ln, p = lens[s0:s1], sp[s0:s1]
        closed = (
            cost.prefill_base
            + cost.prefill_per_token * ptok[r0:r1].sum()
            + cost.decode_base * ln.max()
            + cost.decode_per_seq * ln.sum()
            + cost.decode_per_context_token * np.sum(p * ln + ln * (ln - 1) / 2)
        )
        assert dur[m] == pytest.approx(closed, rel=1e-12)


def tiny_plan():
    # Four minibatches of one prompt with two samples each; a decode step costs
    # 1 s and nothing else costs anything, so a minibatch lasts its max length.
    table = plan_table([0, 1, 2, 3], n_samples=2)
    lengths = {"p0000000": [3, 3], "p0000001": [5, 5], "p0000002": [2, 2], "p0000003": [4, 4]}
    return table, lengths


def test_tiny_scenario_matches_hand_computed_timeline():
    table, lengths = tiny_plan()
    cfg = RunConfig(workers=2, global_batch=2, queue_capacity="100", reload_time=0.5)
    res = run(table, config=cfg, sim_cost_model=UNIT, actual_lengths=lengths)
    mb = res.columns["minibatches"]
    order = np.argsort(mb["minibatch"])
    # t=0: mb0 -> w0, mb1 -> w1. t=3: mb0 done, trainer step 0 (3..4), mb2 -> w0
    # (version 0 is still the newest). t=5: mb1 and mb2 done; step 1 takes mb1's
    # samples (returned first); mb3 -> w0 (lowest idle id), which reloads
    # version 1 (5..5.5) and runs 5.5..9.5. Steps 2 (6..7) and 3 (9.5..10.5).
    assert mb["worker"][order].tolist() == [0, 1, 0, 0]
    assert mb["dispatch_time"][order].tolist() == [0.0, 0.0, 3.0, 5.0]
    assert mb["start"][order].tolist() == [0.0, 0.0, 3.0, 5.5]
    assert mb["end"][order].tolist() == [3.0, 5.0, 5.0, 9.5]
    assert mb["weights_version"][order].tolist() == [0, 0, 0, 1]
    assert mb["reload"][order].tolist() == [False, False, False, True]
    st = res.columns["steps"]
    assert st["start"].tolist() == [3.0, 5.0, 6.0, 9.5]
    assert st["end"].tolist() == [4.0, 6.0, 7.0, 10.5]
    assert st["wait"].tolist() == [3.0, 1.0, 0.0, 2.5]
    assert st["lag_max"].tolist() == [0, 1, 2, 2]
    s = res.summary
    assert s.mean_iteration_time == pytest.approx((4 + 2 + 1 + 3.5) / 4)
    assert s.makespan == 9.5 and s.lower_bound == 7.0
    assert s.policy_lag_mean == pytest.approx((0 + 1 + 2 + 2) / 4)
    assert s.policy_lag_max == 2
    assert s.trainer_wait_fraction == pytest.approx(6.5 / 10.5)
    assert s.samples_consumed == 8 and s.samples_left_over == 0 and s.n_trainer_steps == 4
    assert s.n_reloads == 1
    # Worker time: w1 idles after its only minibatch (drain), none is lost to back-pressure.
    assert s.bubbles["backpressure"] == 0.0
    assert s.bubbles["drain"] == pytest.approx((4.5 + 0.0) / (2 * 9.5))


def test_tiny_scenario_backpressure():
    # Capacity of one global batch: while 2 samples are queued or in flight,
    # nothing else is dispatched, so only one worker ever runs at once.
    table, lengths = tiny_plan()
    cfg = RunConfig(workers=2, global_batch=2, queue_capacity="2", reload_time=0.0)
    res = run(table, config=cfg, sim_cost_model=UNIT, actual_lengths=lengths)
    mb = res.columns["minibatches"]
    order = np.argsort(mb["minibatch"])
    # mb0 0..3; step 0 takes it at 3 -> mb1 dispatched at 3 (w0) ..8; step 1 at 8 -> mb2 8..10; mb3 10..14.
    assert mb["dispatch_time"][order].tolist() == [0.0, 3.0, 8.0, 10.0]
    assert mb["end"][order].tolist() == [3.0, 8.0, 10.0, 14.0]
    assert res.summary.queue_depth_max <= 2 + 2
    assert res.summary.bubbles["backpressure"] > 0


def test_continuous_returns_each_sample_at_its_finish_time():
    table = plan_table([0, 0, 1], n_samples=1)
    lengths = {"p0000000": [2], "p0000001": [6], "p0000002": [4]}
    cfg = RunConfig(
        workers=1, global_batch=1, queue_capacity="10", reload_time=0.0, return_mode=ReturnMode.CONTINUOUS
    )
    res = run(table, config=cfg, sim_cost_model=UNIT, actual_lengths=lengths)
    smp = res.columns["samples"]
    assert smp["finish_time"].tolist() == [2.0, 6.0, 10.0]
    # The first sample reached the trainer before its minibatch finished.
    st = res.columns["steps"]
    assert st["start"][0] == 2.0
    static = run(
        table,
        config=RunConfig(workers=1, global_batch=1, queue_capacity="10", reload_time=0.0),
        sim_cost_model=UNIT,
        actual_lengths=lengths,
    )
    assert static.columns["samples"]["finish_time"].tolist() == [6.0, 6.0, 10.0]


@pytest.mark.parametrize("mode", ["static", "continuous"])
def test_deterministic_for_a_seed(mode):
    table = synthetic_plan(600, 16, n_samples=2, seed=1)
    cfg = RunConfig(workers=5, global_batch=48, seed=7, return_mode=ReturnMode(mode))
    a, b = run(table, config=cfg), run(table, config=cfg)
    for kind in a.columns:
        for name in a.columns[kind]:
            np.testing.assert_array_equal(a.columns[kind][name], b.columns[kind][name])
    assert a.summary.to_dict() == b.summary.to_dict()
    other = run(table, config=RunConfig(workers=5, global_batch=48, seed=8, return_mode=ReturnMode(mode)))
    assert not np.array_equal(a.columns["samples"]["response_len"], other.columns["samples"]["response_len"])


def test_reloads_are_staggered():
    # Minibatches of distinct durations and a queue large enough for no
    # back-pressure: workers finish at distinct instants, so no two reloads start together.
    rng = np.random.default_rng(0)
    n = 400
    table = plan_table(np.arange(n) // 4, n_samples=2, prompt_tokens=rng.integers(10, 300, n))
    lengths = {f"p{i:07d}": rng.integers(50, 900, 2).tolist() for i in range(n)}
    cfg = RunConfig(workers=8, global_batch=16, queue_capacity="100000", reload_time=0.3)
    res = run(table, config=cfg, actual_lengths=lengths)
    mb = res.columns["minibatches"]
    reload_at = mb["dispatch_time"][mb["reload"]]
    assert reload_at.size > 20
    assert np.unique(reload_at).size == reload_at.size
    # A reload happens only between two minibatches of a worker, and only to a newer version.
    for w in range(8):
        sel = np.flatnonzero(mb["worker"] == w)
        sel = sel[np.argsort(mb["dispatch_time"][sel])]
        assert np.all(mb["dispatch_time"][sel][1:] >= mb["end"][sel][:-1])
        versions = mb["weights_version"][sel]
        assert np.all(np.diff(versions) >= 0)
        assert np.array_equal(mb["reload"][sel][1:], np.diff(versions) > 0)
        assert not mb["reload"][sel][0] or versions[0] > 0


def test_sorted_plan_iterations_slow_down_and_random_is_padded():
    # The sorting bubble: short minibatches first flood the queue, long ones
    # later starve the trainer, so iteration times grow over the run.
    sorted_ = run(synthetic_plan(3000, 16, order="sorted", seed=2), config=RunConfig(global_batch=64))
    random_ = run(synthetic_plan(3000, 16, order="random", seed=2), config=RunConfig(global_batch=64))
    assert sorted_.summary.iteration_time_trend > 2.0
    assert random_.summary.bubbles["padding"] + random_.summary.bubbles["skew"] > (
        sorted_.summary.bubbles["padding"] + sorted_.summary.bubbles["skew"]
    )
