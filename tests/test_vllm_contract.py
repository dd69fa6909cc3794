"""The vllm backend: the install hint where vLLM is absent, the run contract where it imports.

The contract tests run only where ``import vllm`` works (a CUDA or Ascend
machine with vLLM / vllm-ascend installed); elsewhere they are skipped with
the reason. They use the same tiny random Llama as the hf tests.
"""

from __future__ import annotations

import importlib.util
import json
from collections import Counter

import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.errors import BackendError
from aspc.runtime import BackendContext, RunConfig, run
from aspc.runtime.registry import make_backend
from tests.realmodel import VersionTrainer, run_log_samples, small_plan, tiny_model

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here (pip install 'aspc[vllm]')")
CAP = 64


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    return tiny_model(tmp_path_factory.mktemp("models"))


@pytest.mark.skipif(HAVE_VLLM, reason="vLLM is installed: the missing-package message cannot be shown")
def test_missing_vllm_says_how_to_install(tmp_path, model_dir):
    from tests.test_backend_hf import _contract_args, _contract_files

    data, plan, _ = _contract_files(tmp_path, n=4)
    args = _contract_args(plan, model_dir, data, tmp_path / "RUN")
    args[args.index("hf")] = "vllm"
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0
    assert "pip install 'aspc[vllm]'" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "RUN").exists()
    with pytest.raises(BackendError, match="aspc\\[vllm\\]"):
        make_backend("vllm", BackendContext(n_workers=1, options={"model": str(model_dir)}))


@needs_vllm
def test_vllm_cli_contract(tmp_path, model_dir):
    from tests.test_backend_hf import _contract_args, _contract_files

    data, plan, want = _contract_files(tmp_path, n=12)
    run_dir = tmp_path / "RUN"
    args = _contract_args(plan, model_dir, data, run_dir)
    args[args.index("hf")] = "vllm"
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["samples_generated"] == len(want)
    rows = run_log_samples(run_dir)
    assert Counter((s["prompt_id"], s["sample_index"]) for s in rows) == Counter(want.keys())
    for s in rows:
        assert s["response_len"] == want[(s["prompt_id"], s["sample_index"])]


@needs_vllm
def test_vllm_reloads_published_weights(model_dir):
    table, lengths = small_plan(n_rows=8, rows_per_minibatch=2, n_samples=2, max_len=20)
    backend = make_backend("vllm", BackendContext(n_workers=1, options={
        "model": str(model_dir), "max_new_tokens": CAP, "replay": True, "replay_lengths": lengths}))
    trainer = VersionTrainer(model_dir)
    res = run(table, config=RunConfig(workers=1, global_batch=4, backend="vllm"), backend=backend, trainer=trainer)
    assert res.summary.n_reloads >= 1
    assert trainer.pairs and all(stamp == logged for stamp, logged in trainer.pairs)
