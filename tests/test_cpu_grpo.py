"""The GRPO trainer and the CPU example: real gradients, published weights, reloads, policy lag."""

from __future__ import annotations

import numpy as np
import pytest

from aspc.runtime import BackendContext, RunConfig, TrainBatch, run
from aspc.runtime.registry import make_backend, make_trainer
from aspc.testing.plans import plan_table
from tests.realmodel import run_log_samples, tiny_model

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("models"))


def test_toy_reward():
    from examples.cpu_grpo.trainer import reward, target_char

    assert target_char("012 repeat b:") == "b"
    assert reward("012 repeat b:", "bbbbbbbb") == 1.0
    assert reward("012 repeat b:", "bbbbxxxxbbbb") == 0.5
    assert reward("012 repeat b:", "") == 0.0


def test_group_relative_advantages(model_dir):
    from aspc.runtime.trainers.grpo import GRPOTrainer

    t = GRPOTrainer(model_dir, reward=lambda p, r: 0.0)
    adv = t.advantages(["a", "a", "b", "b", "c"], np.array([1.0, 0.0, 2.0, 2.0, 5.0]))
    assert adv[0] > 0 > adv[1] and adv[0] == pytest.approx(-adv[1])
    assert adv[2] == adv[3] == 0.0  # equal rewards: no signal
    assert adv[4] == pytest.approx(5.0 - 2.0)  # a prompt alone in its batch: reward - running baseline


def test_grpo_step_changes_weights_and_publishes_them(model_dir):
    from aspc.runtime.trainers.grpo import GRPOTrainer

    t = GRPOTrainer(model_dir, reward=lambda p, r: float(r.count("a")))
    t.setup(None)
    before = {k: v.clone() for k, v in t._model.state_dict().items()}
    payload = [
        {"prompt_id": "p", "prompt": "x", "prompt_token_ids": [5, 6, 7], "response_token_ids": ids, "text": text}
        for ids, text in (([69, 69, 2], "aa"), ([70, 71, 2], "bc"))
    ]
    batch = TrainBatch(step=0, samples=np.arange(2), response_len=np.array([2, 2]), prompt_tokens=np.array([3, 3]),
                       weights_version=np.array([0, 0]), payload=payload)
    res = t.step(batch)
    assert res.version == 1 and set(res.weights) == set(before)
    assert any(not np.allclose(before[k].numpy(), res.weights[k].numpy()) for k in before)
    assert t.history[0].reward_mean == 1.0 and np.isfinite(t.history[0].loss)


def test_grpo_run_end_to_end(model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(__import__("tests.conftest", fromlist=["ROOT"]).ROOT)
    n = 24
    prompts = [f"{i:03d} repeat {'abcd'[i % 4]}:" for i in range(n)]
    table = plan_table(np.arange(n) // 4, n_samples=4)
    import pyarrow as pa

    table = table.set_column(table.schema.get_field_index("prompt"), "prompt", pa.array(prompts, pa.string()))
    ctx = BackendContext(n_workers=2, options={"model": str(model_dir), "device": "cpu", "max_new_tokens": 10,
                                               "trainer_args": {"lr": 0.01}})
    backend = make_backend("hf", ctx)
    trainer = make_trainer("examples.cpu_grpo.trainer:make_trainer", ctx)
    res = run(table, config=RunConfig(workers=2, global_batch=16, backend="hf"), backend=backend, trainer=trainer,
              log_dir=tmp_path / "RUN")
    assert res.summary.n_trainer_steps == n * 4 // 16 == len(trainer.history)
    assert res.summary.n_reloads >= 1  # workers picked up trained weights between minibatches
    rows = run_log_samples(tmp_path / "RUN")
    lags = [r["policy_lag"] for r in rows if r["policy_lag"] is not None]
    assert len(lags) == n * 4 and min(lags) >= 0
    assert {r["weights_version"] for r in rows} - {0}  # some samples came from trained weights


@pytest.mark.slow
def test_example_script_learns(tmp_path):
    from examples.cpu_grpo import run as example

    assert example.main(["--out", str(tmp_path / "out"), "--prompts", "512"]) == 0
    import json

    rows = [json.loads(x) for x in (tmp_path / "out" / "stats.jsonl").read_text().splitlines()]
    rewards = np.array([r["reward_mean"] for r in rows])
    q = len(rows) // 4
    assert rewards[-q:].mean() > 3 * max(rewards[:q].mean(), 0.01)
