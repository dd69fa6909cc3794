"""Helpers for tests of real generation: a tiny random causal LM, small plans, a weights-publishing trainer."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds

from aspc.runtime import TrainBatch, Trainer, TrainResult
from aspc.testing.plans import plan_table

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download at test time
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_MODEL: dict[str, Path] = {}


def tiny_model(base: Path) -> Path:
    """A tiny random LlamaForCausalLM with a character tokenizer, built once per process under ``base``."""
    key = str(base)
    if key not in _MODEL:
        from aspc.testing.tiny_model import save_tiny_causal_lm

        _MODEL[key] = save_tiny_causal_lm(base / "tiny-llama", seed=0)
    return _MODEL[key]


def small_plan(n_rows: int = 8, rows_per_minibatch: int = 2, n_samples=2, seed: int = 0, max_len: int = 90):
    """A plan table and per-prompt recorded lengths (some 0, some above a 64-token cap)."""
    mb = np.arange(n_rows) // rows_per_minibatch
    table = plan_table(mb, n_samples=n_samples)
    ids = table.column("prompt_id").to_pylist()
    ns = table.column("n_samples").to_pylist()
    rng = np.random.default_rng(seed)
    lengths = {pid: rng.integers(0, max_len, size=int(n)) for pid, n in zip(ids, ns, strict=True)}
    first = ids[0]
    lengths[first][0] = 0  # an immediately ending sequence
    lengths[ids[-1]][-1] = max_len + 10  # one above any cap
    return table, lengths


def expected_lengths(table, lengths: dict, cap: int) -> dict[tuple[str, int], int]:
    """(prompt_id, sample_index) -> recorded length capped at ``cap``."""
    out = {}
    for pid, n in zip(table.column("prompt_id").to_pylist(), table.column("n_samples").to_pylist(), strict=True):
        for i in range(int(n)):
            out[(pid, i)] = int(min(lengths[pid][i], cap))
    return out


def run_log_samples(run: Path) -> list[dict]:
    """Every row of ``run/samples`` as dicts."""
    return ds.dataset(str(run / "samples"), format="parquet").to_table().to_pylist()


class VersionTrainer(Trainer):
    """Publishes a real state dict each step (initial weights shifted by 0.01·version).

    Records, for every consumed sample, the weights version the backend says
    generated it (payload stamp) next to the version the run log assigns.
    """

    def __init__(self, model_dir: Path, delay: float = 0.0):
        self.model_dir = model_dir
        self.delay = delay  # seconds per step, to let several minibatches overlap a step
        self.pairs: list[tuple[int, int]] = []  # (payload stamp, scheduler's weights_version)
        self.published: dict[int, dict] = {}  # version -> state dict
        self._base: dict | None = None

    def setup(self, work) -> None:
        from safetensors.torch import load_file

        self._base = load_file(str(self.model_dir / "model.safetensors"))

    def step(self, batch: TrainBatch) -> TrainResult:
        assert self._base is not None and batch.payload is not None
        for p, v in zip(batch.payload, batch.weights_version, strict=True):
            self.pairs.append((int(p["weights_version"]), int(v)))
        time.sleep(self.delay)
        version = batch.step + 1
        state = {k: t + 0.01 * version for k, t in self._base.items()}
        self.published[version] = state
        return TrainResult(version=version, elapsed=self.delay, weights=state)

    def current_weights(self) -> dict | None:
        """The last published state dict (the initial one before any step)."""
        return self.published[max(self.published)] if self.published else self._base


def make_version_trainer(context, delay: float = 0.0) -> VersionTrainer:
    """``--trainer tests.realmodel:make_version_trainer``: a VersionTrainer on the run's ``--model``."""
    return VersionTrainer(Path(context.options["model"]), delay=delay)


def length_reward(prompt: str, response: str) -> float:
    """Characters in the response: sibling samples that replay different recorded lengths always differ."""
    return float(len(response))


def make_length_grpo_trainer(context, lr: float = 0.05, seed: int = 0, checkpoint_dir: str | None = None,
                             checkpoint_every: int = 1):  # fmt: skip
    """``--trainer tests.realmodel:make_length_grpo_trainer``: the real GRPO trainer on the run's ``--model``.

    Its reward is the response length, so with ``--replay-lengths`` every group of siblings has
    non-zero advantages and each step moves the weights. The example's toy reward (a requested
    character) is 0 for almost every response of an untrained tiny model: a run whose first
    steps all score 0 trains nothing, and a test of "the weights changed" would fail by chance.
    """
    from aspc.runtime.trainers.grpo import GRPOConfig, GRPOTrainer

    return GRPOTrainer(context.options["model"], length_reward, GRPOConfig(lr=lr, seed=seed), device="cpu",
                       checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every)
