"""The hf backend with a tiny random causal LM: replay, reloads between minibatches, the CLI contract, bad input."""

from __future__ import annotations

import json
import shutil
import sys
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.errors import BackendError, ConfigError, InputError, RunError
from aspc.runtime import BackendContext, RunConfig, read_run_log, run
from aspc.runtime.registry import make_backend
from tests.conftest import write_jsonl
from tests.realmodel import VersionTrainer, expected_lengths, run_log_samples, small_plan, tiny_model

pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[hf]'")

CAP = 64


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("models"))


def _backend(model_dir, lengths=None, **extra):
    opts = {"model": str(model_dir), "device": "cpu", "max_new_tokens": CAP, **extra}
    if lengths is not None:
        opts.update(replay=True, replay_lengths=lengths)
    return make_backend("hf", BackendContext(n_workers=2, options=opts))


def test_replay_ends_every_sequence_at_its_recorded_length(model_dir):
    # Rows with 1, 2 and 3 samples; lengths include 0 and one above the cap.
    table, lengths = small_plan(n_rows=9, rows_per_minibatch=3, n_samples=[1, 2, 3] * 3, max_len=80)
    backend = _backend(model_dir, lengths)
    got = []

    class Keep(VersionTrainer):
        def step(self, batch):
            got.extend(zip(batch.samples.tolist(), batch.payload, strict=True))
            return super().step(batch)

    res = run(table, config=RunConfig(workers=2, global_batch=2, backend="hf"), backend=backend,
              trainer=Keep(model_dir))
    want = expected_lengths(table, lengths, CAP)
    cols = res.columns["samples"]
    ids = table.column("prompt_id").to_pylist()
    rows = np.repeat(np.arange(len(ids)), table.column("n_samples").to_numpy())
    for k, (r, i) in enumerate(zip(rows, cols["sample_index"], strict=True)):
        assert cols["response_len"][k] == want[(ids[r], int(i))]
    assert res.summary.samples_generated == len(want)
    # The payload's tokens agree: response_len tokens, plus the EOS when the sequence ended.
    for sid, p in got:
        n = int(cols["response_len"][sid])
        assert len(p["response_token_ids"]) == n + int(p["finished"])
        assert p["finished"] == (n < CAP)


def test_chat_and_plain_prompts_generate_real_tokens(model_dir):
    from aspc.runtime.backends.models import load_tokenizer
    from aspc.runtime.backends.prompts import parse_chat, render_prompt

    chat = json.dumps([{"role": "user", "content": "hi"}], separators=(",", ":"))
    tok = load_tokenizer(model_dir)
    assert parse_chat(chat) == [{"role": "user", "content": "hi"}]
    assert parse_chat("[not json") is None and parse_chat("plain") is None
    # Plain text that looks like a chat list is not aspc's stored form: it was run as a chat.
    assert parse_chat('[{"role": "user", "content": "hi"}]') is None
    assert render_prompt('[{"role": "user", "content": "hi"}]', tok) == ('[{"role": "user", "content": "hi"}]', False)
    text, templated = render_prompt(chat, tok)
    assert text == "user: hi\nassistant: " and templated
    assert render_prompt("plain text", tok) == ("plain text", False)

    table, _ = small_plan(n_rows=4, rows_per_minibatch=2, n_samples=2)
    prompts = [chat, "plain one", chat, "plain two"]
    import pyarrow as pa

    table = table.set_column(table.schema.get_field_index("prompt"), "prompt", pa.array(prompts, pa.string()))
    backend = _backend(model_dir, temperature=0.0, max_new_tokens=12)
    lens = []
    for _ in range(2):
        res = run(table, config=RunConfig(workers=2, global_batch=4, backend="hf"), backend=backend)
        lens.append(res.columns["samples"]["response_len"].tolist())
        backend = _backend(model_dir, temperature=0.0, max_new_tokens=12)
    assert all(0 <= x <= 12 for x in lens[0])
    assert lens[0] == lens[1]  # greedy decoding is deterministic


def test_reloads_only_between_minibatches_and_versions_are_recorded(model_dir):
    table, lengths = small_plan(n_rows=16, rows_per_minibatch=2, n_samples=2, max_len=40)
    backend = _backend(model_dir, lengths)
    calls = []
    original_execute, original_load = backend.execute, backend.load_weights

    def execute(worker, request):
        calls.append(("gen-start", worker))
        try:
            return original_execute(worker, request)
        finally:
            calls.append(("gen-end", worker))

    def load_weights(worker, version, weights):
        calls.append(("reload", worker))
        return original_load(worker, version, weights)

    backend.execute, backend.load_weights = execute, load_weights
    backend.close = lambda: None  # keep the models to inspect their weights afterwards
    trainer = VersionTrainer(model_dir, delay=0.05)
    res = run(table, config=RunConfig(workers=2, global_batch=4, backend="hf"), backend=backend, trainer=trainer)
    # No worker reloads while it is generating.
    busy = set()
    for kind, w in calls:
        if kind == "gen-start":
            busy.add(w)
        elif kind == "gen-end":
            busy.discard(w)
        else:
            assert w not in busy
    assert any(kind == "reload" for kind, _ in calls)
    # The version the backend held when generating == the version the run log records.
    assert trainer.pairs and all(stamp == logged for stamp, logged in trainer.pairs)
    assert max(v for _, v in trainer.pairs) >= 1
    # Each worker's model holds exactly the weights of the last version it loaded.
    for w in (0, 1):
        v = backend.weights_version(w)
        if v:
            params = backend._state[w].model.state_dict()
            for k, t in trainer.published[v].items():
                assert np.allclose(params[k].numpy(), t.numpy())
    lag = res.columns["samples"]["policy_lag"]
    assert (lag[lag >= 0] >= 0).all()


def test_reload_mid_minibatch_is_refused(model_dir):
    backend = _backend(model_dir)
    backend._busy[0] = True
    with pytest.raises(RunError, match="mid-minibatch"):
        backend.load_weights(0, 1, None)


def _contract_files(tmp_path, n=16):
    rng = np.random.default_rng(3)
    records = [
        {"id": f"q{i:02d}", "prompt": f"question {i}: " + "x" * int(rng.integers(1, 12)),
         "lengths": [int(x) for x in rng.integers(0, 90, size=2)]}
        for i in range(n)
    ]
    data = write_jsonl(tmp_path / "IN.jsonl", records)
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--samples-per-prompt", "2",
                                  "--batch-size", "4", "-o", str(plan), "--quiet"])
    assert r.exit_code == 0, r.output
    return data, plan, {(d["id"], i): min(x, CAP) for d in records for i, x in enumerate(d["lengths"])}


def _contract_args(plan, model_dir, data, run_dir):
    return ["run", str(plan), "--backend", "hf", "--model", str(model_dir), "--replay-lengths",
            "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "2",
            "--global-batch", "8", "--max-new-tokens", str(CAP), "--log", str(run_dir), "--json"]


def test_cli_contract_response_len_is_the_replayed_length(tmp_path, model_dir):
    data, plan, want = _contract_files(tmp_path)
    run_dir = tmp_path / "RUN"
    r = CliRunner().invoke(main, _contract_args(plan, model_dir, data, run_dir))
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["samples_generated"] == len(want) == summary["samples_planned"]
    rows = run_log_samples(run_dir)
    assert Counter((s["prompt_id"], s["sample_index"]) for s in rows) == Counter(want.keys())
    for s in rows:
        assert s["response_len"] == want[(s["prompt_id"], s["sample_index"])]


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--model", "{tmp}/nope"], "no such directory"),
        (["--model", "{tmp}/empty"], "no config.json"),
        (["--model", "{tmp}/encoder"], "not a causal LM"),
        # vLLM failed on these after its engine started: three tracebacks, no cause (hf said it as an OSError)
        (["--model", "{tmp}/noweights"], "no weights in it (no *.safetensors or pytorch_model*.bin)"),
        (["--model", "{tmp}/notok"], "no tokenizer in it (no tokenizer.json, tokenizer_config.json"),
        # transformers took it for a torch file: an UnpicklingError after 12 s of loading
        (["--model", "{tmp}/COPY.GGUF"], "name the file with a lower-case .gguf suffix"),
        (["--model", "{model}", "--device", "npu"], "torch-npu"),
        (["--model", "{model}", "--device", "gpu:0"], "--device"),
        (["--model", "{model}", "--temperature", "-1"], "--temperature"),
        # 1e-40 passed the check, then every minibatch failed ("probability tensor contains inf") and the log was left failed
        (["--model", "{model}", "--temperature", "1e-40"], "too small to sample with (below 1e-05); pass 0 for greedy"),
        ([], "--model"),
    ],
)
def test_bad_input_one_line_errors(tmp_path, model_dir, extra, fragment):
    if "torch-npu" in fragment and __import__("importlib").util.find_spec("torch_npu") is not None:
        pytest.skip("torch-npu is installed here")
    (tmp_path / "empty").mkdir()
    (tmp_path / "COPY.GGUF").write_bytes(b"GGUF")
    (tmp_path / "encoder").mkdir()
    (tmp_path / "encoder" / "config.json").write_text(json.dumps({"model_type": "t5", "architectures": ["T5Model"]}))
    for name, drop in (("noweights", ("*.safetensors",)), ("notok", ("tokenizer*", "vocab*", "special_tokens*"))):
        shutil.copytree(model_dir, tmp_path / name)
        for pattern in drop:
            for f in (tmp_path / name).glob(pattern):
                f.unlink()
    data, plan, _ = _contract_files(tmp_path, n=4)
    args = ["run", str(plan), "--backend", "hf", "--actual-lengths", str(data), "--length-field", "lengths",
            "--replay-lengths", "--workers", "2", "--global-batch", "4", "--log", str(tmp_path / "RUN")]
    args += [a.format(tmp=tmp_path, model=model_dir) for a in extra]
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0
    assert fragment in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "RUN").exists()  # nothing written before the run could start


def test_replay_without_lengths_and_missing_ray(tmp_path, model_dir, monkeypatch):
    _, plan, _ = _contract_files(tmp_path, n=4)
    r = CliRunner().invoke(main, ["run", str(plan), "--backend", "hf", "--model", str(model_dir), "--replay-lengths"])
    assert r.exit_code == 2 and "--actual-lengths" in r.output
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    r = CliRunner().invoke(main, ["run", str(plan), "--backend", "hf", "--model", str(model_dir),
                                  "--engine", "ray", "--max-new-tokens", "4"])
    assert r.exit_code != 0 and "pip install 'aspc[ray]'" in r.output and "Traceback" not in r.output


def test_worker_crash_keeps_completed_samples_in_the_log(tmp_path, model_dir):
    table, lengths = small_plan(n_rows=16, rows_per_minibatch=2, n_samples=2, max_len=30)
    backend = _backend(model_dir, lengths)
    original = backend._execute

    def crash_on_late_minibatch(worker, request):
        if request.minibatch == 6:
            raise RuntimeError("device lost")
        return original(worker, request)

    backend._execute = crash_on_late_minibatch
    run_dir = tmp_path / "RUN"
    with pytest.raises(RunError, match="device lost"):
        run(table, config=RunConfig(workers=2, global_batch=4, backend="hf", log_flush_seconds=0.0),
            backend=backend, trainer=VersionTrainer(model_dir), log_dir=run_dir)
    log = read_run_log(run_dir, allow_incomplete=True)
    assert log.status == "failed" and "device lost" in log.meta["error"]
    samples = log.tables["samples"].to_pylist()
    # Every generated sample once; null consumed_step = generated, still queued when the run failed.
    assert any(s["consumed_step"] is not None for s in samples)
    assert len({(s["prompt_id"], s["sample_index"]) for s in samples}) == len(samples)


def test_make_backend_errors_without_model():
    with pytest.raises(ConfigError, match="--model"):
        make_backend("hf", BackendContext(n_workers=1, options={}))
    with pytest.raises(BackendError, match="no such directory"):
        make_backend("hf", BackendContext(n_workers=1, options={"model": "does/not/exist"}))


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.skipif(not _cuda(), reason="no CUDA device here")
def test_replay_and_reload_on_cuda(model_dir):
    table, lengths = small_plan(n_rows=12, rows_per_minibatch=3, n_samples=2, max_len=80)
    backend = _backend(model_dir, lengths, device="auto")
    backend.close = lambda: None
    trainer = VersionTrainer(model_dir)
    res = run(table, config=RunConfig(workers=2, global_batch=4, backend="hf"), backend=backend, trainer=trainer)
    assert backend._state[0].device.startswith("cuda")
    assert str(backend._state[0].model.dtype) == "torch.bfloat16"  # dtype auto on an accelerator
    want = expected_lengths(table, lengths, CAP)
    ids = table.column("prompt_id").to_pylist()
    rows = np.repeat(np.arange(len(ids)), 2)
    cols = res.columns["samples"]
    assert [int(x) for x in cols["response_len"]] == [want[(ids[r], int(i))] for r, i in
                                                      zip(rows, cols["sample_index"], strict=True)]
    assert trainer.pairs and all(stamp == logged for stamp, logged in trainer.pairs)


def test_replan_with_hf_keeps_every_replayed_length(tmp_path, model_dir):
    # Re-planning revises the undispatched remainder mid-run; the hf backend's
    # replayed lengths must follow their (prompt, sample) pairs into the new order.
    data, plan, want = _contract_files(tmp_path, n=160)
    run_dir = tmp_path / "RUN"
    args = _contract_args(plan, model_dir, data, run_dir) + ["--replan", "--replan-every", "1"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["samples_generated"] == len(want) == summary["samples_planned"]
    revisions = sorted((run_dir / "plans").glob("revision-*.parquet"))
    assert revisions, "no revision was made: the test does not exercise re-planning"
    rows = run_log_samples(run_dir)
    assert Counter((s["prompt_id"], s["sample_index"]) for s in rows) == Counter(want.keys())
    for s in rows:
        assert s["response_len"] == want[(s["prompt_id"], s["sample_index"])]
    mbs = read_run_log(run_dir).tables["minibatches"]
    assert max(v for v in mbs.column("plan_revision").to_pylist() if v is not None) >= 1
    # The model's token counts move with their prompts through each revision (not back to the plan's estimate).
    import pyarrow.parquet as pq

    from aspc.runtime.backends.models import load_tokenizer
    from aspc.runtime.backends.prompts import plan_prompt_tokens
    from aspc.runtime.work import work_from_table

    counted = plan_prompt_tokens(work_from_table(pq.read_table(plan)), load_tokenizer(model_dir))
    assert all(s["prompt_tokens"] == len(counted[s["prompt_id"]]) for s in rows)


def test_speed_probe_times_the_reference_minibatch_before_the_first_dispatch_and_after_the_last(tmp_path, model_dir):
    from aspc.runtime.backends.base import PROBE_SEQUENCES, PROBE_TOKENS, probe_request

    data, plan, want = _contract_files(tmp_path)
    lengths = {d: v for d, v in ((json.loads(x)["id"], json.loads(x)["lengths"]) for x in data.read_text().splitlines())}
    backend = _backend(model_dir, lengths)
    calls: list[tuple[str, int, object]] = []
    execute = backend._execute

    def spy(worker, request):
        res = execute(worker, request)
        calls.append(("probe" if request.minibatch < 0 else "minibatch", worker, res))
        return res

    backend._execute = spy
    from aspc.emit import read_plan

    res = run(read_plan(plan), config=RunConfig(workers=2, global_batch=8, backend="hf", speed_probe=True),
              backend=backend, trainer=VersionTrainer(model_dir))
    kinds = [k for k, _, _ in calls]
    n_mb = kinds.count("minibatch")
    # Two probes per worker: all before the first minibatch, all after the last.
    assert kinds == ["probe"] * 2 + ["minibatch"] * n_mb + ["probe"] * 2
    assert [w for k, w, _ in calls if k == "probe"] == [0, 1, 0, 1]
    for k, _, r in calls:
        if k == "probe":  # the same fixed work every time: 8 sequences of exactly 32 tokens
            assert r.response_len.tolist() == [PROBE_TOKENS] * PROBE_SEQUENCES
    probes = res.summary.extra["speed_probe_s"]
    assert probes["before"] == [r.elapsed for k, _, r in calls[:2]]
    assert probes["after"] == [r.elapsed for k, _, r in calls[-2:]]
    assert res.summary.samples_generated == len(want)  # the probes are not samples of the run
    assert probe_request().n_total == PROBE_SEQUENCES

    # The CLI: --json and the log report it, and aspc calibrate carries the mean.
    (tmp_path / "cli").mkdir()
    data, plan, _ = _contract_files(tmp_path / "cli", n=40)  # >= 8 minibatches: enough to calibrate on
    run_dir = tmp_path / "RUN"
    r = CliRunner().invoke(main, [*_contract_args(plan, model_dir, data, run_dir), "--speed-probe"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    got = summary["speed_probe_s"]
    assert len(got["before"]) == len(got["after"]) == 2 and min(got["before"] + got["after"]) > 0
    assert read_run_log(run_dir).meta["summary"]["speed_probe_s"] == got
    r = CliRunner().invoke(main, ["calibrate", str(run_dir), "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["speed_probe_s"] == pytest.approx(np.mean(got["before"] + got["after"]))


def test_prompts_past_the_model_context_are_refused_before_the_log_starts_with_advice_that_works(tmp_path, model_dir):
    # The tiny model's context is 1024 positions; one character is one token. Checked minibatch by
    # minibatch, each advised --max-new-tokens failed again on the next long prompt, after retries.
    long = {"q5": 1000, "q2": 990, "q6": 700}
    records = [{"id": f"q{i}", "prompt": "x" * long.get(f"q{i}", 8), "lengths": [3, 4]} for i in range(8)]
    data = write_jsonl(tmp_path / "IN.jsonl", records)
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--samples-per-prompt", "2",
                                  "--batch-size", "4", "-o", str(plan), "--quiet"])
    assert r.exit_code == 0, r.output
    args = ["run", str(plan), "--backend", "hf", "--model", str(model_dir), "--workers", "2", "--global-batch", "4",
            "--max-retries", "3", "--log", str(tmp_path / "RUN"), "-q"]
    r = CliRunner().invoke(main, [*args, "--max-new-tokens", str(CAP)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    text = " ".join(r.output.split())
    assert "2 of the plan's prompts need more positions than the model's 1024 with --max-new-tokens 64" in text
    assert "the longest, 'q5', is 10" in text and "failed 4 times" not in text
    assert not (tmp_path / "RUN" / "meta.json").exists()  # refused before the log started
    room = int(text.split("lower --max-new-tokens to ")[1].split()[0])
    r = CliRunner().invoke(main, [*args, "--max-new-tokens", str(room)])
    assert r.exit_code == 0, r.output


def test_a_scout_checks_the_prompts_against_the_epochs_cap_before_it_runs(tmp_path, model_dir):
    # The scout's own cap is its cut: a plan too long for --max-new-tokens was refused only after
    # the whole scout, its log left holding a scout the advised lower cap could not --resume.
    records = [{"id": f"q{i}", "prompt": "x" * (1000 if i == 5 else 8), "lengths": [3, 4]} for i in range(8)]
    data = write_jsonl(tmp_path / "IN.jsonl", records)
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--samples-per-prompt", "2",
                                  "--batch-size", "4", "-o", str(plan), "--quiet"])
    assert r.exit_code == 0, r.output
    for cap, need in ((["--max-new-tokens", "40"], "40 it needs 1040"), ([], "256 it needs 1256")):  # 256: the default
        r = CliRunner().invoke(main, ["run", str(plan), "--backend", "hf", "--model", str(model_dir), "--workers", "2",
                                      "--global-batch", "4", "--scout", "--scout-tokens", "16", *cap,
                                      "--log", str(tmp_path / "RUN"), "-q"])  # fmt: skip
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
        assert f"prompt 'q5' is 1000 tokens; with --max-new-tokens {need} positions" in r.output
        assert not (tmp_path / "RUN" / "scout" / "meta.json").exists()  # refused before the scout ran


def test_token_ids_past_the_embeddings_are_a_mismatched_tokenizer():
    from types import SimpleNamespace

    from aspc.runtime.backends.hf import check_prompt_tokens

    state = SimpleNamespace(n_embeddings=100, max_positions=None)
    check_prompt_tokens("a", [0, 99], 10**6, state)  # no context limit declared: any length passes
    with pytest.raises(ConfigError, match="token id 100, past the model's 100 embeddings"):
        check_prompt_tokens("a", [0, 100], 1, state)
    with pytest.raises(InputError, match="drop or shorten") as err:
        check_prompt_tokens("a", [1] * 8, 1, SimpleNamespace(n_embeddings=100, max_positions=8))
    assert "lower --max-new-tokens" not in str(err.value)  # no cap could make room


def test_the_gguf_loader_bar_is_off_while_converting_and_restored_after(monkeypatch):
    # transformers' GGUF loader called tqdm itself: its bar drew under --quiet.
    loader = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    from aspc.runtime.backends.models import _no_gguf_bar

    calls = []
    monkeypatch.setattr(loader, "tqdm", lambda *a, **k: calls.append(k) or iter(()))
    original = loader.tqdm
    with _no_gguf_bar():
        list(loader.tqdm([1, 2], desc="Converting"))
    assert calls == [{"desc": "Converting", "disable": True}]
    assert loader.tqdm is original


def test_a_plan_check_names_the_one_prompt_or_the_longest_of_many():
    from aspc.runtime.backends.prompts import check_plan_fits

    check_plan_fits({"a": [1] * 10}, 6, 16, "the model's")  # fits exactly
    check_plan_fits({"a": [1] * 10**4}, 6, None, "the model's")  # no limit declared
    with pytest.raises(InputError, match=r"prompt 'a' is 10 tokens; .* more than the model's 15; lower --max-new"):
        check_plan_fits({"a": [1] * 10, "b": [1]}, 6, 15, "the model's")
    with pytest.raises(InputError, match=r"2 of the plan's .*\(the longest, 'b', is 12 tokens\); lower --max-new-tokens "
                                         r"to 3 or less"):
        check_plan_fits({"a": [1] * 10, "b": [1] * 12, "c": [1]}, 6, 15, "the model's")


def test_resume_refuses_other_sampling_options_and_model(tmp_path, model_dir):
    # The log recorded none of them: a resume with another temperature or model went on silently.
    import shutil

    data, plan, _ = _contract_files(tmp_path, n=4)
    run_dir = tmp_path / "RUN"
    args = _contract_args(plan, model_dir, data, run_dir)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    other = tmp_path / "other-model"
    shutil.copytree(model_dir, other)
    for extra, fragment in ((["--temperature", "0.5"], "--temperature (1.0 in the log, 0.5 now)"),
                            (["--top-k", "5"], "--top-k (0 in the log, 5 now)")):  # fmt: skip
        r = CliRunner().invoke(main, [*args, "--resume", *extra])
        assert r.exit_code == 2 and fragment in " ".join(r.output.split()), r.output
    moved = [str(other) if a == str(model_dir) else a for a in args]
    r = CliRunner().invoke(main, [*moved, "--resume"])
    assert r.exit_code == 2 and "--model ('tiny-llama' in the log, 'other-model' now)" in r.output, r.output
    r = CliRunner().invoke(main, [*args, "--resume"])
    assert r.exit_code == 0 and "already complete" in r.output, r.output


def test_the_context_limit_follows_rope_scaling_as_vllm_derives_it():
    from types import SimpleNamespace as C

    from aspc.runtime.backends.hf import _max_positions

    assert _max_positions(C(max_position_embeddings=1024)) == 1024
    assert _max_positions(C(n_positions=1024)) == 1024  # GPT-2's name
    assert _max_positions(C()) is None
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert _max_positions(C(max_position_embeddings=32768, rope_scaling=yarn)) == 131072
    assert _max_positions(C(max_position_embeddings=4096, rope_scaling={"type": "linear", "factor": 2.0})) == 8192
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    assert _max_positions(C(max_position_embeddings=131072, rope_scaling=llama3)) == 131072
    assert _max_positions(C(max_position_embeddings=2048, rope_parameters={"rope_type": "default"})) == 2048


def test_a_replay_without_a_cap_is_checked_before_the_log_starts(tmp_path, model_dir):
    # Without --max-new-tokens the cap is the longest replayed length: the plan check was skipped and
    # the run failed mid-way, its log marked failed.
    records = [{"id": f"q{i}", "prompt": "x" * (950 if i == 3 else 8), "lengths": [200 if i == 3 else 5]}
               for i in range(8)]  # fmt: skip
    data = write_jsonl(tmp_path / "IN.jsonl", records)
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--batch-size", "2", "-o",
                                  str(plan), "--quiet"])  # fmt: skip
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["run", str(plan), "--backend", "hf", "--model", str(model_dir), "--replay-lengths",
                                  "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "2",
                                  "--log", str(tmp_path / "RUN"), "-q"])  # fmt: skip
    assert r.exit_code == 2 and "prompt 'q3' is 95" in r.output, r.output
    assert not (tmp_path / "RUN" / "meta.json").exists()


def test_resume_knows_the_model_by_its_directory_however_spelled(tmp_path, model_dir, monkeypatch):
    data, plan, _ = _contract_files(tmp_path, n=4)
    run_dir = tmp_path / "RUN"
    args = _contract_args(plan, model_dir, data, run_dir)
    assert CliRunner().invoke(main, args).exit_code == 0
    monkeypatch.chdir(model_dir)
    dotted = ["." if a == str(model_dir) else a for a in args]
    r = CliRunner().invoke(main, [*dotted, "--resume"])
    assert r.exit_code == 0 and "already complete" in r.output, r.output


def test_a_speed_probe_the_model_context_cannot_hold_says_to_drop_it(tmp_path):
    # The probe's prompt is aspc's own: the advice was "lower --max-new-tokens 33 (never given) or shorten the prompt".
    from aspc.runtime.backends.base import PROBE_TOKENS, probe_request
    from aspc.testing.tiny_model import save_tiny_causal_lm

    # One character is one token: the plan's prompts fit, the probe's do not.
    model = save_tiny_causal_lm(tmp_path / "short", max_positions=80)
    data, plan, _ = _contract_files(tmp_path, n=4)
    run_dir = tmp_path / "RUN"
    args = [*_contract_args(plan, model, data, run_dir), "--max-new-tokens", "16", "--speed-probe"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert f"--speed-probe: its reference minibatch needs {len(probe_request().prompts[0]) + PROBE_TOKENS + 1} positions per sequence" in r.output
    assert "drop --speed-probe for this model" in r.output and not run_dir.exists(), r.output
    r = CliRunner().invoke(main, args[:-1])
    assert r.exit_code == 0, r.output


def test_replayed_lengths_reused_cyclically_are_noted_as_the_sim_notes_them(tmp_path, model_dir):
    data, _, _ = _contract_files(tmp_path, n=4)  # 2 recorded lengths per prompt
    plan = tmp_path / "plan3.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--samples-per-prompt", "3",
                                  "--batch-size", "4", "-o", str(plan), "--quiet"])  # fmt: skip
    assert r.exit_code == 0, r.output
    args = _contract_args(plan, model_dir, data, tmp_path / "RUN")
    r = CliRunner().invoke(main, args[:-1])  # without --json: the notes
    assert r.exit_code == 0, r.output
    assert "4 prompts have fewer observed lengths than samples; their lengths are reused cyclically" in " ".join(r.output.split())


def test_the_run_log_counts_prompt_tokens_with_the_models_tokenizer(tmp_path, model_dir):
    # The plan's prompt_tokens are compile time's estimate (bytes / 4); the model prefilled its own tokenizer's
    # count of the rendered prompt, which the run log (and so aspc calibrate) now records.
    import pyarrow.parquet as pq

    from aspc.runtime.backends.models import load_tokenizer
    from aspc.runtime.backends.prompts import plan_prompt_tokens
    from aspc.runtime.work import work_from_table

    data, plan, _ = _contract_files(tmp_path)
    run_dir = tmp_path / "RUN"
    r = CliRunner().invoke(main, _contract_args(plan, model_dir, data, run_dir))
    assert r.exit_code == 0, r.output
    table = pq.read_table(plan)
    want = {pid: len(ids) for pid, ids in plan_prompt_tokens(work_from_table(table), load_tokenizer(model_dir)).items()}
    planned = dict(zip(table.column("prompt_id").to_pylist(), table.column("prompt_tokens").to_pylist(), strict=True))
    logged = {s["prompt_id"]: s["prompt_tokens"] for s in run_log_samples(run_dir)}
    assert logged == want
    assert any(want[p] != planned[p] for p in want)  # the estimate was not the count
