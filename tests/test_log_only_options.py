"""Options that only shape a run log (--overwrite, --log-flush-seconds) refused without --log; --resume of no log said."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.errors import ConfigError
from aspc.runtime import run
from tests.conftest import lognormal_records, write_jsonl


@pytest.fixture
def plan(tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", lognormal_records(40))
    out = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "-b", "4", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--overwrite"], "--overwrite replaces a run log: pass its --log directory, or drop --overwrite"),
        (["--log-flush-seconds", "3"], "--log-flush-seconds sets how often the run log commits: pass --log RUN"),
        # Its default value given again is still a request the run would not honour.
        (["--log-flush-seconds", "10"], "--log-flush-seconds sets how often the run log commits"),
    ],
)
def test_log_options_without_a_log_are_refused(plan, tmp_path, monkeypatch, args, fragment):
    # Before: exit 0, the option silently ignored.
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["run", str(plan), "-q", *args])
    assert r.exit_code == 2 and fragment in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_the_api_refuses_overwrite_without_a_log(plan):
    from aspc.emit import read_plan

    with pytest.raises(ConfigError, match="--overwrite replaces a run log"):
        run(read_plan(plan), overwrite=True)


def test_resume_of_a_missing_log_says_it_starts_one(plan, tmp_path):
    # A restart script passes --resume from its first run on, so a missing log starts one; a mistyped
    # path did the same without a word.
    log = tmp_path / "TYPO"
    r = CliRunner().invoke(main, ["run", str(plan), "--log", str(log), "--resume"])
    assert r.exit_code == 0, r.output
    assert f"--resume: no run log at {log} yet; this run starts one there" in " ".join(r.output.split())
    assert (log / "meta.json").is_file()
    again = CliRunner().invoke(main, ["run", str(plan), "--log", str(log), "--resume"])
    assert again.exit_code == 0 and "no run log at" not in again.output, again.output
