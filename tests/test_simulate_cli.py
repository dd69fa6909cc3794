"""``aspc simulate`` through click's CliRunner: bad rows, caps, options that do not apply, output."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from aspc.cli import main
from tests.conftest import lognormal_records, write_jsonl

BASE = ["--length-field", "lengths", "--workers", "4", "--global-batch", "16"]


def _sim(path, *args):
    return CliRunner().invoke(main, ["simulate", str(path), *BASE, *[str(a) for a in args]])


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("bad", [[-5, 10], [], [float("nan")], None, [10**12]])
def test_skip_drops_a_row_with_a_bad_length_as_compile_does(tmp_path, bad):
    # The prompt read (no length field) kept the row and the lengths read dropped it: "1 of 119 plan
    # prompts have no length", exit 2, where compile --on-bad-line skip skipped the row.
    recs = lognormal_records(120)
    recs[3]["lengths"] = bad
    data = write_jsonl(tmp_path / "bad.jsonl", recs)
    r = _sim(data, "--strategies", "random,asp,oracle", "--on-bad-line", "skip", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)["strategies"]
    assert all(s["samples_planned"] == 119 for s in out.values()), {k: v["samples_planned"] for k, v in out.items()}


def test_skip_reports_the_rows_it_left_out(tmp_path):
    # A duplicate id and a bad length were dropped without a word: no note, no --json key.
    recs = lognormal_records(120)
    recs[5]["id"] = recs[4]["id"]
    recs[9]["lengths"] = [-5, 10]
    data = write_jsonl(tmp_path / "bad.jsonl", recs)
    r = _sim(data, "--strategies", "random,asp", "--on-bad-line", "skip")
    assert r.exit_code == 0, r.output
    assert "skipped 2 bad rows (--on-bad-line skip): lines 6, 10" in _flat(r.stderr), r.stderr
    r = _sim(data, "--strategies", "random,asp", "--on-bad-line", "skip", "--json")
    got = json.loads(r.stdout)
    assert got["n_skipped"] == 2 and [s["line"] for s in got["skipped_rows"]] == [6, 10], got.keys()
    assert "duplicate prompt id" in got["skipped_rows"][0]["reason"]
    clean = json.loads(_sim(write_jsonl(tmp_path / "ok.jsonl", lognormal_records(120)), "--json").stdout)
    assert clean["n_skipped"] == 0 and "skipped_rows" not in clean


def test_max_response_length_stops_the_simulated_responses_too(tmp_path):
    # It capped the plans only: random's replayed responses kept their recorded lengths, its time as uncapped.
    data = write_jsonl(tmp_path / "d.jsonl", lognormal_records(120))

    def times(*extra):
        r = _sim(data, "--strategies", "random,asp", "--json", *extra)
        assert r.exit_code == 0, r.output
        return {k: v["mean_iteration_time"] for k, v in json.loads(r.stdout)["strategies"].items()}

    capped = times("--max-response-length", "50")
    assert capped["random"] < 0.8 * times()["random"]
    assert capped == times("--max-new-tokens", "50") == times("--max-new-tokens", "50", "--max-response-length", "50")
    r = _sim(data, "--max-response-length", "50", "--max-new-tokens", "60")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.output.startswith("Error: --max-response-length 50 and --max-new-tokens 60 both cap") and r.output.count("\n") == 1


@pytest.mark.parametrize(
    "text, words",
    [
        ('{"decode_base": 1' + "0" * 5000 + "}", "decode_base must be <= 1e+06 seconds, got a 5,001-digit integer"),
        ("[" * 100000, "JSON nested too deeply"),
        ('{"decode_base": 0.01, "decode_base": 5}', "key 'decode_base' is given twice"),
    ],
)
def test_a_malformed_cost_model_file_is_one_line(tmp_path, text, words):
    # A ValueError (Python's 4,300-digit limit) and a RecursionError were tracebacks; a repeated key kept the last.
    cost = tmp_path / "cost.json"
    cost.write_text(text)
    r = _sim(write_jsonl(tmp_path / "d.jsonl", lognormal_records(40)), "--strategies", "random", "--sim-cost-model", cost)
    assert r.exit_code == 2, r.exception  # an uncaught exception exits 1
    assert r.output.count("\n") == 1 and r.output.startswith("Error: cost.json: ") and words in r.output, r.output


def test_asp_options_are_noted_when_no_asp_strategy_runs(tmp_path):
    # Byte-identical --json with and without them, and not a word: as compile --strategy random, a note.
    data = write_jsonl(tmp_path / "d.jsonl", lognormal_records(60))
    extra = ["--order", "interleave", "--slack", "2", "--minibatch-overhead", "3", "--anneal-iterations", "7"]
    r = _sim(data, "--strategies", "random,sorted", *extra)
    assert r.exit_code == 0, r.output
    assert ("--slack, --minibatch-overhead, --anneal-iterations, --order: --strategies random,sorted each cut "
            "fixed-size minibatches in its own order, so they are not used") in _flat(r.stderr), r.stderr  # fmt: skip
    r = _sim(data, "--strategies", "random,asp", "--slack", "2", "--anneal-iterations", "7")
    assert r.exit_code == 0 and "not used" not in r.stderr, r.stderr  # asp reads them
    r = _sim(data, "--strategies", "random,asp", "--slack", "2", "--order", "ascending")
    assert "--slack: --order ascending cuts equal minibatches" in _flat(r.stderr), r.stderr
    # A bound chooses that order without --order: the note named an option the user never gave.
    r = _sim(data, "--strategies", "random,asp", "--slack", "2", "--max-staleness", "2")
    assert "--slack: under --max-staleness 2 asp plans with --order ascending, which cuts" in _flat(r.stderr), r.stderr


def test_quiet_prints_the_table_and_no_diagnostics(tmp_path):
    # -q printed nothing at all: the table is the command's only result; --quiet drops bars and diagnostics.
    data = write_jsonl(tmp_path / "d.jsonl", lognormal_records(60))
    loud = _sim(data, "--strategies", "random,sorted", "--slack", "2")
    quiet = _sim(data, "--strategies", "random,sorted", "--slack", "2", "-q")
    assert loud.exit_code == quiet.exit_code == 0, quiet.output
    assert "mean iter s" in quiet.stdout and quiet.stdout == loud.stdout
    assert "not used" in loud.stderr and quiet.stderr == ""


def test_the_bounded_order_note_only_when_asp_is_simulated(tmp_path):
    # "asp planned for --max-staleness 2" was printed beside a table with no asp in it.
    data = write_jsonl(tmp_path / "d.jsonl", lognormal_records(60))
    r = _sim(data, "--strategies", "random,sorted", "--max-staleness", "2")
    assert r.exit_code == 0 and "asp planned" not in r.stderr, r.stderr
    r = _sim(data, "--strategies", "random,oracle", "--max-staleness", "2")
    assert r.exit_code == 0 and "asp planned for --max-staleness 2" in _flat(r.stderr), r.stderr
