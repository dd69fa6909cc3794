"""The Ray engine with the hf backend and a tiny model: the CLI contract, conservation, a killed actor.

One local Ray instance (2 CPUs) serves the whole module; starting Ray and
the actors' Python processes dominates the time of these tests.
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.runtime import BackendContext, RunConfig, run
from aspc.runtime.registry import make_backend
from tests.realmodel import VersionTrainer, expected_lengths, run_log_samples, small_plan, tiny_model

ray = pytest.importorskip("ray")
pytest.importorskip("transformers")

CAP = 64


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("models"))


def _check_conservation(rows, want):
    keys = Counter((s["prompt_id"], s["sample_index"]) for s in rows)
    assert keys == Counter(want.keys())  # every planned sample generated once, logged once
    for s in rows:
        assert s["response_len"] == want[(s["prompt_id"], s["sample_index"])]
    consumed = [s for s in rows if s["consumed_step"] is not None]
    left = [s for s in rows if s["consumed_step"] is None]
    assert len(consumed) + len(left) == len(want)
    return consumed, left


def test_cli_contract_on_ray(tmp_path, model_dir, ray_session):
    from tests.test_backend_hf import _contract_args, _contract_files

    data, plan, want = _contract_files(tmp_path, n=12)
    run_dir = tmp_path / "RUN"
    args = _contract_args(plan, model_dir, data, run_dir)
    args[2:2] = ["--engine", "ray"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["samples_generated"] == summary["samples_planned"] == len(want)
    assert summary["samples_consumed"] + summary["samples_left_over"] == len(want)
    rows = run_log_samples(run_dir)
    consumed, _ = _check_conservation(rows, want)
    assert len(consumed) == summary["samples_consumed"]
    assert ray.is_initialized()  # a session the engine did not start is left running


def test_killed_actor_minibatch_is_redispatched(tmp_path, model_dir, ray_session, monkeypatch):
    from aspc.runtime.engines.ray import RayEngine

    table, lengths = small_plan(n_rows=12, rows_per_minibatch=2, n_samples=2, max_len=50)
    ids = table.column("prompt_id").to_pylist()
    for pid in ids[6:8]:  # minibatch 3 runs to the cap: long enough to be killed mid-way
        lengths[pid][:] = CAP
    backend = make_backend("hf", BackendContext(n_workers=2, options={
        "model": str(model_dir), "device": "cpu", "max_new_tokens": CAP, "replay": True, "replay_lengths": lengths}))
    engines = []
    original = RayEngine.start_generation

    def start_and_kill(self, action, work, weights):
        engines.append(self)
        original(self, action, work, weights)
        if work.index == 3 and self.restarts == 0:
            actor = self.actor(action.worker)
            threading.Timer(0.02, lambda: ray.kill(actor)).start()  # mid-minibatch

    monkeypatch.setattr(RayEngine, "start_generation", start_and_kill)
    trainer = VersionTrainer(model_dir)
    run_dir = tmp_path / "RUN"
    res = run(table, config=RunConfig(workers=2, global_batch=4, backend="hf", engine="ray"), backend=backend,
              trainer=trainer, log_dir=run_dir)
    assert engines[0].restarts >= 1 and 3 in engines[0].redispatched
    rows = run_log_samples(run_dir)
    _check_conservation(rows, expected_lengths(table, lengths, CAP))
    assert res.summary.samples_generated == res.summary.samples_planned
    # The replacement actor reloaded the version its minibatch was dispatched with.
    assert trainer.pairs and all(stamp == logged for stamp, logged in trainer.pairs)
    assert max(v for _, v in trainer.pairs) >= 1


def test_rolling_scout_on_ray(tmp_path, ray_session):
    # One run, its scouts inside epoch 1: the Ray engine's actors generate them, cut at T, and the
    # driver's requests and revisions follow the holds as the local engine's do.
    from tests.test_scout_roll import check_roll_on_a_real_model

    check_roll_on_a_real_model(tmp_path, ["--engine", "ray"])

