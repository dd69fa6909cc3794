"""``aspc run --epochs`` on a real backend: models load once, training goes on across epochs, workers start each epoch on the trained weights."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from aspc.cli import main
from tests.conftest import ROOT, write_jsonl
from tests.realmodel import run_log_samples, tiny_model

pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[hf]'")

CAP = 24
N_PROMPTS = 12
SAMPLES = 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("models"))


def _files(tmp_path):
    rng = np.random.default_rng(5)
    # Four recorded lengths per prompt: epoch 1 replays the first two, epoch 2 the last two.
    records = [
        {"id": f"p{i:02d}", "prompt": f"{i:03d} repeat {'abcd'[i % 4]}:",
         "lengths": [int(x) for x in rng.integers(1, 40, size=2 * SAMPLES)]}
        for i in range(N_PROMPTS)
    ]
    data = write_jsonl(tmp_path / "IN.jsonl", records)
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--samples-per-prompt",
                                  str(SAMPLES), "--batch-size", "2", "-o", str(plan), "--quiet"])
    assert r.exit_code == 0, r.output
    return records, data, plan


def _args(plan, model_dir, data, run_dir, *extra):
    return ["run", str(plan), "--backend", "hf", "--model", str(model_dir), "--replay-lengths",
            "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "2", "--global-batch", "8",
            "--max-new-tokens", str(CAP), "--epochs", "2", "--log", str(run_dir), "--json", *extra]


def test_epochs_with_hf_and_grpo_carry_the_trainer_and_reload_its_weights(tmp_path, model_dir, monkeypatch):
    import aspc.runtime.backends.hf as hf
    import aspc.runtime.backends.models as models
    from aspc.runtime.backends.base import ModelBackend
    from aspc.runtime.trainers.grpo import GRPOTrainer

    monkeypatch.chdir(ROOT)  # --trainer imports tests.realmodel from the repository root
    records, data, plan = _files(tmp_path)
    loads, trainer_loads, pushed, ends = Counter(), Counter(), [], []
    real_load, real_weights = hf.load_causal_lm, ModelBackend.load_weights

    def counting_load(path, *a, **k):
        loads[str(path)] += 1
        return real_load(path, *a, **k)

    def counting_trainer_load(path, *a, **k):
        trainer_loads[str(path)] += 1
        return real_load(path, *a, **k)

    def spy_weights(self, worker, version, weights):
        pushed.append((worker, version, None if weights is None else {k: v.clone() for k, v in weights.items()}))
        return real_weights(self, worker, version, weights)

    real_current = GRPOTrainer.current_weights

    def spy_current(self):
        w = real_current(self)
        ends.append({k: v.clone() for k, v in w.items()})
        return w

    monkeypatch.setattr(hf, "load_causal_lm", counting_load)
    monkeypatch.setattr(models, "load_causal_lm", counting_trainer_load)  # the trainer imports it in setup()
    monkeypatch.setattr(ModelBackend, "load_weights", spy_weights)
    monkeypatch.setattr(GRPOTrainer, "current_weights", spy_current)
    run_dir = tmp_path / "RUN"
    r = CliRunner().invoke(main, _args(plan, model_dir, data, run_dir,
                                       "--trainer", "tests.realmodel:make_length_grpo_trainer",
                                       "--trainer-arg", "lr=0.05"))
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [e["epoch"] for e in out["epochs"]] == [1, 2]
    steps = N_PROMPTS * SAMPLES // 8
    assert [e["n_trainer_steps"] for e in out["epochs"]] == [steps, steps] and out["n_trainer_steps"] == 2 * steps

    # The workers' models loaded once each (2 workers), not again for epoch 2; the trainer's once:
    # set up again before close, it trains on from its weights and optimiser state.
    assert sum(loads.values()) == 2, loads
    assert sum(trainer_loads.values()) == 1, trainer_loads

    # Before epoch 2, every worker loaded the trainer's weights after epoch 1 as version 0,
    # and those differ from the initial weights: epoch 1 trained them.
    assert len(ends) == 1
    at_start = [(w, v, d) for w, v, d in pushed if v == 0 and d is not None]
    assert sorted(w for w, _, _ in at_start) == [0, 1]
    initial = real_load(model_dir, device="cpu", dtype="float32").state_dict()
    for _, _, d in at_start:
        assert all(np.array_equal(d[k].numpy(), ends[0][k].numpy()) for k in d)
        assert any(not np.allclose(d[k].numpy(), initial[k].numpy()) for k in d)

    # Each epoch replays its own rotation of the recorded lengths, exactly.
    for k in (1, 2):
        rows = run_log_samples(run_dir / f"epoch-{k}")
        assert len(rows) == N_PROMPTS * SAMPLES
        want = {(d["id"], i): min(d["lengths"][(k - 1) * SAMPLES + i], CAP) for d in records for i in range(SAMPLES)}
        assert {(s["prompt_id"], s["sample_index"]): s["response_len"] for s in rows} == want
        assert (run_dir / "plans" / f"epoch-{k}.parquet").is_file()
        c = CliRunner().invoke(main, ["check", str(run_dir / "plans" / f"epoch-{k}.parquet")])
        assert c.exit_code == 0, c.output


def test_epochs_on_a_real_backend_refuse_drift_without_replay(tmp_path, model_dir):
    # (--engine ray runs epochs and the scout: tests/test_ray_engine.py.)
    _, data, plan = _files(tmp_path)
    base = ["run", str(plan), "--backend", "hf", "--model", str(model_dir), "--workers", "2",
            "--global-batch", "8", "--max-new-tokens", "4", "--epochs", "2"]
    r = CliRunner().invoke(main, base + ["--length-drift", "0.1", "--actual-lengths", str(data), "--length-field",
                                         "lengths", "--log", str(tmp_path / "B")])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    # One error line (a note about an unused option may come before it).
    errors = [line for line in r.output.strip().splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "--replay-lengths" in errors[0], r.output
    assert not (tmp_path / "B").exists()


@pytest.mark.parametrize("every", [1, 100])
def test_epochs_resume_goes_on_from_the_trainers_checkpoints(tmp_path, model_dir, monkeypatch, every):
    """A multi-epoch GRPO run resumed before epoch 2 starts trains epoch 2 on from epoch 1's end, not from scratch.

    ``every=100``: a checkpoint only at each epoch's last step (the plan's last; checkpoint_every is past it)."""
    import shutil

    import torch

    monkeypatch.chdir(ROOT)
    _records, data, plan = _files(tmp_path)
    run_dir, ck = tmp_path / "RUN", tmp_path / "ckpt"
    args = _args(plan, model_dir, data, run_dir, "--trainer", "tests.realmodel:make_length_grpo_trainer",
                 "--trainer-arg", "lr=0.05", "--trainer-arg", f"checkpoint_dir={ck}",
                 "--trainer-arg", f"checkpoint_every={every}")
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    steps = N_PROMPTS * SAMPLES // 8

    def by_plan():
        out: dict[str, list] = {}
        for p in sorted(ck.glob("ckpt-*.pt")):
            out.setdefault(p.name.split("-")[1], []).append(p)
        return out

    # Epoch 1's last checkpoint stays beside epoch 2's last: the complete log holds every step, so no older one.
    groups = by_plan()
    assert sorted(len(v) for v in groups.values()) == [1, 1]
    ends = sorted((len(torch.load(v[0], weights_only=True)["history"]), v) for v in groups.values())
    assert [n for n, _ in ends] == [steps, 2 * steps]
    first, second = ends[0][1][0], ends[1][1]

    # As if killed between the epochs: epoch 2's log and checkpoints gone, epoch 1 complete.
    shutil.rmtree(run_dir / "epoch-2")
    for p in second:
        p.unlink()
    r = CliRunner().invoke(main, [*args, "--resume"])
    assert r.exit_code == 0, r.output
    assert [e["n_trainer_steps"] for e in json.loads(r.stdout)["epochs"]] == [steps, steps]
    newest = max(ck.glob("ckpt-*.pt"), key=lambda p: p.stat().st_mtime_ns)
    state = torch.load(newest, weights_only=True)
    # Epoch 1's steps were restored into the trainer before epoch 2 trained on: 2 x steps in its history.
    assert state["version"] == steps and len(state["history"]) == 2 * steps
    assert first.exists()
