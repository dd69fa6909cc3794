"""The vllm backend against what a user hit: extra stop ids, engine arguments, resume, a dead engine.

The tests that start an engine run where ``import vllm`` works (``make
test-vllm``); the rest check aspc's side of the contract in the main venv.
"""

from __future__ import annotations

import json
import types

import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.errors import BackendError, ConfigError, WorkerLostError
from aspc.runtime.core.events import is_worker_fault
from tests.conftest import write_jsonl
from tests.test_vllm_contract import HAVE_VLLM, contract_args, needs_vllm, replay_files, vllm_tiny_model


@needs_vllm
@pytest.mark.parametrize(("pair", "words"), [
    ("max_num_seqs=abc", "--engine-arg max_num_seqs='abc': vllm.LLM takes an integer or null here; pass e.g. "),
    ("enforce_eager=1", "--engine-arg enforce_eager=1: vllm.LLM takes true or false here; pass e.g. enforce_eager="),
    ("dtype=float64", "--engine-arg dtype='float64': vllm.LLM takes one of auto, "),
    ("gpu_memory_utilization=lots", "takes a number here"),
    ("revision=1234", """revision='"1234"' (a number read as JSON: quote it to pass it as text)"""),
    ("kv_cache_memory_bytes=1e9", "takes an integer or null here; pass e.g. kv_cache_memory_bytes=1000000000"),
    ("skip_tokenizer_init=true", "--engine-arg skip_tokenizer_init=True: aspc counts and checks prompt tokens with "
                                 "the engine's tokenizer; drop it"),
])  # fmt: skip
def test_an_engine_arg_of_the_wrong_type_is_one_line_before_the_engine_starts(tmp_path, pair, words):
    """vLLM said "'<' not supported between instances of 'int' and 'str'" after a 13 s engine start."""
    model_dir = vllm_tiny_model(tmp_path / "models")
    data, plan, _ = replay_files(tmp_path, n=4)
    r = CliRunner().invoke(main, [*contract_args(plan, str(model_dir), data, tmp_path / "RUN"), "--engine-arg", pair])
    assert r.exit_code == 2 and words in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "RUN").exists()


def test_an_engine_arg_given_twice_is_refused():
    from aspc.runtime.backends.vllm_args import parse_engine_args

    with pytest.raises(ConfigError, match="--engine-arg max_num_seqs is given twice; pass it once"):
        parse_engine_args(["max_num_seqs=4", "max_num_seqs=8"])
    for value in ("NaN", "1e999", "-Infinity"):
        with pytest.raises(ConfigError, match="not a finite number"):
            parse_engine_args([f"gpu_memory_utilization={value}"])


@pytest.mark.skipif(not HAVE_VLLM, reason="EngineArgs' fields come from vLLM")
def test_engine_arg_values_of_the_right_type_pass():
    from aspc.runtime.backends.vllm_args import check_engine_args, parse_engine_args

    check_engine_args(parse_engine_args(["max_num_seqs=8", "enforce_eager=false", "dtype=float32", "kv_cache_memory_bytes=1000000000",
                                         "max_model_len=null", "tokenizer=some/dir", "gpu_memory_utilization=1"]))


def test_a_dead_engine_is_not_retried():
    """Four retries on a killed EngineCore within 10 ms, then an error pointing at a stack trace nobody printed."""
    assert not is_worker_fault(WorkerLostError("gone")) and is_worker_fault(BackendError("flaky"))


def test_a_dead_engine_step_is_one_line_naming_the_worker():
    from aspc.runtime.backends.vllm import VLLMBackend

    class EngineDeadError(Exception):  # vLLM's own class, by name
        pass

    def dead():
        raise EngineDeadError("EngineCore encountered an issue. See stack trace (above) for the root cause.")

    with pytest.raises(WorkerLostError, match=r"^worker 3: vLLM's engine process died; its cause .* --resume"):
        VLLMBackend._step(3, types.SimpleNamespace(step=dead))
    with pytest.raises(ValueError):  # anything else is the engine's own error, retried as a worker fault
        VLLMBackend._step(3, types.SimpleNamespace(step=lambda: int("x")))


def test_resume_compares_the_engine_args_that_shape_samples(tmp_path):
    """A resume with another --engine-arg dtype started an engine in another precision; max_num_seqs may change."""
    from aspc.runtime.record.resume import check_resumable

    def meta(engine_args):
        run = {"work_hash": "w", "lengths_name": "", "trainer": "T",
               "sampling": {"model": "m", "dtype": "auto", "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                            "replay": False, "model_fingerprint": "f"}}  # fmt: skip
        if engine_args is not None:
            run["sampling"]["engine_args"] = engine_args
        return {"run": run, "plan": {}, "config": {}, "cost_model": {}}

    from aspc.runtime.backends.vllm_args import generation_engine_args

    now = meta(generation_engine_args({"dtype": "bfloat16", "max_num_seqs": 4}))
    assert now["run"]["sampling"]["engine_args"] == {"dtype": "bfloat16"}  # max_num_seqs sizes batching only
    with pytest.raises(ConfigError, match=r"--engine-arg dtype \(None in the log, 'bfloat16' now\)"):
        check_resumable(tmp_path, meta({}), now)
    check_resumable(tmp_path, meta({"dtype": "bfloat16"}), now)
    check_resumable(tmp_path, meta(None), now)  # a log from before the record: not compared


def test_an_hf_run_records_no_engine_args_and_resumes(tmp_path):
    pytest.importorskip("torch", reason="needs torch: pip install 'aspc[hf]'")
    from aspc.testing.tiny_model import save_tiny_causal_lm

    model = save_tiny_causal_lm(tmp_path / "m", seed=0)
    data = write_jsonl(tmp_path / "IN.jsonl", [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(4)])
    plan = tmp_path / "plan.parquet"
    assert CliRunner().invoke(main, ["compile", str(data), "-o", str(plan), "-q"]).exit_code == 0
    args = ["run", str(plan), "--backend", "hf", "--model", str(model), "--max-new-tokens", "4", "--workers", "1",
            "--global-batch", "4", "--log", str(tmp_path / "RUN")]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert json.loads((tmp_path / "RUN" / "meta.json").read_text())["run"]["sampling"]["engine_args"] == {}
    r = CliRunner().invoke(main, [*args, "--resume"])
    assert r.exit_code == 0 and "already complete" in r.output, r.output


@needs_vllm
def test_a_generation_config_stop_id_ends_the_response_as_on_hf(tmp_path):
    """Llama 3 style: generation_config.json lists EOS ids beyond the tokenizer's. vLLM stops on them; the
    backend counted the stop token in the length and marked the sample unfinished (hf did neither)."""
    from aspc.runtime import BackendContext
    from aspc.runtime.registry import make_backend
    from aspc.runtime.work import work_from_table
    from aspc.testing.plans import plan_table

    model = vllm_tiny_model(tmp_path / "models")
    gen = json.loads((model / "generation_config.json").read_text())
    tokenizer_eos = gen["eos_token_id"] if isinstance(gen["eos_token_id"], int) else gen["eos_token_id"][0]
    stops = set(range(4, 40)) - {tokenizer_eos}  # a third of the vocabulary: most responses end on one
    gen["eos_token_id"] = [tokenizer_eos, *sorted(stops)]
    (model / "generation_config.json").write_text(json.dumps(gen))
    table = plan_table([0, 0, 1, 1], n_samples=4)
    b = make_backend("vllm", BackendContext(n_workers=1, options={"model": str(model), "max_new_tokens": 16,
                                                                  "temperature": 1.0}))  # fmt: skip
    work = work_from_table(table)
    b.setup(work, 1)
    try:
        res = [b.generate(0, work.minibatch(m)) for m in range(work.n_minibatches)]
    finally:
        b.close()
    payloads = [p for r in res for p in r.payload]
    lens = [int(x) for r in res for x in r.response_len]
    ended = [p for p in payloads if p["finished"]]
    assert len(ended) >= len(payloads) // 2, payloads  # with a third of the vocabulary a stop, most end early
    for p, n in zip(payloads, lens, strict=True):
        toks = p["response_token_ids"]
        if p["finished"]:
            assert toks[-1] in stops | {tokenizer_eos} and n == len(toks) - 1
        else:
            assert n == len(toks) == 16 and not set(toks[:-1]) & stops
