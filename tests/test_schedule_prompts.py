"""The schedule reads predictions (and ids, for ties) only, and the plan lays its prompts out exactly by it."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspc.compiler import CompileConfig, compile_plan, prediction_from_lengths
from aspc.emit import schema as S
from aspc.io import PromptTable
from aspc.io.gather import dispatch_positions
from aspc.schedule import schedule_prompts


def _table(n: int, text: str, lengths: list[np.ndarray]) -> PromptTable:
    prompts = [f"{text} {i} " + "x" * (i % 7) for i in range(n)]
    return PromptTable(
        ids=[f"p-{i}" for i in range(n)],  # asp orders ties by id: the texts differ, the ids do not
        prompts=prompts,
        texts=prompts,
        source_rows=np.arange(n, dtype=np.int64),
        prompt_tokens=np.full(n, 5, dtype=np.int64),
        lengths=lengths,
        input_hash="0" * 64,
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(
        st.lists(st.integers(1, 5000), min_size=1, max_size=4).map(lambda xs: np.asarray(xs, dtype=np.float64)),
        min_size=8,
        max_size=120,
    ),
    strategy=st.sampled_from(["asp", "sorted", "random"]),
    order=st.sampled_from(["lpt", "interleave", "ascending"]),
    workers=st.sampled_from([None, 3]),
    seed=st.integers(0, 3),
)
def test_plan_rows_follow_the_schedule_whatever_the_prompts(lengths, strategy, order, workers, seed):
    n = len(lengths)
    config = CompileConfig(strategy=strategy, order=order, workers=workers, seed=seed, samples_per_prompt=2)
    prediction = prediction_from_lengths(lengths)
    tables = [_table(n, text, lengths) for text in ("alpha", "a much longer prompt")]
    s = schedule_prompts(prediction, config, n, ids=tables[0].id_array)
    pos = dispatch_positions(s.bounds, s.mb_order)
    plans = [compile_plan(table, prediction, config) for table in tables]
    for plan in plans:
        tab = plan.table
        # Row k of the plan is the schedule's k-th row in dispatch order, in the minibatch it put it in.
        assert tab.column(S.SOURCE_ROW).to_numpy().tolist() == s.rows[pos].tolist()
        sizes = np.diff(s.bounds)[s.mb_order]
        assert np.bincount(tab.column(S.MINIBATCH).to_numpy()).tolist() == sizes.tolist()
        assert tab.column(S.PREDICTED_LEN).to_numpy().tolist() == prediction.mean[s.rows[pos]].tolist()
    # Different prompt texts, same ids and predictions: the same arrangement, column for column.
    for col in (S.SOURCE_ROW, S.MINIBATCH, S.GROUP, S.N_SAMPLES, S.PREDICTED_Q90):
        assert plans[0].table.column(col).equals(plans[1].table.column(col))
    assert plans[0].metrics == plans[1].metrics
