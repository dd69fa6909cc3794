"""Output paths a tester found unsafe: the current directory, names that are not UTF-8, parents left by a
failed write, and a plan written over a dataset of another format."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aspc.errors import OutputError
from tests.conftest import EXAMPLE, invoke_cli, one_line_error

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib (the 'report' extra) is not installed"
)
BAD = "\udcff"  # the byte 0xff in a file name, as Python spells it (surrogateescape)


def _rows(path: str | os.PathLike) -> int:
    with pa.OSFile(os.fsencode(path)) as fh:
        return pq.read_table(fh).num_rows


@needs_matplotlib
def test_report_into_the_current_directory_or_its_parent_is_refused(plan, tmp_path, monkeypatch):
    # -o . renamed the literal '.' aside: a traceback (EBUSY); the absolute path swapped the shell's directory.
    here = tmp_path / "here"
    (here / "sub").mkdir(parents=True)
    monkeypatch.chdir(here / "sub")
    for out, what in ((".", "the current directory"), (str(here / "sub"), "the current directory"),
                      ("..", "a directory holding the current directory")):  # fmt: skip
        line = one_line_error(invoke_cli("report", plan, "-o", out, "-q"), 2)
        assert line == f"Error: -o {out}: {what} cannot be replaced; name a new directory, e.g. -o out/"
    assert sorted(p.name for p in here.iterdir()) == ["sub"] and not any((here / "sub").iterdir())


def test_predict_train_into_the_current_directory_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke_cli("predict", "train", EXAMPLE, "--length-field", "lengths", "--kind", "lexical", "-o", ".", "-q")
    assert "-o .: the current directory cannot be replaced" in one_line_error(r, 2)
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_refuses_the_current_directory(tmp_path, monkeypatch):
    from aspc.atomic import atomic_dir

    monkeypatch.chdir(tmp_path)
    for target in (".", tmp_path, tmp_path.parent):
        with pytest.raises(OutputError, match="cannot be replaced"), atomic_dir(target):
            pytest.fail("the block ran")
    assert list(tmp_path.iterdir()) == []


@needs_matplotlib
def test_outputs_named_with_bytes_that_are_not_utf8_are_written(plan, tmp_path):
    # _stem encoded the name as UTF-8: a traceback (surrogates not allowed) before anything was written.
    d = tmp_path / f"d{BAD}"
    out = tmp_path / f"bad{BAD}.parquet"
    assert invoke_cli("compile", EXAMPLE, "--length-field", "lengths", "-o", out, "-q").exit_code == 0
    assert _rows(out) == 600
    nested = d / "sub" / "plan.parquet"  # a directory so named too: pyarrow is given no path it cannot encode
    assert invoke_cli("compile", EXAMPLE, "--length-field", "lengths", "-o", nested, "-q").exit_code == 0
    assert _rows(nested) == 600
    exported = tmp_path / f"e{BAD}.parquet"
    assert invoke_cli("export", plan, "-o", exported, "-q").exit_code == 0
    assert _rows(exported) == 120
    for rep in (tmp_path / f"r{BAD}", d / "rep"):
        assert invoke_cli("report", plan, "-o", rep, "-q").exit_code == 0
        assert (rep / "index.html").is_file()
    names = [os.fsencode(p.name) for p in (*tmp_path.iterdir(), *d.iterdir())]
    assert not [n for n in names if n.startswith(b".")]  # no temporary left


def test_stale_temps_of_a_name_that_is_not_utf8_are_found(tmp_path):
    from aspc.atomic import atomic_write_bytes, remove_stale_temps

    target = tmp_path / f"x{BAD}.bin"
    atomic_write_bytes(target, b"data")
    assert target.read_bytes() == b"data" and remove_stale_temps(target) == []


def test_a_parquet_input_named_with_bytes_that_are_not_utf8_is_read(tmp_path):
    # read_parquet_table gave pyarrow the str path, which it encodes as UTF-8: "not a readable Parquet file".
    src = tmp_path / f"in{BAD}.parquet"
    table = pa.table({"id": [f"p{i}" for i in range(40)], "prompt": [f"prompt {i}" for i in range(40)],
                      "lengths": [[i + 1, i + 2] for i in range(40)]})  # fmt: skip
    with pa.OSFile(os.fsencode(src), "wb") as fh:
        pq.write_table(table, fh)
    out = tmp_path / "plan.parquet"
    r = invoke_cli("compile", src, "--length-field", "lengths", "-o", out, "-q")
    assert r.exit_code == 0, r.output
    assert _rows(out) == 40


def test_a_failed_write_removes_the_parent_directories_it_made(tmp_path):
    from aspc.atomic import atomic_dir, atomic_path

    (tmp_path / "kept").mkdir()
    for writer, target in ((atomic_path, tmp_path / "kept/a/b/c/plan.parquet"), (atomic_dir, tmp_path / "kept/r/s/rep")):
        with pytest.raises(RuntimeError), writer(target) as tmp:
            assert tmp.parent.is_dir()
            raise RuntimeError("the write failed")
        assert [p.name for p in tmp_path.iterdir()] == ["kept"] and list((tmp_path / "kept").iterdir()) == []
    # A directory that appeared meanwhile with a file in it is someone's: it stays.
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "kept/a/b/plan.parquet"):
        (tmp_path / "kept/a/theirs.txt").write_text("x")
        raise RuntimeError("the write failed")
    assert sorted(p.name for p in (tmp_path / "kept/a").iterdir()) == ["theirs.txt"]


@pytest.fixture
def tiny_fs(tmp_path):
    """A 100 KiB tmpfs (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100k", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield small
    finally:
        subprocess.run(["umount", str(small)], check=False)


@needs_matplotlib
def test_a_full_disk_leaves_no_new_parent_directories(tiny_fs, plan):
    out = tiny_fs / "a/b/c/plan.parquet"
    r = invoke_cli("compile", EXAMPLE, "--length-field", "lengths", "-o", out, "-q")
    assert one_line_error(r, 2) == f"Error: no space left on the device holding {out}; free space or write elsewhere"
    r = invoke_cli("report", plan, "-o", tiny_fs / "r/s/rep", "-q")
    assert "no space left on the device holding" in one_line_error(r, 2)
    assert list(tiny_fs.iterdir()) == []


@pytest.mark.parametrize("name", ["other.jsonl", "other.CSV", "other.json", "other.txt", "other.jsonl.gz"])
def test_a_plan_named_as_another_data_format_is_refused(tmp_path, name):
    # A plan compiled to other.jsonl replaced the user's JSONL file with Parquet (exit 0).
    out = tmp_path / name
    out.write_text('{"id": "x"}\n')
    r = invoke_cli("compile", EXAMPLE, "--length-field", "lengths", "-o", out, "-q")
    suffix = Path(name).suffix
    assert one_line_error(r, 2) == (f"Error: -o {out}: a plan is Parquet, not {suffix} data; name it .parquet, "
                                    f"e.g. -o {out.with_suffix('.parquet')}")  # fmt: skip
    assert out.read_text() == '{"id": "x"}\n'


@needs_matplotlib  # without matplotlib, report refuses with the install hint before it looks at -o
@pytest.mark.parametrize("name", ["rep.parquet", "report.html", "r.JSON"])
def test_a_new_report_directory_named_as_a_file_is_refused(plan, tmp_path, name):
    out = tmp_path / name
    r = invoke_cli("report", plan, "-o", out, "-q")
    line = one_line_error(r, 2)
    assert line.startswith(f"Error: -o {name}: a report is a directory (index.html and its figures), not a ")
    assert line.endswith(f"name a directory, e.g. -o {Path(name).stem}/") and not out.exists()


def test_a_run_log_in_the_current_directory_is_still_written(plan, tmp_path, monkeypatch):
    # A run log is written in place (never renamed aside): --log . in an empty folder is fine, as before.
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    r = invoke_cli("run", plan, "--log", ".", "-q")
    assert r.exit_code == 0, r.output
    assert (here / "meta.json").is_file()
