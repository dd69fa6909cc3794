"""Crash safety: SIGKILL a run at random times and resume it; worker faults (raise, hang) are re-dispatched."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.errors import RunError
from aspc.runtime import Clock, GenerationBackend, RunConfig, Trainer, TrainResult, read_run_log, run
from aspc.runtime.backends.sim import SimBackend
from aspc.runtime.backends.sim_cost import SimCostModel
from aspc.runtime.engines.virtual import TEST_DELAY_ENV
from aspc.testing.plans import plan_table
from tests.conftest import write_jsonl

ROOT = Path(__file__).resolve().parents[1]


# ---- helpers --------------------------------------------------------------------


def _plan_files(tmp_path: Path, n: int, *, seed: int = 3, batch_size: int = 4, max_len: int = 90):
    rng = np.random.default_rng(seed)
    records = [
        {"id": f"q{i:03d}", "prompt": f"question {i}: " + "x" * int(rng.integers(1, 12)),
         "lengths": [int(x) for x in rng.integers(0, max_len, size=2)]}
        for i in range(n)
    ]
    data = write_jsonl(tmp_path / "IN.jsonl", records)
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--samples-per-prompt", "2",
                                  "--batch-size", str(batch_size), "-o", str(plan), "--quiet"])
    assert r.exit_code == 0, r.output
    want = {(d["id"], i): x for d in records for i, x in enumerate(d["lengths"])}
    return data, plan, want


def _cli(args: list[str], *, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "aspc.cli", *args], cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_at(proc: subprocess.Popen, seconds: float) -> bool:
    """SIGKILL ``proc`` after ``seconds`` unless it finished; True if it was killed."""
    try:
        proc.wait(timeout=seconds)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True


def _has_committed(run_dir: Path, table: str) -> bool:
    """Whether ``run_dir``'s meta.json commits a part of ``table`` (a part on disk may not be committed yet)."""
    try:
        meta = json.loads((run_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    first, end = meta.get("parts", {}).get(table, [0, 0])
    return end > first


def _kill_mid_run(proc: subprocess.Popen, run_dir: Path, extra: float, table: str = "minibatches") -> bool:
    """Wait until ``run_dir`` has committed rows of ``table``, then SIGKILL ``proc`` ``extra`` seconds later."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if _has_committed(run_dir, table):
            break
        time.sleep(0.02)
    return _kill_at(proc, extra)


def _committed(run_dir: Path) -> tuple[int, str]:
    """(sample rows a resume would keep, status) of a (possibly crashed) run log."""
    if not (run_dir / "meta.json").exists():
        return 0, "absent"
    log = read_run_log(run_dir, allow_incomplete=True)
    return log.tables["samples"].num_rows, log.status


def check_contract(run_dir: Path, want: dict, global_batch: int, *, lengths_cap: int | None = None) -> dict:
    """The resume contract on a finished log: every planned sample once, steps contiguous and full,
    versions never going backwards. Returns the samples' rows keyed by (prompt_id, sample_index)."""
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["status"] == "complete"
    rows = ds.dataset(str(run_dir / "samples"), format="parquet").to_table().to_pylist()
    keys = Counter((r["prompt_id"], r["sample_index"]) for r in rows)
    assert keys == Counter(want.keys())  # every planned sample exactly once
    for r in rows:
        cap = lengths_cap if lengths_cap is not None else r["response_len"]
        assert r["response_len"] == min(want[(r["prompt_id"], r["sample_index"])], cap)
    steps = Counter(r["consumed_step"] for r in rows if r["consumed_step"] is not None)
    n_steps = len(want) // global_batch
    assert sorted(steps) == list(range(n_steps))  # contiguous from 0
    assert set(steps.values()) <= {global_batch}  # each step exactly one global batch
    assert sum(r["consumed_step"] is None for r in rows) == len(want) % global_batch  # left over
    for r in rows:
        if r["consumed_step"] is not None:
            assert 0 <= r["weights_version"] <= r["consumed_step"]
            assert r["policy_lag"] == r["consumed_step"] - r["weights_version"]
    log = read_run_log(run_dir)
    st = log.tables["steps"].to_pydict()
    assert st["step"] == list(range(n_steps)) and st["version"] == [s + 1 for s in st["step"]]
    assert all(a <= b for a, b in zip(st["end"], st["start"][1:], strict=False))  # steps never overlap
    mbs = log.tables["minibatches"].to_pydict()
    assert sorted(mbs["minibatch"]) == list(range(len(set(mbs["minibatch"]))))  # each minibatch once
    # Weights versions never go backwards on a worker, and never run ahead of published versions.
    by_worker: dict[int, list[tuple[float, int]]] = {}
    for w, t, v in zip(mbs["worker"], mbs["dispatch_time"], mbs["weights_version"], strict=True):
        by_worker.setdefault(w, []).append((t, v))
        assert v <= sum(e <= t + 1e-9 for e in st["end"])
    for seq in by_worker.values():
        versions = [v for _t, v in sorted(seq)]
        assert versions == sorted(versions)
    return {(r["prompt_id"], r["sample_index"]): r for r in rows}


# ---- resume after SIGKILL: sim backend ---------------------------------------------


def _sim_args(plan: Path, data: Path, run_dir: Path) -> list[str]:
    return ["run", str(plan), "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "3",
            "--global-batch", "12", "--log", str(run_dir), "--log-flush-seconds", "0.02", "--quiet"]


def _sim_kill_resume(tmp_path: Path, seeds: list[int]) -> None:
    data, plan, want = _plan_files(tmp_path, 120)
    ref = tmp_path / "REF"
    p = _cli(_sim_args(plan, data, ref))
    assert p.wait() == 0, p.stderr.read()
    ref_rows = check_contract(ref, want, 12)
    partial = 0
    for seed in seeds:
        rng = np.random.default_rng(seed)
        run_dir = tmp_path / f"RUN{seed}"
        # ~60 events at 20 ms each: a run of about 1.5 s after start-up, killed at a random instant.
        p = _cli(_sim_args(plan, data, run_dir), env={TEST_DELAY_ENV: "0.02"})
        killed = _kill_mid_run(p, run_dir, float(rng.uniform(0.0, 1.2)))
        n, status = _committed(run_dir)
        if killed and status == "running" and 0 < n < len(want):
            partial += 1
        # A second crash, during the resume, for some seeds.
        if killed and seed % 2:
            p = _cli([*_sim_args(plan, data, run_dir), "--resume"], env={TEST_DELAY_ENV: "0.02"})
            _kill_at(p, float(rng.uniform(0.8, 2.0)))
        p = _cli([*_sim_args(plan, data, run_dir), "--resume"])
        out, err = p.communicate()
        assert p.returncode == 0, err
        rows = check_contract(run_dir, want, 12)
        # Same samples, same lengths as an uninterrupted run; what was durable before the crash is kept.
        assert {k: r["response_len"] for k, r in rows.items()} == {k: r["response_len"] for k, r in ref_rows.items()}
        assert not list(run_dir.rglob("*.tmp"))
    # The kills landed mid-run with work committed and work outstanding (else this test proves nothing).
    assert partial >= max(1, len(seeds) // 2)


def _committed_past_revision(run_dir: Path) -> bool | None:
    """True once the log holds a minibatch at or after revision 1's first; None before that."""
    from aspc.emit import read_plan

    rev = run_dir / "plans" / "revision-1.parquet"
    if not rev.exists():
        return None
    first = read_plan(rev).config["revision"]["first_minibatch"]
    try:
        mbs = read_run_log(run_dir, allow_incomplete=True).tables["minibatches"].column("minibatch").to_pylist()
    except Exception:  # a part being committed right now: look again
        return None
    return True if mbs and max(mbs) >= first else None


def test_replanned_run_sigkilled_after_a_revision_resumes_exactly(tmp_path):
    # --replan with --resume: the resumed run re-applies RUN/plans/revision-*.parquet before
    # restoring the log (whose minibatch and sample numbers follow the revisions), then goes on.
    data, plan, want = _plan_files(tmp_path, 120)
    replan = ["--replan", "--replan-every", "1"]
    ref = tmp_path / "REF"
    p = _cli([*_sim_args(plan, data, ref), *replan])
    assert p.wait() == 0, p.stderr.read()
    ref_rows = check_contract(ref, want, 12)
    assert list((ref / "plans").glob("revision-*.parquet")), "no revision: the test would prove nothing"
    resumed_after_revision = 0
    for seed in range(3):
        rng = np.random.default_rng(seed)
        run_dir = tmp_path / f"RUN{seed}"
        p = _cli([*_sim_args(plan, data, run_dir), *replan], env={TEST_DELAY_ENV: "0.02"})
        # Kill once the log holds a minibatch of the first revision: the resume must then
        # renumber as the revision did, or its restore would mark the wrong minibatches done.
        deadline = time.monotonic() + 120
        while p.poll() is None and time.monotonic() < deadline and _committed_past_revision(run_dir) is None:
            time.sleep(0.01)
        killed = _kill_at(p, float(rng.uniform(0.0, 0.1)))
        n, status = _committed(run_dir)
        if killed and status == "running" and n < len(want) and _committed_past_revision(run_dir):
            resumed_after_revision += 1
        p = _cli([*_sim_args(plan, data, run_dir), *replan, "--resume"])
        out, err = p.communicate()
        assert p.returncode == 0, err
        rows = check_contract(run_dir, want, 12)
        assert {k: r["response_len"] for k, r in rows.items()} == {k: r["response_len"] for k, r in ref_rows.items()}
        revs = read_run_log(run_dir).tables["minibatches"].column("plan_revision").to_pylist()
        assert max(r for r in revs if r is not None) >= 1
    assert resumed_after_revision >= 1


def test_resume_with_replan_refuses_revisions_out_of_sequence(tmp_path):
    data, plan, want = _plan_files(tmp_path, 120)
    run_dir = tmp_path / "RUN"
    args = [*_sim_args(plan, data, run_dir), "--replan", "--replan-every", "1"]
    p = _cli(args, env={TEST_DELAY_ENV: "0.02"})
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline and not (run_dir / "plans" / "revision-1.parquet").exists():
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    first = run_dir / "plans" / "revision-1.parquet"
    assert first.exists()
    first.rename(run_dir / "plans" / "revision-7.parquet")
    p = _cli([*args, "--resume"])
    out, err = p.communicate()
    assert p.returncode != 0
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and "revision-7.parquet" in lines[0] and "--overwrite" in lines[0], err


def test_sim_sigkill_then_resume_generates_every_sample_once(tmp_path):
    _sim_kill_resume(tmp_path, [0, 1, 2])


@pytest.mark.slow
def test_sim_sigkill_then_resume_many_seeds(tmp_path):
    _sim_kill_resume(tmp_path, list(range(3, 15)))


def test_resume_refuses_another_config_and_reports_a_complete_log(tmp_path):
    data, plan, want = _plan_files(tmp_path, 12)
    run_dir = tmp_path / "RUN"

    def args(plan=plan, batch="4", log=run_dir, *extra):
        return ["run", str(plan), "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "2",
                "--global-batch", batch, "--log", str(log), "--quiet", *extra]

    assert CliRunner().invoke(main, args()).exit_code == 0
    before = (run_dir / "meta.json").read_bytes()
    # Without --resume an existing log still needs --overwrite.
    r = CliRunner().invoke(main, args())
    assert r.exit_code != 0 and "--overwrite" in r.output and "--resume" in r.output
    # Another global batch: a clear one-line error, nothing touched.
    r = CliRunner().invoke(main, args(plan, "6", run_dir, "--resume"))
    assert r.exit_code != 0 and "--global-batch" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert (run_dir / "meta.json").read_bytes() == before
    # Another plan.
    (tmp_path / "other").mkdir()
    _d2, plan2, _ = _plan_files(tmp_path / "other", 12, batch_size=6)  # other minibatches
    r = CliRunner().invoke(main, args(plan2, "4", run_dir, "--resume"))
    assert r.exit_code != 0 and "the plan" in r.output
    # A complete log: says so, exit 0, unchanged.
    r = CliRunner().invoke(main, [a for a in args(plan, "4", run_dir, "--resume") if a != "--quiet"])
    assert r.exit_code == 0 and "already complete" in r.output
    assert (run_dir / "meta.json").read_bytes() == before
    check_contract(run_dir, want, 4)
    # --resume where no log exists yet starts the run.
    fresh = tmp_path / "FRESH"
    r = CliRunner().invoke(main, args(plan, "4", fresh, "--resume"))
    assert r.exit_code == 0, r.output
    check_contract(fresh, want, 4)
    assert CliRunner().invoke(main, args(plan, "4", run_dir, "--resume", "--overwrite")).exit_code == 2


# ---- worker faults -------------------------------------------------------------------


class Flaky(GenerationBackend):
    """Wraps the sim backend: raises (or hangs) on chosen attempts at chosen minibatches."""

    def __init__(self, inner: SimBackend, *, fail: dict[int, int], hang: float = 0.0, wall: bool = False):
        self.inner = inner
        self.fail = dict(fail)  # minibatch -> attempts that fail (a large number: always)
        self.hang = hang  # seconds a failing attempt sleeps instead of raising
        self.clock = Clock.WALL if wall else inner.clock
        self.attempts: Counter = Counter()

    def setup(self, work, n_workers):
        self.inner.setup(work, n_workers)

    def load_weights(self, worker, version, weights):
        return 0.0 if self.clock is Clock.WALL else self.inner.load_weights(worker, version, weights)

    def generate(self, worker, work):
        self.attempts[work.index] += 1
        if self.attempts[work.index] <= self.fail.get(work.index, 0):
            if self.hang:
                time.sleep(self.hang)
            else:
                raise RuntimeError(f"device lost on worker {worker}")
        res = self.inner.generate(worker, work)
        if self.clock is Clock.WALL:
            res.elapsed = 0.0
        return res


class QuickTrainer(Trainer):
    """A wall-clock trainer that takes no time (so the thread engine sleeps nothing)."""

    def step(self, batch):
        return TrainResult(version=batch.step + 1, elapsed=0.0)


def _fault_plan(n=48, n_samples=2):
    table = plan_table(np.arange(n) // 4, n_samples=n_samples)
    lengths = np.random.default_rng(0).integers(1, 300, n * n_samples)
    want = {(f"p{i // n_samples:07d}", i % n_samples): int(x) for i, x in enumerate(lengths)}
    return table, lengths, want


@pytest.mark.parametrize("wall", [False, True], ids=["virtual-clock", "threads"])
def test_a_raising_worker_gets_its_minibatch_redispatched(tmp_path, wall):
    table, lengths, want = _fault_plan()
    backend = Flaky(SimBackend(SimCostModel(), lengths), fail={3: 1, 7: 2}, wall=wall)
    res = run(table, config=RunConfig(workers=3, global_batch=8, backend="hf" if wall else "sim"),
              backend=backend, trainer=QuickTrainer() if wall else None, log_dir=tmp_path / "RUN")
    assert backend.attempts[3] == 2 and backend.attempts[7] == 3 and backend.attempts[0] == 1
    assert res.summary.extra["worker_faults"] == 3
    check_contract(tmp_path / "RUN", want, 8)
    meta = json.loads((tmp_path / "RUN" / "meta.json").read_text())
    assert meta["faults"]["count"] == 3 and "device lost" in meta["faults"]["first"][0]["error"]


def test_a_minibatch_failing_past_max_retries_stops_the_run_with_a_consistent_log(tmp_path):
    table, lengths, want = _fault_plan()
    backend = Flaky(SimBackend(SimCostModel(), lengths), fail={5: 10**9})
    with pytest.raises(RunError, match=r"minibatch 5 failed 3 times \(--max-retries 2\).*device lost"):
        run(table, config=RunConfig(workers=2, global_batch=8, max_retries=2), backend=backend,
            log_dir=tmp_path / "RUN")
    assert backend.attempts[5] == 3
    meta = json.loads((tmp_path / "RUN" / "meta.json").read_text())
    assert meta["status"] == "failed" and "minibatch 5 failed 3 times" in meta["error"]
    rows = ds.dataset(str(tmp_path / "RUN" / "samples"), format="parquet").to_table().to_pylist()
    keys = Counter((r["prompt_id"], r["sample_index"]) for r in rows)
    assert rows and max(keys.values()) == 1 and set(keys) < set(want)
    steps = sorted({r["consumed_step"] for r in rows if r["consumed_step"] is not None})
    assert steps == list(range(len(steps)))
    # The failed log resumes once the worker is healthy: every sample once.
    healthy = SimBackend(SimCostModel(), lengths)
    run(table, config=RunConfig(workers=2, global_batch=8, max_retries=2), backend=healthy,
        log_dir=tmp_path / "RUN", resume=True)
    check_contract(tmp_path / "RUN", want, 8)


def test_cli_max_retries_error_is_one_line(tmp_path, monkeypatch):
    data, plan, _ = _plan_files(tmp_path, 16)
    from aspc.runtime.backends import sim as simb

    original = simb.SimBackend.generate

    def broken(self, worker, work):
        if work.index == 2:
            raise RuntimeError("GPU fell off the bus")
        return original(self, worker, work)

    monkeypatch.setattr(simb.SimBackend, "generate", broken)
    run_dir = tmp_path / "RUN"
    r = CliRunner().invoke(main, ["run", str(plan), "--actual-lengths", str(data), "--length-field", "lengths",
                                  "--global-batch", "4", "--max-retries", "1", "--log", str(run_dir), "--quiet"])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert "minibatch 2 failed 2 times" in r.output and "GPU fell off the bus" in r.output
    assert json.loads((run_dir / "meta.json").read_text())["status"] == "failed"


def test_a_hung_worker_is_abandoned_after_the_timeout(tmp_path):
    table, lengths, want = _fault_plan(n=24)
    backend = Flaky(SimBackend(SimCostModel(), lengths), fail={2: 1}, hang=3.0, wall=True)
    t0 = time.monotonic()
    res = run(table, config=RunConfig(workers=2, global_batch=8, backend="hf", worker_timeout=0.5),
              backend=backend, trainer=QuickTrainer(), log_dir=tmp_path / "RUN")
    assert time.monotonic() - t0 < 2.5  # did not wait for the hung call
    assert backend.attempts[2] == 2 and res.summary.extra["worker_faults"] == 1
    meta = json.loads((tmp_path / "RUN" / "meta.json").read_text())
    assert meta["faults"]["first"][0]["lost"] and "--worker-timeout" in meta["faults"]["first"][0]["error"]
    check_contract(tmp_path / "RUN", want, 8)


def test_every_worker_hung_stops_the_run(tmp_path):
    table, lengths, _ = _fault_plan(n=8)
    backend = Flaky(SimBackend(SimCostModel(), lengths), fail={0: 1, 1: 1}, hang=5.0, wall=True)
    with pytest.raises(RunError, match="hung"):
        run(table, config=RunConfig(workers=2, global_batch=4, backend="hf", worker_timeout=0.3),
            backend=backend, trainer=QuickTrainer(), log_dir=tmp_path / "RUN")
    assert json.loads((tmp_path / "RUN" / "meta.json").read_text())["status"] == "failed"


# ---- resume after SIGKILL: hf backend, the contract invocation ---------------------


@pytest.mark.slow  # ~30 s: two processes import torch and transformers
@pytest.mark.parametrize("every", [1, 3])
def test_hf_contract_sigkill_then_resume(tmp_path, every):
    pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[hf]'")
    from tests.realmodel import tiny_model

    model_dir = tiny_model(tmp_path / "models")
    data, plan, want = _plan_files(tmp_path, 24, max_len=60)
    run_dir = tmp_path / "RUN"
    args = ["run", str(plan), "--backend", "hf", "--model", str(model_dir), "--replay-lengths",
            "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "2",
            "--global-batch", "8", "--log", str(run_dir), "--log-flush-seconds", "0.1", "--quiet",
            # A trainer that learns from tokens: the samples waiting at the kill reach it with theirs.
            "--trainer", "tests.realmodel:make_length_grpo_trainer"]
    ckpt = ["--trainer-arg", f"checkpoint_dir={tmp_path / 'ckpt'}", "--trainer-arg", f"checkpoint_every={every}"]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    p = _cli([*args, *ckpt], env=env)
    # Wait until some work is durable, then kill the whole process mid-run.
    # Killed once a trainer step is durable: the trainer must go on from its checkpoint.
    # Every 3 steps: killed at once, before the first checkpoint, so the resume replays from the initial weights.
    delay = float(np.random.default_rng(0).uniform(0.0, 0.5)) if every == 1 else 0.0
    killed = _kill_mid_run(p, run_dir, delay, table="steps")
    assert killed, "the run finished before it could be killed; make the plan larger"
    n, status = _committed(run_dir)
    assert status == "running" and 0 < n < len(want)
    assert read_run_log(run_dir, allow_incomplete=True).tables["steps"].num_rows
    # Without its checkpoints the trainer would restart from its initial weights: refused, log untouched.
    p = _cli([*args, "--resume"], env=env)
    _out, err = p.communicate(timeout=300)
    assert p.returncode == 2 and "keeps no checkpoints" in err and "Traceback" not in err, err
    p = _cli([*args, *ckpt, "--resume"], env=env)
    _out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    check_contract(run_dir, want, 8)
    steps = read_run_log(run_dir).tables["steps"].num_rows
    # The log holds every step: only the last checkpoint stays. Its history is every step once, in order:
    # with checkpoint_every=3 the steps after the newest checkpoint before the kill were taken again.
    (last,) = (tmp_path / "ckpt").glob("ckpt-*.pt")
    assert last.name.endswith(f"v{steps:08d}.pt")
    import torch

    assert [h["step"] for h in torch.load(last, weights_only=True)["history"]] == list(range(steps))


def test_resume_takes_the_lengths_file_by_contents_not_by_name(tmp_path):
    data, plan, _want = _plan_files(tmp_path, 12)
    run_dir = tmp_path / "RUN"

    def args(lengths):
        return ["run", str(plan), "--actual-lengths", str(lengths), "--length-field", "lengths", "--workers", "2",
                "--global-batch", "4", "--log", str(run_dir), "--resume"]

    assert CliRunner().invoke(main, args(data)).exit_code == 0
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(data.read_bytes())
    r = CliRunner().invoke(main, args(copy))
    assert r.exit_code == 0 and "already complete" in r.output, r.output
    other = tmp_path / "other.jsonl"
    other.write_bytes(data.read_bytes().replace(b"[", b"[1, ", 1))
    r = CliRunner().invoke(main, args(other))
    assert r.exit_code == 2 and "--actual-lengths" in r.output, r.output


def test_resume_refuses_another_replan_setting(tmp_path):
    data, plan, _want = _plan_files(tmp_path, 24)
    run_dir = tmp_path / "RUN"
    base = ["run", str(plan), "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "2",
            "--global-batch", "4", "--log", str(run_dir), "-q"]
    assert CliRunner().invoke(main, [*base, "--replan", "--replan-every", "2"]).exit_code == 0
    for extra, said in ((["--replan", "--replan-every", "3"], "--replan-every 3 now"), ([], "off now")):
        r = CliRunner().invoke(main, [*base, *extra, "--resume"])
        assert r.exit_code == 2 and "--replan (--replan-every 2 in the log" in r.output and said in r.output, r.output
    assert CliRunner().invoke(main, [*base, "--replan", "--replan-every", "2", "--resume"]).exit_code == 0
