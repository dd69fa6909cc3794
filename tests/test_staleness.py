"""--max-staleness K: the dispatcher keeps every consumed sample's policy lag <= K."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspc.errors import ConfigError
from aspc.runtime import RunConfig, run
from aspc.testing.plans import plan_table


def _plan(sizes: list[int], n_samples: int):
    mb = np.repeat(np.arange(len(sizes)), sizes)
    return plan_table(mb, n_samples=n_samples, prompt_tokens=20)


def _lengths(table, rng, heavy: bool) -> dict[str, np.ndarray]:
    ids = table.column("prompt_id").to_pylist()
    n = int(table.column("n_samples")[0].as_py())
    sigma = 1.5 if heavy else 0.5
    return {pid: np.maximum(1, rng.lognormal(5.0, sigma, size=n)).astype(np.float64) for pid in ids}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=40),
    n_samples=st.integers(1, 4),
    workers=st.integers(1, 6),
    batch_mult=st.integers(1, 4),
    k=st.integers(1, 4),
    mode=st.sampled_from(["static", "continuous"]),
    heavy=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_policy_lag_never_exceeds_k(sizes, n_samples, workers, batch_mult, k, mode, heavy, seed):
    table = _plan(sizes, n_samples)
    # A global batch at least as large as the largest minibatch (so every K >= 1 can start it).
    gb = max(sizes) * n_samples * batch_mult
    lengths = _lengths(table, np.random.default_rng(seed), heavy)
    cfg = RunConfig(workers=workers, global_batch=gb, max_staleness=k, return_mode=mode, seed=seed)
    res = run(table, config=cfg, actual_lengths=lengths)
    s = res.summary
    assert s.samples_generated == s.samples_planned  # the bound never deadlocks or drops work
    if s.policy_lag_max is not None:
        assert s.policy_lag_max <= k


def test_bound_binds_and_costs_nothing_when_loose():
    # Many short minibatches on many workers: unbounded, lag grows past 1.
    rng = np.random.default_rng(0)
    table = _plan([4] * 120, 2)
    lengths = _lengths(table, rng, heavy=True)
    free = run(table, config=RunConfig(workers=8, global_batch=16), actual_lengths=lengths).summary
    assert free.policy_lag_max > 1
    tight = run(table, config=RunConfig(workers=8, global_batch=16, max_staleness=1), actual_lengths=lengths).summary
    assert tight.policy_lag_max <= 1
    assert tight.samples_generated == free.samples_generated
    loose = RunConfig(workers=8, global_batch=16, max_staleness=free.policy_lag_max + 10)
    same = run(table, config=loose, actual_lengths=lengths).summary
    assert same.mean_iteration_time == pytest.approx(free.mean_iteration_time)


def test_minibatch_larger_than_k_batches_is_refused():
    table = _plan([10, 10], 4)  # 40 samples per minibatch
    with pytest.raises(ConfigError, match="max-staleness 1"):
        run(table, config=RunConfig(global_batch=32, max_staleness=1))
    with pytest.raises(ConfigError, match="integer >= 1"):
        run(table, config=RunConfig(global_batch=64, max_staleness=0))
