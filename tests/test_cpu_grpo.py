"""The GRPO trainer and the CPU example: real gradients, published weights, reloads, policy lag."""

from __future__ import annotations

import numpy as np
import pytest

from aspc.runtime import BackendContext, RunConfig, TrainBatch, run
from aspc.runtime.registry import make_backend, make_trainer
from aspc.testing.plans import plan_table
from tests.realmodel import run_log_samples, tiny_model

pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[hf]'")


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


def test_example_script_that_fails_says_so_and_leaves_no_earlier_figures(tmp_path, capfd):
    # A run stopped before its first step left the last run's stats.jsonl in place, and a failed
    # aspc command was a CalledProcessError traceback from the script.
    from examples.cpu_grpo import run as example

    out = tmp_path / "out"
    out.mkdir()
    (out / "stats.jsonl").write_text('{"reward_mean": 1.0}\n')  # an earlier run's
    assert example.main(["--out", str(out), "--prompts", "16", "--global-batch", "0"]) == 2
    err = capfd.readouterr().err
    assert "--global-batch must be >= 1" in err and "Traceback" not in err, err
    assert not (out / "stats.jsonl").exists()


def _batch(step: int, seed: int):
    rng = np.random.default_rng(seed)
    payload = [
        {"prompt_id": f"p{i // 2}", "prompt": "x", "prompt_token_ids": [5, 6, 7],
         "response_token_ids": rng.integers(3, 90, size=4).tolist(), "text": "ab"[i % 2] * (1 + i)}
        for i in range(4)
    ]
    return TrainBatch(step=step, samples=np.arange(4), response_len=np.full(4, 4), prompt_tokens=np.full(4, 3),
                      weights_version=np.zeros(4, dtype=np.int64), payload=payload)


def test_grpo_checkpoint_resumes_the_exact_training_state(model_dir, tmp_path):
    """A trainer restored from the checkpoint of version 2 takes step 3 bit for bit as the one that never stopped."""
    import torch

    from aspc.runtime.trainers.grpo import GRPOTrainer
    from aspc.runtime.work import work_from_table

    work = work_from_table(plan_table(np.arange(8) // 2, n_samples=2))
    reward = lambda p, r: float(r.count("a")) - 0.3 * len(r)  # noqa: E731 - varied rewards: every step moves
    a = GRPOTrainer(model_dir, reward, checkpoint_dir=tmp_path / "ckpt")
    a.setup(work)
    for s in range(2):
        a.step(_batch(s, s))
    assert len(list((tmp_path / "ckpt").glob("ckpt-*.pt"))) == 2  # versions 1 and 2
    b = GRPOTrainer(model_dir, reward, checkpoint_dir=tmp_path / "ckpt")
    b.setup(work)
    assert b.restore(0) is None
    w = b.restore(2)
    assert all(torch.equal(w[k], v) for k, v in a.current_weights().items())
    assert [h.loss for h in b.history] == [h.loss for h in a.history] and b._baseline == a._baseline
    ra, rb = a.step(_batch(2, 9)), b.step(_batch(2, 9))  # AdamW's moments restored too, or this differs
    assert all(torch.equal(ra.weights[k], rb.weights[k]) for k in ra.weights)
    names = sorted(p.name for p in (tmp_path / "ckpt").glob("ckpt-*.pt"))
    assert len(names) == 2 and names[-1].endswith("v00000003.pt")

    c = GRPOTrainer(model_dir, reward, checkpoint_dir=tmp_path / "ckpt")
    c.setup(work)
    c.restore(2)  # the one before the newest is kept: a kill between checkpoint and log commit
    assert all(torch.equal(c.current_weights()[k], v) for k, v in w.items())

    # A new run of the same plan (another attempt, or another --log sharing the directory) pruned
    # these and a resume of it restored them: another run's weights and optimiser state.
    from aspc.errors import ConfigError

    before = names
    d = GRPOTrainer(model_dir, reward, checkpoint_dir=tmp_path / "ckpt")
    d.setup(work)
    with pytest.raises(ConfigError, match=r"already holds checkpoints of this plan from another run \(versions 2, 3\)"):
        d.step(_batch(0, 0))
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("ckpt-*.pt")) == before


def test_grpo_resume_refuses_what_it_cannot_restore(model_dir, tmp_path):
    from aspc.errors import ConfigError
    from aspc.runtime.trainers.grpo import GRPOTrainer
    from aspc.runtime.work import work_from_table

    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match=r"checkpoint_dir .*afile: cannot create it \(file exists\)"):
        GRPOTrainer(model_dir, reward=lambda p, r: 0.0, checkpoint_dir=tmp_path / "afile")
    work = work_from_table(plan_table(np.arange(8) // 2, n_samples=2))
    t = GRPOTrainer(model_dir, reward=lambda p, r: 0.0)
    t.setup(work)
    with pytest.raises(ConfigError, match="keeps no checkpoints"):
        t.restore(3)
    a = GRPOTrainer(model_dir, reward=lambda p, r: float(len(r)), checkpoint_dir=tmp_path / "ckpt")
    a.setup(work)
    a.step(_batch(0, 0))
    other = GRPOTrainer(model_dir, reward=lambda p, r: 0.0, checkpoint_dir=tmp_path / "ckpt")
    other.setup(work_from_table(plan_table(np.arange(8) // 4, n_samples=2)))  # another plan
    with pytest.raises(ConfigError, match=r"no checkpoint of weights version 1 for plan .* \(found: [0-9a-f]{16} v1\)"):
        other.restore(1)
    for s in range(3):  # another run's checkpoints in the same directory are not pruned by this one
        other.step(_batch(s, s))
    assert len(list((tmp_path / "ckpt").glob("ckpt-*.pt"))) == 1 + 2


def test_grpo_checkpoint_every_n_steps_resumes_by_replaying_the_steps_after(model_dir, tmp_path):
    """checkpoint_every=3 over a 4-step plan: durable() names the newest checkpoint the log reached; restoring it
    (or the initial weights) and taking the logged steps after it again ends bit for bit where the trainer did."""
    import torch

    from aspc.errors import ConfigError
    from aspc.runtime.trainers.grpo import GRPOTrainer
    from aspc.runtime.work import work_from_table

    for bad in (0, True, 1.5):
        with pytest.raises(ConfigError, match="checkpoint_every must be an integer >= 1"):
            GRPOTrainer(model_dir, reward=lambda p, r: 0.0, checkpoint_every=bad)
    work = work_from_table(plan_table(np.arange(8) // 2, n_samples=2))  # 16 samples: 4 steps of 4
    reward = lambda p, r: float(r.count("a")) - 0.3 * len(r)  # noqa: E731 - varied rewards: every step moves
    ck = tmp_path / "ckpt"

    def trainer():
        t = GRPOTrainer(model_dir, reward, checkpoint_dir=ck, checkpoint_every=3)
        t.setup(work)
        return t

    def same(w1, w2):
        return all(torch.equal(w1[k], w2[k]) for k in w1)

    a = trainer()
    done = [a.step(_batch(s, s)) for s in range(2)]
    assert not list(ck.glob("ckpt-*.pt")) and a.durable(2) == 0
    done.append(a.step(_batch(2, 2)))  # version 3: a checkpoint
    assert a.durable(2) == 0 and a.durable(3) == 3  # the log at 2: restore the initial weights, replay 0 and 1
    b = trainer()
    assert b.durable(2) == 0 and b.restore(0) is None
    assert same([b.step(_batch(s, s)) for s in range(2)][-1].weights, done[1].weights)
    done.append(a.step(_batch(3, 3)))  # version 4, the plan's last step: checkpointed whatever checkpoint_every says
    assert sorted(p.name[-6:] for p in ck.glob("ckpt-*.pt")) == ["003.pt", "004.pt"]
    assert a.durable(3) == 3  # the log one step behind: both stay
    assert a.durable(4) == 4 and [p.name[-6:] for p in ck.glob("ckpt-*.pt")] == ["004.pt"]
    c = trainer()
    assert c.durable(4) == 4 and same(c.restore(4), done[3].weights)


def test_the_example_keeps_its_stats_until_a_step_or_a_restore_rewrites_them(model_dir, tmp_path, monkeypatch):
    # The example emptied stats.jsonl on construction: a refused --resume, or one of a complete log,
    # wiped the stats of the run it did not touch.
    from aspc.errors import ConfigError
    from aspc.runtime.work import work_from_table

    monkeypatch.chdir(__import__("tests.conftest", fromlist=["ROOT"]).ROOT)
    stats = tmp_path / "stats.jsonl"
    stats.write_text('{"step": 0}\n')
    ctx = BackendContext(n_workers=1, options={"model": str(model_dir), "trainer_args": {"stats": str(stats)}})
    trainer = make_trainer("examples.cpu_grpo.trainer:make_trainer", ctx)
    trainer.setup(work_from_table(plan_table(np.arange(8) // 2, n_samples=2)))
    with pytest.raises(ConfigError, match="keeps no checkpoints"):
        trainer.restore(3)
    assert stats.read_text() == '{"step": 0}\n'
    trainer.restore(0)  # a resume with no step logged: the file now holds the run's (none)
    assert stats.read_text() == ""


def test_a_checkpoint_that_cannot_be_written_is_one_line_naming_its_directory(tmp_path, monkeypatch):
    # On a full disk torch.save raised "[enforce fail at inline_container.cc:672] . unexpected pos ...".
    import torch

    from aspc.errors import RunError
    from aspc.runtime.trainers import checkpoint as ckpt

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 332608 vs 332496")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(RunError, match=r"checkpoint_dir .*: cannot write the checkpoint of version 3 .*MiB free there"):
        ckpt.save_checkpoint(tmp_path, "0" * 16, 3, {}, [], [], set(), None)
    assert not list(tmp_path.iterdir())  # no partial checkpoint left
