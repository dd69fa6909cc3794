"""The compile/check/inspect commands through click's CliRunner."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from aspc.cli import main
from tests.conftest import write_jsonl

CONTRACT = ["--length-field", "lengths", "--batch-size", "16", "--slack", "4", "--group-size", "8", "--seed", "0"]


def _run(args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_user_text_is_printed_as_written(tmp_path):
    # A file name or a plan's stored value is user text; rich read '[...]' in it as markup:
    # inspect raised MarkupError (a traceback) on a plan compiled with --id-field '[/]', and
    # showed 'p[red]x.parquet' as 'px.parquet'.
    recs = [{"[/]": f"id{i}", "prompt": f"p {i}", "lengths": [i + 1]} for i in range(20)]
    data = write_jsonl(tmp_path / "f.jsonl", recs)
    plan = tmp_path / "p[red]x.parquet"
    assert _run(["compile", data, "--length-field", "lengths", "--id-field", "[/]", "-o", plan, "-q"]).exit_code == 0
    for cmd in (["inspect", plan], ["check", plan]):
        r = _run(cmd)
        assert r.exit_code == 0, r.output
        assert "p[red]x.parquet" in r.output
    assert "[/]" in _run(["inspect", plan]).output


def test_compile_check_inspect_contract(tmp_path, dataset):
    plan = tmp_path / "plan.parquet"
    r = _run(["compile", dataset, *CONTRACT, "-o", plan, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["n_prompts"] == 400
    r = _run(["check", plan, "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    for key in ("padding_ratio", "group_imbalance", "delivery_drift", "n_prompts", "n_minibatches", "n_groups", "ok"):
        assert key in got
    assert got["ok"] is True and got["n_prompts"] == 400
    r = _run(["inspect", plan, "--json"])
    assert r.exit_code == 0
    info = json.loads(r.stdout)
    assert len(info["group_loads"]) == got["n_groups"]
    assert sum(int(k) * v for k, v in info["minibatch_size_histogram"].items()) == 400
    r = _run(["compile", dataset, "--length-field", "lengths", "--strategy", "random", "-o", tmp_path / "r.parquet"])
    assert r.exit_code == 0, r.output
    assert "padding_ratio" in r.stdout


def test_check_bounds_exit_codes(tmp_path, dataset):
    plan = tmp_path / "plan.parquet"
    assert _run(["compile", dataset, "--length-field", "lengths", "--strategy", "sorted", "-o", plan]).exit_code == 0
    r = _run(["check", plan, "--max-drift", "0.01", "--json"])
    assert r.exit_code == 1
    got = json.loads(r.stdout)
    assert got["ok"] is False and "delivery_drift" in got["violations"][0]
    r = _run(["check", tmp_path / "missing.parquet"])
    assert r.exit_code == 2
    assert "Traceback" not in r.output


@pytest.mark.parametrize(
    "lines, extra, fragment",
    [
        (['{"id": "a", "prompt": "x", "lengths": 3}', "{broken"], [], "line 2"),
        (['{"id": "a", "prompt": "x", "lengths": -3}'], [], "negative"),
        (['{"id": "a", "prompt": "x", "lengths": 3}'] * 2, [], "duplicate"),
        (['{"id": "a", "prompt": "x", "lengths": 3}'], ["--batch-size", "0"], "batch-size"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, lines, extra, fragment):
    src = write_jsonl(tmp_path / "bad.jsonl", lines)
    out = tmp_path / "plan.parquet"
    r = _run(["compile", src, "--length-field", "lengths", *extra, "-o", out])
    assert r.exit_code != 0
    assert fragment in r.output
    assert "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [src]


def test_skip_mode_reports(tmp_path):
    src = write_jsonl(
        tmp_path / "m.jsonl",
        [{"id": f"p{i}", "prompt": "x", "lengths": i + 1} for i in range(40)] + ["{bad"],
    )
    r = _run(["compile", src, "--length-field", "lengths", "--on-bad-line", "skip", "-o", tmp_path / "p.parquet", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["n_skipped"] == 1


def test_every_command_has_help():
    runner = CliRunner()
    r = runner.invoke(main, ["--help"])
    assert r.exit_code == 0
    ctx = main.make_context("aspc", ["--help"], resilient_parsing=True)
    names = main.list_commands(ctx)
    assert {"compile", "check", "inspect"} <= set(names)
    for name in names:
        cmd = main.get_command(ctx, name)
        assert cmd is not None and (cmd.help or "").strip(), f"{name} has no help text"
        r = runner.invoke(main, [name, "--help"])
        assert r.exit_code == 0, (name, r.output)
        assert "Usage" in r.output


_EXIT_PROG = """
import atexit, sys
from pathlib import Path
marks = Path(sys.argv[1])
atexit.register(lambda: (marks / "atexit").write_text("ran"))
thp = [ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("THP_enabled:")] if sys.platform == "linux" else []
if thp:  # inherited from a test process whose in-process compile turned huge pages off
    import ctypes

    ctypes.CDLL(None).prctl(41, 0, 0, 0, 0)
atexit.register(lambda: (marks / "thp").write_text("".join(thp_now())))


def thp_now():
    return [ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("THP_enabled:")] if thp else []


class _Teardown:  # freed with this module's globals, in the interpreter's teardown
    def __del__(self):
        (marks / "teardown").write_text("ran")


_keep = _Teardown()
sys.argv = ["aspc", *sys.argv[2:]]
from aspc.cli import main
main()
"""


@pytest.mark.parametrize(
    ("command", "lean", "thp"), [("compile", True, "0"), ("predict", False, "0"), ("eval", False, "1")]
)
def test_offline_commands_end_without_the_interpreters_teardown(tmp_path, dataset, command, lean, thp):
    # compile (a lean command) ends with os._exit after the atexit hooks: the JSON on a pipe is
    # whole, hooks such as coverage's still run, and the heap's teardown is skipped. compile and
    # predict ran on small pages (aspc.memory.small_pages_only), where the kernel reports it.
    out = tmp_path / "out.parquet"
    args = {
        "compile": ["compile", str(dataset), "--length-field", "lengths", "-o", str(out), "--json"],
        "predict": ["predict", "default", str(dataset), "-o", str(out), "--json"],
        "eval": ["predict", "eval", "default", str(dataset), "--length-field", "lengths", "--json"],
    }[command]
    res = subprocess.run([sys.executable, "-c", _EXIT_PROG, str(tmp_path), *args], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    json.loads(res.stdout)
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "teardown").exists() is not lean
    assert out.exists() is (command != "eval")
    assert (tmp_path / "thp").read_text() in (thp, "")


def test_a_failing_lean_command_keeps_its_exit_code(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    res = subprocess.run(
        [sys.executable, "-c", _EXIT_PROG, str(tmp_path), "compile", str(bad), "-o", str(tmp_path / "p.parquet")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert (tmp_path / "atexit").exists() and not (tmp_path / "p.parquet").exists()


def test_simulate_says_when_the_global_batch_is_more_than_the_plans_samples(tmp_path):
    # A table of '-' (no trainer step) came with no word; aspc run says it.
    recs = [{"id": f"p{i}", "prompt": f"q {i}", "lengths": [i + 1]} for i in range(40)]
    data = write_jsonl(tmp_path / "d.jsonl", recs)
    r = _run(["simulate", data, "--length-field", "lengths", "--strategies", "asp,random", "--global-batch", "41"])
    assert r.exit_code == 0 and "--global-batch 41 is more than the plans' 40 samples" in " ".join(r.output.split())
    r = _run(["simulate", data, "--length-field", "lengths", "--strategies", "asp,random", "--global-batch", "40"])
    assert r.exit_code == 0 and "is more than" not in r.output


def test_simulate_says_when_samples_are_left_over_and_which_batch_consumes_them(tmp_path):
    # The iteration times end at the last trainer step: generation no step consumes is left out, which
    # flattered a strategy that dispatched its longest work last (the demo: asp 0.820 with 192 of
    # 4,800 samples left over, 0.893 with a global batch that divides the plan). Nothing said so.
    recs = [{"id": f"p{i}", "prompt": f"q {i}", "lengths": [i + 1]} for i in range(40)]
    data = write_jsonl(tmp_path / "d.jsonl", recs)
    r = _run(["simulate", data, "--length-field", "lengths", "--strategies", "asp,random", "--global-batch", "12"])
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and "4 of the plans' 40 samples are generated but no trainer step consumes them" in text
    assert "--global-batch 10 consumes all of them" in text
    r = _run(["simulate", data, "--length-field", "lengths", "--strategies", "asp,random", "--global-batch", "10"])
    assert r.exit_code == 0 and "no trainer step consumes" not in r.output


def test_skipped_rows_are_named_with_their_lines_and_reasons(tmp_path):
    # --on-bad-line skip said only "skipped 2 bad rows": which ones, and why, was left to find.
    data = tmp_path / "d.jsonl"
    data.write_text('{"id":"a","prompt":"x","lengths":[3]}\n{"id":"b","prompt":"y","lengths":[-1]}\nnot json\n'
                    '{"id":"c","prompt":"z","lengths":[4]}\n\n{"id":"e"}\n')  # fmt: skip
    args = ["compile", data, "--length-field", "lengths", "--on-bad-line", "skip", "-o", tmp_path / "p.parquet"]
    r = _run([*args, "-q"])
    assert r.exit_code == 0 and r.output == ""
    r = _run(args)
    said = " ".join(r.output.split())
    assert "skipped 3 bad rows (--on-bad-line skip): lines 2, 3, 6; line 2: length field 'lengths' is negative" in said
    r = _run([*args, "--json"])
    got = json.loads(r.stdout)
    assert got["n_skipped"] == 3 and [s["line"] for s in got["skipped_rows"]] == [2, 3, 6]
    assert "malformed JSON" in got["skipped_rows"][1]["reason"] and "prompt" in got["skipped_rows"][2]["reason"]


def test_a_history_that_matches_no_prompt_says_so(tmp_path):
    # Its lengths keyed by other ids, a history changed nothing, and nothing said so.
    recs = [{"id": f"p{i}", "prompt": f"q {i}"} for i in range(40)]
    data = write_jsonl(tmp_path / "d.jsonl", recs)
    other = write_jsonl(tmp_path / "h.jsonl", [{"id": "zzz", "length": 5}])
    same = write_jsonl(tmp_path / "s.jsonl", [{"id": "p3", "length": 5}])
    r = _run(["compile", data, "--history", other, "-o", tmp_path / "a.parquet"])
    assert r.exit_code == 0 and "none of the input's prompt ids has observed lengths" in " ".join(r.output.split())
    r = _run(["compile", data, "--history", same, "-o", tmp_path / "b.parquet"])
    assert r.exit_code == 0 and "none of the input's" not in r.output


def test_history_options_that_would_be_ignored_or_double_counted_are_refused(tmp_path):
    # A run log's lengths are its own: --history-length-field was ignored silently; a source given twice
    # counted as two epochs of the same observations.
    recs = [{"id": f"p{i}", "prompt": f"q {i}", "lengths": [3 + i % 7]} for i in range(40)]
    data = write_jsonl(tmp_path / "d.jsonl", recs)
    plan = tmp_path / "p.parquet"
    assert _run(["compile", data, "--length-field", "lengths", "-o", plan]).exit_code == 0
    assert _run(["run", plan, "--log", tmp_path / "RUN", "-q"]).exit_code == 0
    out = tmp_path / "o.parquet"
    r = _run(["compile", data, "--history", tmp_path / "RUN", "--history-length-field", "nope", "-o", out])
    assert r.exit_code == 2 and "run logs and verl rollout directories carry their own lengths" in r.output
    r = _run(["compile", data, "--history", tmp_path / "RUN", "--history", str(tmp_path / "RUN") + "/", "-o", out])
    assert r.exit_code == 2 and "is given twice" in r.output and not out.exists()
    assert _run(["compile", data, "--history", tmp_path / "RUN", "-o", out]).exit_code == 0


def test_a_plan_given_as_observed_lengths_is_named_as_a_plan(tmp_path):
    # "--history epoch-1.parquet": "line 1: missing id field 'id'" said nothing of passing a plan.
    recs = [{"id": f"p{i}", "prompt": f"q {i}", "lengths": [3 + i % 7]} for i in range(40)]
    data = write_jsonl(tmp_path / "d.jsonl", recs)
    plan = tmp_path / "p.parquet"
    assert _run(["compile", data, "--length-field", "lengths", "-o", plan]).exit_code == 0
    for args in (["compile", data, "--history", plan, "-o", tmp_path / "o.parquet"],
                 ["run", plan, "--actual-lengths", plan]):  # fmt: skip
        r = _run(args)
        assert r.exit_code == 2 and "p.parquet: an aspc plan, which holds predicted lengths" in r.output, r.output


def test_the_left_over_note_counts_and_totals_one_plan_and_never_suggests_the_batch_in_use():
    # A rolling scout's plan holds its kept responses too (4,808 samples against 4,800): the note said
    # "8 of the plans' 4800 samples" and "--global-batch 240 consumes all of them" at --global-batch 240.
    from types import SimpleNamespace

    from aspc.simulate_compare import left_over_note

    def res(planned, left):
        return SimpleNamespace(summary=SimpleNamespace(samples_planned=planned, samples_left_over=left,
                                                       samples_consumed=planned - left))

    note = left_over_note({"random": res(4800, 0), "asp+scout+roll": [res(4808, 8)]}, 240)
    assert note.startswith("8 of asp+scout+roll's 4808 samples") and "consumes all of them" not in note, note
    note = left_over_note({"random": res(4800, 192), "asp": res(4800, 192)}, 256)
    assert note.startswith("192 of the plans' 4800 samples") and note.endswith("--global-batch 240 consumes all of them")
    assert left_over_note({"random": res(4800, 0)}, 240) is None
    # Repeats keep different numbers of scout responses: the note reads every repeat, not the first.
    note = left_over_note({"random": [res(4800, 0), res(4800, 0)], "asp+scout+roll": [res(4800, 0), res(4807, 7)]}, 240)
    assert note.startswith("7 of asp+scout+roll's 4807 samples") and "consumes all of them" not in note, note
