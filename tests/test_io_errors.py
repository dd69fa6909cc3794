"""An error the system reports while reading or writing a file the user named (a failing disk or network mount:
EIO, ESTALE, ...) is one ``Error:`` line naming the file, exit 2, never a traceback.

Was: only a handful of errnos had a line; any other fell through the shared handler as a traceback.
"""

from __future__ import annotations

import errno
import os
import pathlib

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aspc.cli import main as cli
from tests.conftest import write_jsonl


def _failing(code: int):
    def fail(self_or_path, *args, **kwargs):
        path = getattr(self_or_path, "__fspath__", lambda: str(self_or_path))()
        raise OSError(code, os.strerror(code), path)

    return fail


def _one_line(res) -> str:
    assert res.exception is None or isinstance(res.exception, SystemExit), f"traceback: {res.exception!r}"
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    return lines[0]


@pytest.mark.parametrize("code", [errno.EIO, errno.ESTALE, errno.ENXIO])
def test_an_input_that_fails_to_read_is_one_line_naming_it(tmp_path, monkeypatch, code):
    src = tmp_path / "in.jsonl"
    write_jsonl(src, [{"prompt": "a", "len": 3}, {"prompt": "b", "len": 5}])
    out = tmp_path / "plan.parquet"
    monkeypatch.setattr(pathlib.Path, "read_bytes", _failing(code))
    line = _one_line(CliRunner().invoke(cli, ["compile", str(src), "--length-field", "len", "-o", str(out), "-q"]))
    assert "in.jsonl" in line and os.strerror(code) in line and "device" in line
    assert not out.exists()


def test_a_plan_that_fails_to_read_is_one_line_naming_it(tmp_path, monkeypatch):
    src = tmp_path / "in.jsonl"
    write_jsonl(src, [{"prompt": "a", "len": 3}, {"prompt": "b", "len": 5}])
    plan = tmp_path / "plan.parquet"
    assert CliRunner().invoke(cli, ["compile", str(src), "--length-field", "len", "-o", str(plan), "-q"]).exit_code == 0

    def fail(path, *args, **kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    monkeypatch.setattr(pq, "ParquetFile", fail)
    line = _one_line(CliRunner().invoke(cli, ["check", str(plan)]))
    assert "plan.parquet" in line and "Input/output error" in line


def test_an_error_naming_no_file_still_shows_its_traceback(tmp_path, monkeypatch):
    # Not about a file the user named: aspc cannot say what to fix, and a traceback is what a bug report needs.
    src = tmp_path / "in.jsonl"
    write_jsonl(src, [{"prompt": "a", "len": 3}])

    def fail(*args, **kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(pathlib.Path, "read_bytes", fail)
    res = CliRunner().invoke(cli, ["compile", str(src), "--length-field", "len", "-o", str(tmp_path / "p.parquet")])
    assert isinstance(res.exception, OSError)


def test_an_error_not_about_the_named_files_device_keeps_its_traceback(tmp_path, monkeypatch):
    # Found in review: under `ulimit -n 7` a lazy import's EMFILE named aspc's own module and was worded as
    # that file's device failing. Only device and mount errnos get the one line.
    src = tmp_path / "in.jsonl"
    write_jsonl(src, [{"prompt": "a", "len": 3}])
    monkeypatch.setattr(pathlib.Path, "read_bytes", _failing(errno.EMFILE))
    res = CliRunner().invoke(cli, ["compile", str(src), "--length-field", "len", "-o", str(tmp_path / "p.parquet")])
    assert isinstance(res.exception, OSError) and res.exception.errno == errno.EMFILE
