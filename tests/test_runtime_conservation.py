"""Properties every run satisfies, for any plan and configuration (hypothesis)."""

from __future__ import annotations

import numpy as np
import pyarrow.dataset as ds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspc.runtime import RunConfig, SimCostModel, run
from aspc.runtime.config import ReturnMode
from aspc.testing.plans import plan_table


@st.composite
def scenarios(draw):
    n_mb = draw(st.integers(1, 12))
    rows_per_mb = draw(st.lists(st.integers(1, 4), min_size=n_mb, max_size=n_mb))
    mb = np.repeat(np.arange(n_mb), rows_per_mb)
    n = mb.size
    n_samples = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    lengths = {f"p{i:07d}": draw(st.lists(st.integers(0, 40), min_size=1, max_size=4)) for i in range(n)}
    total = int(np.sum(n_samples))
    gb = draw(st.integers(1, max(1, total)))
    largest = max(int(np.sum(np.asarray(n_samples)[mb == k])) for k in range(n_mb))
    cap = draw(st.sampled_from(["auto", str(gb), str(gb + draw(st.integers(0, 20))), "2b"]))
    cfg = RunConfig(
        workers=draw(st.integers(1, 5)),
        global_batch=gb,
        queue_capacity=cap,
        reload_time=draw(st.sampled_from([0.0, 0.5, 3.0])),
        return_mode=draw(st.sampled_from(list(ReturnMode))),
    )
    cost = SimCostModel(
        decode_base=draw(st.sampled_from([0.0, 1.0, 0.01])),
        decode_per_seq=draw(st.sampled_from([0.0, 0.1])),
        train_base=draw(st.sampled_from([0.0, 0.5, 20.0])),
    )
    table = plan_table(mb, n_samples=n_samples, prompt_tokens=draw(st.integers(0, 30)))
    return table, lengths, cfg, cost, largest


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_sample_generated_once_and_consumed_once_or_left_over(sc):
    table, lengths, cfg, cost, largest = sc
    res = run(table, config=cfg, sim_cost_model=cost, actual_lengths=lengths)
    s, smp, mb, stp = res.summary, res.columns["samples"], res.columns["minibatches"], res.columns["steps"]
    n = int(np.sum(table.column("n_samples").to_numpy()))
    gb = cfg.global_batch
    # Conservation (the recorder also raises if a sample was generated twice).
    assert s.samples_generated == s.samples_planned == n
    assert s.samples_consumed + s.samples_left_over == n
    assert s.samples_left_over < gb
    assert s.samples_consumed == s.n_trainer_steps * gb
    steps, counts = np.unique(smp["consumed_step"][smp["consumed_step"] >= 0], return_counts=True)
    assert steps.tolist() == list(range(s.n_trainer_steps)) and np.all(counts == gb)
    # The queue never holds more than capacity + one minibatch.
    assert s.queue_depth_max <= s.queue_capacity + largest
    assert np.all(res.columns["queue"]["depth"] >= 0)
    # Minibatches go out in plan order; a worker runs one at a time.
    order = np.argsort(mb["minibatch"])
    assert np.all(np.diff(mb["dispatch_time"][order]) >= 0)
    for w in np.unique(mb["worker"]):
        sel = np.flatnonzero(mb["worker"] == w)
        sel = sel[np.argsort(mb["dispatch_time"][sel], kind="stable")]
        assert np.all(mb["dispatch_time"][sel][1:] >= mb["end"][sel][:-1])
    # Lag is never negative; a sample reaches the trainer after it was generated.
    consumed = smp["consumed_step"] >= 0
    assert np.all(smp["policy_lag"][consumed] >= 0)
    step_start = stp["start"][np.argsort(stp["step"])]
    assert np.all(smp["finish_time"][consumed] <= step_start[smp["consumed_step"][consumed]])
    assert s.makespan >= s.lower_bound - 1e-9


def test_run_log_holds_every_planned_sample_once(tmp_path):
    rng = np.random.default_rng(5)
    n = 300
    table = plan_table(np.arange(n) // 7, n_samples=3, prompt_tokens=rng.integers(1, 100, n))
    lengths = {f"p{i:07d}": rng.integers(1, 500, 3).tolist() for i in range(n)}
    cfg = RunConfig(workers=4, global_batch=50, log_flush_seconds=0.0)  # a part per loop turn
    res = run(table, config=cfg, actual_lengths=lengths, log_dir=tmp_path / "RUN")
    t = ds.dataset(tmp_path / "RUN" / "samples").to_table()
    # Many commits were made, then the samples were compacted into one part with their fate.
    assert len(list((tmp_path / "RUN" / "minibatches").glob("part-*.parquet"))) > 1
    assert len(list((tmp_path / "RUN" / "samples").glob("part-*.parquet"))) == 1
    assert not (tmp_path / "RUN" / "consumed").exists()
    keys = list(zip(t.column("prompt_id").to_pylist(), t.column("sample_index").to_pylist(), strict=True))
    assert len(keys) == len(set(keys)) == 3 * n
    assert set(keys) == {(f"p{i:07d}", j) for i in range(n) for j in range(3)}
    left = t.filter(t.column("consumed_step").is_null())
    assert left.num_rows == res.summary.samples_left_over == (3 * n) % 50
    assert t.column("response_len").to_pylist() == [lengths[p][j] for p, j in keys]
