"""The vllm backend's weight reload, in process, on one engine shared by the module's tests.

A reload must reach the model vLLM generates with: identical weights leave
greedy output unchanged, perturbed weights change it, and the run loop
stamps every sample with the version that generated it.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from aspc.runtime import BackendContext, RunConfig, run
from aspc.runtime.registry import make_backend
from tests.realmodel import VersionTrainer, expected_lengths, small_plan
from tests.test_vllm_contract import CAP, vllm_tiny_model

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed here (make vllm; make test-vllm)")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return vllm_tiny_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def replay_plan():
    return small_plan(n_rows=8, rows_per_minibatch=2, n_samples=2, max_len=20)


@pytest.fixture(scope="module")
def backend(model_dir, replay_plan):
    from aspc.runtime.work import work_from_table

    table, lengths = replay_plan
    b = make_backend("vllm", BackendContext(n_workers=1, options={
        "model": str(model_dir), "max_new_tokens": CAP, "replay": True, "replay_lengths": lengths,
        "temperature": 0.0}))
    b.setup(work_from_table(table), 1)  # starts worker 0's engine once for the module
    yield b
    b.close()


def greedy(backend, n_tokens: int = 16) -> list[tuple[list[int], list[float]]]:
    """Greedy tokens and their log-probabilities for two fixed prompts.

    The random tiny model tends to repeat one token whatever its weights, so
    the log-probabilities are what shows a reload reached the model.
    """
    from vllm import SamplingParams

    llm = backend._engine(0)
    prompts = [{"prompt_token_ids": llm.get_tokenizer()(p)["input_ids"]} for p in ("hello there", "abc: ")]
    params = SamplingParams(temperature=0.0, max_tokens=n_tokens, min_tokens=n_tokens, ignore_eos=True, logprobs=0)
    out = []
    for o in llm.generate(prompts, params, use_tqdm=False):
        c = o.outputs[0]
        out.append((list(c.token_ids), [d[t].logprob for t, d in zip(c.token_ids, c.logprobs, strict=True)]))
    return out


def test_reload_changes_output_only_when_weights_change(backend, model_dir):
    import torch
    from safetensors.torch import load_file

    base = load_file(str(model_dir / "model.safetensors"))
    before = greedy(backend)
    backend.load_weights(0, 1, dict(base))  # the same weights, through the whole reload path
    assert greedy(backend) == before
    gen = torch.Generator().manual_seed(1)
    noisy = {k: v + 0.5 * v.std() * torch.randn(v.shape, generator=gen) if v.ndim == 2 else v
             for k, v in base.items()}
    seconds = backend.load_weights(0, 2, noisy)
    assert seconds > 0 and backend.weights_version(0) == 2
    after = greedy(backend)
    assert after != before
    backend.load_weights(0, 3, dict(base))  # and back: the original weights give the original output
    assert greedy(backend) == before


def test_reload_from_a_safetensors_directory(backend, model_dir, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    base = load_file(str(model_dir / "model.safetensors"))
    before = greedy(backend)
    save_file({k: torch.flip(v, dims=[0]).contiguous() for k, v in base.items()}, str(tmp_path / "w.safetensors"))
    backend.load_weights(0, 4, str(tmp_path))
    assert greedy(backend) != before
    backend.load_weights(0, 5, dict(base))
    assert greedy(backend) == before


def test_a_run_kept_open_starts_on_the_weights_it_is_given(backend, model_dir, replay_plan):
    """``start_weights`` (the next epoch of ``aspc run --epochs``) reaches the engine before the first dispatch."""
    import torch
    from safetensors.torch import load_file

    table, _ = replay_plan
    base = load_file(str(model_dir / "model.safetensors"))
    before = greedy(backend)
    gen = torch.Generator().manual_seed(2)
    trained = {k: v + 0.5 * v.std() * torch.randn(v.shape, generator=gen) if v.ndim == 2 else v
               for k, v in base.items()}
    backend.load_weights(0, 0, trained)
    want = greedy(backend)
    backend.load_weights(0, 0, dict(base))
    assert greedy(backend) == before != want
    # The sim trainer publishes no tensors, so after the run the engine still holds what it started on.
    run(table, config=RunConfig(workers=1, global_batch=4, backend="vllm", max_new_tokens=CAP), backend=backend,
        keep_open=True, start_weights=trained)
    assert greedy(backend) == want
    backend.load_weights(0, 0, dict(base))
    assert greedy(backend) == before


def test_run_with_a_publishing_trainer_stamps_versions(backend, model_dir, replay_plan):
    table, lengths = replay_plan
    trainer = VersionTrainer(model_dir)
    res = run(table, config=RunConfig(workers=1, global_batch=4, backend="vllm", max_new_tokens=CAP),
              backend=backend, trainer=trainer)
    assert res.summary.n_reloads >= 1
    assert trainer.pairs and all(stamp == logged for stamp, logged in trainer.pairs)
    want = expected_lengths(table, lengths, CAP)
    cols = res.columns["samples"]  # in sample-id order: row by row, then sample index
    ids = table.column("prompt_id").to_pylist()
    rows = np.repeat(np.arange(len(ids)), table.column("n_samples").to_numpy())
    got = {(ids[r], int(i)): int(n) for r, i, n in zip(rows, cols["sample_index"], cols["response_len"], strict=True)}
    assert got == want


def test_continuous_returns_samples_as_vllm_finishes_them(backend, replay_plan):
    """Same plan, both return modes: exact lengths either way; continuous hands short samples out early."""
    table, lengths = replay_plan
    want = expected_lengths(table, lengths, CAP)
    ids = table.column("prompt_id").to_pylist()
    rows = np.repeat(np.arange(len(ids)), table.column("n_samples").to_numpy())
    early = {}
    for mode in ("static", "continuous"):
        res = run(table, config=RunConfig(workers=1, global_batch=4, backend="vllm", max_new_tokens=CAP,
                                          return_mode=mode), backend=backend)
        s, mb = res.columns["samples"], res.columns["minibatches"]
        got = {(ids[r], int(i)): int(n) for r, i, n in zip(rows, s["sample_index"], s["response_len"], strict=True)}
        assert got == want
        end = dict(zip(mb["minibatch"].tolist(), mb["end"].tolist(), strict=True))
        early[mode] = sum(t < end[m] - 1e-3 for t, m in zip(s["finish_time"], s["minibatch"], strict=True))
        # Either mode records when each sample's decoding ended (seconds from its minibatch's start):
        # within [0, duration], and a shorter sample of a minibatch ended before a longer one.
        dur = {m: e - st for m, st, e in zip(mb["minibatch"].tolist(), mb["start"].tolist(), mb["end"].tolist(),
                                             strict=True)}
        dec = s["decode_time"]
        assert np.all(np.isfinite(dec)) and all(0 < d <= dur[m] + 1e-9 for d, m in zip(dec, s["minibatch"], strict=True))
        for m in dur:
            mine = np.flatnonzero(s["minibatch"] == m)
            ln, d = s["response_len"][mine], dec[mine]
            # (a zero-length replay still runs one step, as a length of 1 does)
            assert all(d[i] < d[j] for i in range(ln.size) for j in range(ln.size) if max(ln[i], 1) < ln[j]), (m, ln, d)
        early["decode_" + mode] = sum(d < dur[m] - 1e-3 for d, m in zip(dec, s["minibatch"], strict=True))
    assert early["static"] == 0
    assert early["continuous"] >= 4  # samples shorter than their minibatch's longest came back before it ended
    assert early["decode_static"] >= 4  # ... and in static mode the log still knows when they ended
