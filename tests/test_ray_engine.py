"""The Ray engine with the hf backend and a tiny model: the CLI contract, conservation, a killed actor.

One local Ray instance (2 CPUs) serves the whole module; starting Ray and
the actors' Python processes dominates the time of these tests.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.runtime import BackendContext, RunConfig, read_run_log, run
from aspc.runtime.registry import make_backend
from tests.conftest import write_jsonl
from tests.realmodel import VersionTrainer, expected_lengths, run_log_samples, small_plan, tiny_model

ray = pytest.importorskip("ray", reason="needs ray: pip install 'aspc[ray]'")
pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[hf]'")

CAP = 64


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("models"))


def _kill_during(monkeypatch, minibatch: int, delay: float) -> list:
    """Kill the actor that runs ``minibatch``, ``delay`` seconds into it (once); returns the engines seen."""
    from aspc.runtime.engines.ray import RayEngine

    engines = []
    original = RayEngine.start_generation

    def start_and_kill(self, action, work, weights):
        engines.append(self)
        original(self, action, work, weights)
        if work.index == minibatch and self.restarts == 0:
            actor = self.actor(action.worker)
            threading.Timer(delay, lambda: ray.kill(actor)).start()  # mid-minibatch

    monkeypatch.setattr(RayEngine, "start_generation", start_and_kill)
    return engines


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


def test_prompts_past_the_model_context_are_refused_on_ray_before_the_log_starts(tmp_path, model_dir, ray_session):
    # The driver holds no model under Ray: each minibatch checked its own prompts, so a plan whose
    # long prompts came late failed hours in, and the advice covered only the prompt it met.
    long = {"q5": 1000, "q2": 990, "q6": 700}
    records = [{"id": f"q{i}", "prompt": "x" * long.get(f"q{i}", 8), "lengths": [3, 4]} for i in range(8)]
    data = write_jsonl(tmp_path / "IN.jsonl", records)
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--samples-per-prompt", "2",
                                  "--batch-size", "4", "-o", str(plan), "--quiet"])  # fmt: skip
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["run", str(plan), "--backend", "hf", "--engine", "ray", "--model", str(model_dir),
                                  "--workers", "2", "--global-batch", "4", "--max-new-tokens", str(CAP),
                                  "--log", str(tmp_path / "RUN"), "-q"])  # fmt: skip
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    text = " ".join(r.output.split())
    assert "2 of the plan's prompts need more positions than the model's 1024 with --max-new-tokens 64" in text
    assert not (tmp_path / "RUN" / "meta.json").exists()  # refused before the log started


def test_speed_probe_on_ray_runs_in_each_actor(tmp_path, model_dir, ray_session, monkeypatch):
    import aspc.runtime.backends.hf as hf
    from tests.test_backend_hf import _contract_args, _contract_files

    driver_loads = []
    real_load = hf.load_causal_lm
    monkeypatch.setattr(hf, "load_causal_lm", lambda *a, **k: driver_loads.append(a) or real_load(*a, **k))
    data, plan, want = _contract_files(tmp_path, n=12)
    args = _contract_args(plan, model_dir, data, tmp_path / "RUN")
    args[2:2] = ["--engine", "ray", "--speed-probe"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)["speed_probe_s"]
    assert len(got["before"]) == len(got["after"]) == 2 and min(got["before"] + got["after"]) > 0
    assert read_run_log(tmp_path / "RUN").meta["summary"]["speed_probe_s"] == got
    assert driver_loads == []  # every probe ran in an actor, on the model it generates with: none loaded here


def test_killed_actor_minibatch_is_redispatched(tmp_path, model_dir, ray_session, monkeypatch):

    table, lengths = small_plan(n_rows=12, rows_per_minibatch=2, n_samples=2, max_len=50)
    ids = table.column("prompt_id").to_pylist()
    for pid in ids[6:8]:  # minibatch 3 runs to the cap: long enough to be killed mid-way
        lengths[pid][:] = CAP
    backend = make_backend("hf", BackendContext(n_workers=2, options={
        "model": str(model_dir), "device": "cpu", "max_new_tokens": CAP, "replay": True, "replay_lengths": lengths}))
    engines = _kill_during(monkeypatch, 3, 0.02)
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



class _ZeroStartTrainer(VersionTrainer):
    """A VersionTrainer that hands the next run all-zero weights: every logit 0.

    A greedy worker that loaded them emits one token id over and over (the
    lowest one its length forcing leaves), which the base and published
    weights do not; so each payload shows which weights generated it.
    """

    def __init__(self, model_dir: Path, out: Path):
        super().__init__(model_dir)
        self.out = out
        self.runs = 0

    def setup(self, work) -> None:
        super().setup(work)
        self.runs += 1

    def step(self, batch):
        with open(self.out, "a") as f:
            for p in batch.payload:
                tokens = p["response_token_ids"][: len(p["response_token_ids"]) - int(p["finished"])]
                f.write(json.dumps({"run": self.runs, "version": p["weights_version"], "tokens": tokens}) + "\n")
        return super().step(batch)

    def current_weights(self) -> dict:
        import torch

        return {k: torch.zeros_like(t) for k, t in self._base.items()}


def zero_start_trainer(context, out):
    """``--trainer tests.test_ray_engine:zero_start_trainer``."""
    return _ZeroStartTrainer(Path(context.options["model"]), Path(out))


def test_scout_and_epochs_on_ray_start_each_epoch_on_the_trainers_weights(tmp_path, model_dir, ray_session,
                                                                         monkeypatch):
    # Three runs in a row on the Ray engine (the scout, epochs 1 and 2) on the same actors, whose
    # models load once; before epoch 2 every actor loads the trainer's weights as version 0, so
    # that epoch's samples of version 0 come from them and not from the model directory.
    from aspc.runtime.engines.ray import RayEngine

    pids, original = [], RayEngine.start_actors

    def start_and_record(self, n_workers):
        original(self, n_workers)
        pids.append(sorted(ray.get([self.actor(w).pid.remote() for w in range(n_workers)])))

    monkeypatch.setattr(RayEngine, "start_actors", start_and_record)
    rng = np.random.default_rng(3)
    records = [{"id": f"p{i:02d}", "prompt": f"{i:03d} say {'abcd'[i % 4]}:",
                "lengths": [int(x) for x in rng.integers(3, 16, size=5)]} for i in range(12)]  # fmt: skip
    data = write_jsonl(tmp_path / "IN.jsonl", records)
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--samples-per-prompt", "2",
                                  "--batch-size", "2", "-o", str(plan), "--quiet"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = tmp_path / "payloads.jsonl"
    r = CliRunner().invoke(main, [
        "run", str(plan), "--backend", "hf", "--model", str(model_dir), "--engine", "ray", "--temperature", "0",
        "--replay-lengths", "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "2",
        "--global-batch", "8", "--max-new-tokens", "24", "--epochs", "2", "--scout", "--scout-tokens", "8",
        "--trainer", "tests.test_ray_engine:zero_start_trainer", "--trainer-arg", f"out={out}",
        "--log", str(tmp_path / "RUN"), "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert [e["epoch"] for e in summary["epochs"]] == [1, 2] and summary["scout"]["responses"] == 12
    rows = [json.loads(line) for line in open(out)]
    assert {x["run"] for x in rows} == {2, 3}  # the scout (run 1) takes no trainer step
    assert len(pids) >= 3 and all(p == pids[0] for p in pids) and len(pids[0]) == 2  # one pair of actors
    def tokens(run, first):
        return {t for x in rows if x["run"] == run and (x["version"] == 0) == first for t in x["tokens"]}

    # Epoch 2 began on the all-zero weights on both actors: one token id, which the model
    # directory's weights (epoch 1's version 0) and those published in epoch 2 do not emit.
    zero = tokens(3, True)
    assert len(zero) == 1 and sum(x["run"] == 3 and x["version"] == 0 for x in rows) >= 8
    assert zero.isdisjoint(tokens(2, True)) and zero.isdisjoint(tokens(3, False)), (zero, tokens(2, True))
    for k in (1, 2):
        assert CliRunner().invoke(main, ["check", str(tmp_path / "RUN" / "plans" / f"epoch-{k}.parquet")]).exit_code == 0


def test_a_replaced_actor_loads_the_runs_start_weights_again(tmp_path, model_dir, ray_session, monkeypatch):
    # A run that starts on carried weights (epoch 2 on): an actor killed during a version-0
    # minibatch is replaced by one built from the model directory, which must load them again.
    import torch
    from safetensors.torch import load_file


    table, lengths = small_plan(n_rows=12, rows_per_minibatch=2, n_samples=2, max_len=20)
    for pid in table.column("prompt_id").to_pylist()[:2]:  # minibatch 0 runs to the cap: long enough to be killed
        lengths[pid][:] = CAP
    backend = make_backend("hf", BackendContext(n_workers=2, options={
        "model": str(model_dir), "device": "cpu", "max_new_tokens": CAP, "temperature": 0.0, "replay": True,
        "replay_lengths": lengths}))  # fmt: skip
    engines = _kill_during(monkeypatch, 0, 0.05)
    zero = {k: torch.zeros_like(t) for k, t in load_file(str(model_dir / "model.safetensors")).items()}
    trainer = _ZeroStartTrainer(model_dir, tmp_path / "payloads.jsonl")
    run(table, config=RunConfig(workers=2, global_batch=24, backend="hf", engine="ray"), backend=backend,
        trainer=trainer, log_dir=tmp_path / "RUN", start_weights=zero)  # fmt: skip
    assert engines[0].restarts >= 1 and 0 in engines[0].redispatched
    rows = [json.loads(line) for line in open(tmp_path / "payloads.jsonl")]
    assert len(rows) == 24 and {x["version"] for x in rows} == {0}  # one step: every sample at version 0
    assert len({t for x in rows for t in x["tokens"]}) == 1  # all from the zero weights, the replacement's too


def test_continuous_returns_on_ray_reach_the_queue_before_their_minibatch_ends(tmp_path, model_dir, ray_session):
    # --return-mode continuous on the Ray engine: an actor streams each request's samples as it ends
    # (vLLM's way); here a streaming stand-in on the hf backend reports half of each minibatch, then
    # holds the rest 0.5 s, so the driver must have queued that half before the minibatch ended.
    import time

    from aspc.runtime.backends.hf import HFBackend

    class HalfFirst(HFBackend):  # defined here: pickled by value into the actors
        streams = True

        def execute_streaming(self, worker, request, on_samples):
            res = self.execute(worker, request)
            half = np.arange(res.response_len.size // 2)
            on_samples(half, res.response_len[half], [res.payload[i] for i in half])
            time.sleep(0.5)
            return res

    table, lengths = small_plan(n_rows=12, rows_per_minibatch=2, n_samples=2, max_len=20)
    base = make_backend("hf", BackendContext(n_workers=2, options={
        "model": str(model_dir), "device": "cpu", "max_new_tokens": CAP, "replay": True, "replay_lengths": lengths}))
    trainer = VersionTrainer(model_dir)
    run_dir = tmp_path / "RUN"
    res = run(table, config=RunConfig(workers=2, global_batch=4, backend="hf", engine="ray", return_mode="continuous"),
              backend=HalfFirst(base.options), trainer=trainer, log_dir=run_dir)  # fmt: skip
    rows = run_log_samples(run_dir)
    _check_conservation(rows, expected_lengths(table, lengths, CAP))
    assert res.summary.samples_generated == res.summary.samples_planned == 24
    ends = {m["minibatch"]: m["end"] for m in read_run_log(run_dir).tables["minibatches"].to_pylist()}
    row_of = {p: r for r, p in enumerate(table.column("prompt_id").to_pylist())}
    for s in rows:
        early = row_of[s["prompt_id"]] % 2 == 0  # 2 prompts x 2 samples a minibatch: its first prompt's went early
        assert (s["finish_time"] <= ends[s["minibatch"]] - 0.4) == early, s
    assert trainer.pairs and all(stamp == logged for stamp, logged in trainer.pairs)  # payloads came with them


@pytest.mark.parametrize("address", ["notahost", "127.0.0.1:1"])
def test_a_malformed_or_unreachable_ray_address_is_one_line(tmp_path, model_dir, address):
    # ray.init raised ValueError("Invalid address format") through aspc: a traceback; on an address
    # nothing listens at it waited minutes, silent. In a process of its own: this module's Ray
    # session would be reused, not started.
    import os
    import subprocess
    import sys

    data = write_jsonl(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"hello {i}", "lengths": [5]} for i in range(8)])
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "-b", "2", "-o",
                                  str(tmp_path / "plan.parquet"), "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    env = {**os.environ, "RAY_ADDRESS": address, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-m", "aspc.cli", "run", str(tmp_path / "plan.parquet"), "--backend", "hf",
                        "--engine", "ray", "--model", str(model_dir), "--workers", "2", "--global-batch", "4",
                        "--max-new-tokens", "8", "-q"], capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"--engine ray: cannot start or reach Ray at RAY_ADDRESS={address}" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
