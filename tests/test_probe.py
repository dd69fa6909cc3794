"""``aspc probe``: sample, run through the public run API, log, train; the offline rehearsal with the sim."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.predict import load_predictor

STYLES = {"in one word": 3, "briefly": 60, "in a paragraph": 150, "in detail": 400, "as a long essay": 900}
TOPICS = ["cats", "tea", "jazz", "rust", "rome", "volcanoes", "sorting", "the ocean", "chess", "bread", "mars", "sql"]


def write_prompts(path: Path, n: int, seed: int = 0, start: int = 0, scale: float = 1.0) -> Path:
    rng = np.random.default_rng(seed)
    names = list(STYLES)
    with open(path, "w") as fh:
        for i in range(start, start + n):
            style = names[rng.integers(len(names))]
            lens = np.maximum(1, np.round(rng.lognormal(np.log(STYLES[style] * scale), 0.3, size=4))).astype(int)
            # No running number in the text: an unseen 5-digit number would only test extrapolation.
            topic = TOPICS[rng.integers(len(TOPICS))]
            fh.write(json.dumps({"id": f"p{i}", "prompt": f"Tell me about {topic} {style}.", "lengths": lens.tolist()}))
            fh.write("\n")
    return path


def probe(*args: str):
    return CliRunner().invoke(main, ["probe", *args])


def test_contract_invocation_logs_and_trains(tmp_path) -> None:
    data = write_prompts(tmp_path / "prompts.jsonl", 900, scale=3.0)
    args = [str(data), "--backend", "sim", "--actual-lengths", str(data), "--length-field", "lengths",
            "--prompts", "500", "--seed", "0", "--log", str(tmp_path / "probe"), "-o", str(tmp_path / "pred")]  # fmt: skip
    res = probe(*args, "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["prompts"] == 500 and summary["samples"] == 500
    samples = pq.read_table(tmp_path / "probe" / "samples")
    assert samples.num_rows == 500 and set(samples.column("sample_index").to_pylist()) == {0}
    # Each sample replays the prompt's first recorded length.
    first = {json.loads(x)["id"]: json.loads(x)["lengths"][0] for x in data.read_text().splitlines()}
    got = dict(zip(samples.column("prompt_id").to_pylist(), samples.column("response_len").to_pylist(), strict=True))
    assert all(first[k] == v for k, v in got.items())
    assert (tmp_path / "probe" / "plan.parquet").is_file()
    # The trained predictor learnt the policy: it beats the shipped default it was refitted from.
    test = write_prompts(tmp_path / "test.jsonl", 200, seed=9, start=50_000, scale=3.0)
    ev = CliRunner().invoke(main, ["predict", "eval", str(tmp_path / "pred"), str(test), "--length-field",
                                   "lengths", "--json"])  # fmt: skip
    base = CliRunner().invoke(main, ["predict", "eval", "default", str(test), "--length-field", "lengths", "--json"])
    r, b = json.loads(ev.output), json.loads(base.output)
    assert r["kendall_tau"] > b["kendall_tau"] + 0.2 and r["mae"] < 0.65 * b["mae"]
    assert 0.6 <= r["coverage_q10_q90_samples"] <= 0.95
    # Same command, same seed: the same predictor, and 'aspc predict train RUN' reproduces it.
    again = probe(*args[:-4], "--log", str(tmp_path / "probe2"), "-o", str(tmp_path / "pred2"), "--quiet")
    assert again.exit_code == 0, again.output
    h1 = load_predictor(tmp_path / "pred").content_hash()
    assert load_predictor(tmp_path / "pred2").content_hash() == h1
    tr = CliRunner().invoke(main, ["predict", "train", str(tmp_path / "probe"), "--init", "default",
                                   "-o", str(tmp_path / "pred3"), "--quiet"])  # fmt: skip
    assert tr.exit_code == 0, tr.output
    assert load_predictor(tmp_path / "pred3").content_hash() == h1


def test_probe_from_scratch_and_small_dataset(tmp_path) -> None:
    data = write_prompts(tmp_path / "prompts.jsonl", 120)
    res = probe(str(data), "--actual-lengths", str(data), "--length-field", "lengths", "--init", "none",
                "--log", str(tmp_path / "log"), "-o", str(tmp_path / "pred"))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "probing all of them" in res.output
    assert "init" not in load_predictor(tmp_path / "pred").metadata["training"]


def test_probe_bad_input_is_one_line(tmp_path) -> None:
    data = write_prompts(tmp_path / "prompts.jsonl", 30)
    res = probe(str(data), "--log", str(tmp_path / "log"), "-o", str(tmp_path / "pred"))
    assert res.exit_code == 2 and "30 prompts" in res.output and "at least 50" in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "pred").exists() and not (tmp_path / "log").exists()
    res = probe(str(data), "--prompts", "10", "--log", str(tmp_path / "log"), "-o", str(tmp_path / "pred"))
    assert res.exit_code == 2 and "--prompts 10" in res.output
    # Every response cut to the same length: nothing to learn, said with the counts.
    big = write_prompts(tmp_path / "big.jsonl", 100)
    res = probe(str(big), "--actual-lengths", str(big), "--length-field", "lengths", "--max-new-tokens", "1",
                "--log", str(tmp_path / "log2"), "-o", str(tmp_path / "pred2"))  # fmt: skip
    assert res.exit_code == 2 and "all 100 observed lengths equal 1" in res.output
    assert not (tmp_path / "pred2").exists()


def test_probe_guards_its_outputs(tmp_path) -> None:
    """-o and --log may be neither an input nor each other; a negative seed is one line; nothing is written."""
    data = write_prompts(tmp_path / "prompts.jsonl", 120)
    before = data.read_bytes()
    common = [str(data), "--backend", "sim", "--actual-lengths", str(data), "--length-field", "lengths",
              "--prompts", "100"]  # fmt: skip
    for extra, says in (
        (["--log", str(tmp_path / "same"), "-o", str(tmp_path / "same")], "is the same path as -o"),
        (["--log", str(tmp_path / "same" / "log"), "-o", str(tmp_path / "same")], "lies inside -o"),
        (["--log", str(tmp_path / "same"), "-o", str(tmp_path / "same" / "pred")], "contains -o"),
        (["--log", str(tmp_path / "log"), "-o", str(data)], "is a file"),
        (["--log", str(data.parent), "-o", str(tmp_path / "pred")], "contains -o"),
        (["--log", str(tmp_path / "log"), "-o", str(tmp_path / "pred"), "--seed", "-1"], "seed"),
    ):
        res = probe(*common, *extra)
        assert res.exit_code == 2, res.output
        assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
        assert says in res.output, res.output
    assert data.read_bytes() == before
    assert not any(p.name in ("same", "log", "pred") for p in tmp_path.iterdir())


def test_a_probe_whose_training_fails_keeps_its_log_and_says_how_to_reuse_it(tmp_path):
    from click.testing import CliRunner

    from aspc.cli import main

    src = Path(__file__).resolve().parents[1] / "examples" / "prompts.jsonl"
    log, out = tmp_path / "L", tmp_path / "P"
    r = CliRunner().invoke(main, ["probe", str(src), "--backend", "sim", "--prompts", "100", "--log", str(log),
                                  "-o", str(out), "--max-new-tokens", "1", "-q"])
    assert r.exit_code == 2
    assert "observed lengths equal 1" in r.output and f"aspc predict train {log}" in r.output, r.output
    assert (log / "meta.json").is_file() and not out.exists()


def _sim(data: Path, log: Path, out: Path, *extra: str) -> list[str]:
    return [str(data), "--backend", "sim", "--actual-lengths", str(data), "--length-field", "lengths",
            "--prompts", "100", "--log", str(log), "-o", str(out), "-q", *extra]  # fmt: skip


def test_a_wrong_init_kind_is_refused_before_any_generation(tmp_path):
    # Before: refused only after the whole probe run, and both suggested fixes failed the same way.
    data = write_prompts(tmp_path / "p.jsonl", 120)
    log, out = tmp_path / "L", tmp_path / "P"
    res = probe(*_sim(data, log, out, "--kind", "transformer", "--init", "default"))
    assert res.exit_code == 2 and "holds a lexical predictor, but --kind is transformer" in res.output, res.output
    assert "pass --kind lexical" in res.output
    assert not log.exists() and not out.exists()


def test_an_output_that_takes_no_file_is_refused_before_any_generation(tmp_path, monkeypatch):
    # A read-only -o was found only when the predictor was saved, after the whole run.
    import errno
    import tempfile

    data = write_prompts(tmp_path / "p.jsonl", 120)
    ro = tmp_path / "ro"
    ro.mkdir()
    real = tempfile.mkdtemp

    def mkdtemp(*a, dir=None, **kw):  # noqa: A002  (tempfile's own keyword)
        if dir is not None and Path(dir) == ro:
            raise OSError(errno.EROFS, "Read-only file system", str(ro))
        return real(*a, dir=dir, **kw)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    res = probe(*_sim(data, tmp_path / "L", ro / "pred"))
    assert res.exit_code == 2 and f"cannot write {ro / 'pred'}: read-only file system" in res.output, res.output
    assert not (tmp_path / "L").exists()


def test_a_failed_save_keeps_the_log_and_names_the_refit(tmp_path, monkeypatch):
    # The save was outside the hint: a full disk at the end said nothing of the kept log.
    from aspc.errors import OutputError
    from aspc.predict.lexical import LexicalPredictor

    def full(self, path):
        raise OutputError(f"no space left on the device holding {path}; free space or write elsewhere")

    monkeypatch.setattr(LexicalPredictor, "save", full)
    data = write_prompts(tmp_path / "p.jsonl", 120)
    log, out = tmp_path / "L", tmp_path / "P"
    res = probe(*_sim(data, log, out))
    assert res.exit_code != 0 and "no space left" in res.output, res.output
    assert f"aspc predict train {log} --kind lexical --init default -o {out}" in res.output
    assert (log / "plan.parquet").is_file()


def test_length_field_without_actual_lengths_is_refused(tmp_path):
    data = write_prompts(tmp_path / "p.jsonl", 120)
    res = probe(str(data), "--backend", "sim", "--length-field", "lengths", "--log", str(tmp_path / "L"),
                "-o", str(tmp_path / "P"))  # fmt: skip
    assert res.exit_code == 2 and "--length-field names the length field of --actual-lengths" in res.output
    assert not (tmp_path / "L").exists()
    plan = tmp_path / "plan.parquet"
    assert CliRunner().invoke(main, ["compile", str(data), "-o", str(plan), "-q"]).exit_code == 0
    res = CliRunner().invoke(main, ["run", str(plan), "--length-field", "lengths", "-q"])
    assert res.exit_code == 2 and "--length-field names the length field of --actual-lengths" in res.output


@pytest.mark.parametrize("extra", [("--overwrite",), ()])
def test_a_locked_log_is_refused_as_one_in_use(tmp_path, extra):
    # Another process writing the log: without --overwrite, "directory exists and is not empty" was
    # advice for a log nobody uses. The lock's words ("stop it and rerun with --resume") hold for probe.
    from aspc.runtime.record.lock import RunLogLock

    data = write_prompts(tmp_path / "p.jsonl", 120)
    log, out = tmp_path / "L", tmp_path / "P"
    assert probe(*_sim(data, log, out)).exit_code == 0
    lock = RunLogLock(log)
    lock.acquire()
    try:
        res = probe(*_sim(data, log, out, *extra))
    finally:
        lock.release()
    assert res.exit_code != 0 and "is locked by another aspc run" in res.output, res.output
    assert "rerun with --resume" in res.output


STOPPING = """
import os
import signal

from aspc.runtime.contracts import Trainer, TrainResult


class Stopping(Trainer):
    def step(self, b):
        if b.step == 2 and not os.environ.get("PROBE_GO_ON"):  # a user's Ctrl-C, mid-probe
            os.kill(os.getpid(), signal.SIGINT)
        return TrainResult(b.step + 1, 0.01)


def make(ctx):
    return Stopping()
"""


def test_an_interrupted_probe_resumes_and_trains_what_a_whole_one_would(tmp_path, monkeypatch):
    # Before: "interrupted by SIGINT; nothing was written" with no next step, and no --resume:
    # the only way on was --overwrite, generating every response again.
    (tmp_path / "probe_stop_mod.py").write_text(STOPPING)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(__import__("sys").modules, "probe_stop_mod", raising=False)
    data = write_prompts(tmp_path / "p.jsonl", 400)
    trainer = ["--trainer", "probe_stop_mod:make", "--global-batch", "16", "--seed", "3"]
    log, out = tmp_path / "L", tmp_path / "P"
    res = probe(*_sim(data, log, out, *trainer))
    assert res.exit_code == 130 and len(res.output.strip().splitlines()) == 1, res.output
    assert f"the probe's run log {log} keeps every committed sample" in res.output and "--resume" in res.output
    assert json.loads((log / "meta.json").read_text())["status"] == "interrupted" and not out.exists()
    refused = probe(*_sim(data, log, out, *trainer))  # without --resume: the way on is named
    assert refused.exit_code == 2 and "pass --resume to finish the probe it holds" in refused.output
    assert "contradict" in probe(*_sim(data, log, out, *trainer, "--resume", "--overwrite")).output
    monkeypatch.setenv("PROBE_GO_ON", "1")
    res = probe(*_sim(data, log, out, *trainer, "--resume"))
    assert res.exit_code == 0, res.output
    whole = probe(*_sim(data, tmp_path / "L0", tmp_path / "P0", *trainer))
    assert whole.exit_code == 0, whole.output
    for f in sorted(p.name for p in (tmp_path / "P0").iterdir()):
        assert (out / f).read_bytes() == (tmp_path / "P0" / f).read_bytes(), f
    (log / "plan.parquet").unlink()  # as a kill -9 leaves a log: no plan inside
    before = {f: f.read_bytes() for f in log.rglob("*") if f.is_file()}
    other = probe(*_sim(data, log, out, *trainer, "--resume", "--prompts", "120"))  # another sample: refused
    assert other.exit_code != 0 and "--resume" in other.output and len(other.output.strip().splitlines()) == 1
    # The refused probe's plan is not put beside samples of another plan.
    assert {f: f.read_bytes() for f in log.rglob("*") if f.is_file()} == before
    missing = probe(*_sim(data, tmp_path / "none", out, *trainer, "--resume"))
    assert missing.exit_code == 2 and "no probe run log to resume there" in missing.output


def test_an_interrupted_probe_leaves_a_log_to_train_from(tmp_path, monkeypatch):
    # Interrupted during its run, a probe left a log without its plan: 'aspc predict train LOG'
    # then asked for --plan, a plan that was never written anywhere.
    import signal

    import aspc.runtime
    from aspc.errors import Interrupted

    real = aspc.runtime.run

    def interrupted(*args, **kwargs):
        real(*args, **kwargs)  # the log as a signal would leave it once the run committed its samples
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(aspc.runtime, "run", interrupted)
    data = write_prompts(tmp_path / "p.jsonl", 120)
    log, out = tmp_path / "L", tmp_path / "P"
    res = probe(*_sim(data, log, out))
    assert res.exit_code == 130 and f"{log / 'plan.parquet'}" in res.output, res.output
    assert not out.exists()
    monkeypatch.undo()
    res = CliRunner().invoke(main, ["predict", "train", str(log), "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output


def test_a_probe_interrupted_while_training_names_the_command_that_finishes_it(tmp_path, monkeypatch):
    # A signal during the training step printed only what was written; probing again was refused
    # (the log is not empty) and --overwrite would generate everything again. And the advice a
    # failed training gave left --seed out, so following it trained another predictor.
    import shlex
    import signal

    import aspc.cli.predict as predict_cli
    from aspc.errors import Interrupted

    data = write_prompts(tmp_path / "p.jsonl", 120)
    whole = probe(*_sim(data, tmp_path / "L0", tmp_path / "P0", "--seed", "7"))
    assert whole.exit_code == 0, whole.output

    def stopped(*a, **kw):
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(predict_cli, "train_from_pairs", stopped)
    log, out = tmp_path / "L", tmp_path / "P"
    res = probe(*_sim(data, log, out, "--seed", "7"))
    assert res.exit_code == 130 and "interrupted by SIGINT while training" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and not out.exists()
    again = res.output.split("train from it with '")[1].rstrip().rstrip("'")
    monkeypatch.undo()
    args = shlex.split(again)
    assert args[:3] == ["aspc", "predict", "train"] and "--seed" in args
    done = CliRunner().invoke(main, [*args[1:], "-q"])
    assert done.exit_code == 0, done.output
    for f in sorted(p.name for p in (tmp_path / "P0").iterdir()):
        assert (out / f).read_bytes() == (tmp_path / "P0" / f).read_bytes(), f


def test_rows_skipped_under_on_bad_line_skip_are_reported(tmp_path):
    # The help promises "skip it and report it": probe dropped the row without a word.
    data = write_prompts(tmp_path / "p.jsonl", 120)
    rows = data.read_text().splitlines()
    bad = json.loads(rows[0])
    bad["prompt"] = ""
    (tmp_path / "bad.jsonl").write_text("\n".join([json.dumps(bad), *rows[1:]]) + "\n")
    res = CliRunner().invoke(main, ["probe", str(tmp_path / "bad.jsonl"), "--backend", "sim", "--actual-lengths",
                                    str(data), "--length-field", "lengths", "--prompts", "100", "--log",
                                    str(tmp_path / "L"), "-o", str(tmp_path / "P"), "--on-bad-line", "skip", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "skipped 1 bad rows (--on-bad-line skip): lines 1" in " ".join(res.stderr.split())
    out = json.loads(res.stdout)
    assert out["n_skipped"] == 1 and out["skipped_rows"] == [{"line": 1, "reason": "prompt is empty"}]
