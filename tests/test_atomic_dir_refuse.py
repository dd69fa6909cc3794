"""A directory output re-checks the earlier directory as it replaces it (a hunt of 2026-12-07).

The output directory was checked once before the work (training, drawing: seconds to minutes) and
then replaced whole: a file put into it meanwhile was deleted without a word.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aspc.atomic import atomic_dir, remove_stale_temps
from aspc.errors import OutputError


def _no_foreign(d: Path) -> str | None:
    extra = sorted(p.name for p in d.iterdir() if p.name != "out.txt")
    return f"holds {extra[0]!r}" if extra else None


def test_a_file_put_in_meanwhile_stays_and_the_write_is_refused(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(OutputError, match="holds 'notes.txt'"):
        with atomic_dir(target, refuse=_no_foreign) as tmp:
            (tmp / "out.txt").write_text("new")
            (target / "notes.txt").write_text("mine")  # after the caller's check, before the swap
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary left


def test_an_earlier_output_alone_is_replaced(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "out.txt").write_text("old")
    with atomic_dir(target, refuse=_no_foreign) as tmp:
        (tmp / "out.txt").write_text("new")
    assert (target / "out.txt").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def _refused_while_another_writer_takes_the_place(target: Path, match: str) -> Path:
    """A write of ``target`` (holding the user's notes.txt) whose check finds the place taken: where it kept them."""
    target.mkdir()
    (target / "notes.txt").write_text("mine")

    def refuse_while_another_writer_takes_the_place(d: Path) -> str | None:
        target.mkdir()
        (target / "theirs.txt").write_text("x")
        return _no_foreign(d)

    with pytest.raises(OutputError, match=match) as err:
        with atomic_dir(target, refuse=refuse_while_another_writer_takes_the_place) as tmp:
            (tmp / "out.txt").write_text("new")
    return Path(str(err.value).rsplit("kept at ", 1)[1].rstrip(")"))


def test_the_earlier_directory_is_kept_aside_and_named_where_it_cannot_go_back(tmp_path):
    target = tmp_path / "out"
    aside = _refused_while_another_writer_takes_the_place(
        target, r"holds 'notes.txt' \(the earlier out is kept at .*out\.kept-"
    )
    assert (aside / "notes.txt").read_text() == "mine"  # never deleted
    # Nor by the next write of that output, whose cleanup removes a dead writer's .out.old-PID (reviewer).
    remove_stale_temps(target)
    with atomic_dir(target) as tmp:
        (tmp / "out.txt").write_text("newer")
    assert (aside / "notes.txt").read_text() == "mine"


def test_a_check_that_fails_at_the_swap_leaves_the_earlier_directory(tmp_path):
    # A refuse() that raises (EACCES, EIO listing the directory) left the earlier output moved aside, and
    # the cleanup then deleted it: neither the old output nor the new one (reviewer).
    target = tmp_path / "out"
    target.mkdir()
    (target / "out.txt").write_text("old")

    def unreadable(d: Path) -> str | None:
        raise PermissionError(13, "Permission denied", str(d))

    with pytest.raises((OSError, OutputError)):  # one line as any denied write (aspc.atomic translates it)
        with atomic_dir(target, refuse=unreadable) as tmp:
            (tmp / "out.txt").write_text("new")
    assert (target / "out.txt").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_predictor_save_keeps_a_file_put_in_its_directory_while_it_trained(tmp_path, monkeypatch):
    from aspc.predict import lexical
    from aspc.predict.lexical_train import train_lexical

    texts = [f"prompt {i} " + "word " * (i % 17) for i in range(120)]
    lengths = [[10.0 + 7 * (i % 17), 12.0 + 5 * (i % 13)] for i in range(120)]
    pred = train_lexical(texts, lengths)
    out = tmp_path / "pred"
    out.mkdir()
    real = lexical.write_metadata

    def meanwhile(directory, kind, body):
        (out / "notes.txt").write_text("mine")
        return real(directory, kind, body)

    monkeypatch.setattr(lexical, "write_metadata", meanwhile)
    with pytest.raises(OutputError, match="'notes.txt' was put there while the predictor was made"):
        pred.save(out)
    assert (out / "notes.txt").read_text() == "mine"


def test_a_long_name_that_cannot_go_back_is_kept_where_cleanup_never_looks(tmp_path):
    # Second review: the kept name was built from the whole name (past 255 bytes for a long one), and its
    # failure left the directory at .NAME.old-PID, which the next write's cleanup deletes once the PID is gone.
    import re

    aside = _refused_while_another_writer_takes_the_place(tmp_path / ("L" * 248), r"\.kept-")
    assert not re.search(r"\.old-\d+$", aside.name) and (aside / "notes.txt").read_text() == "mine"


def test_an_earlier_output_left_aside_by_a_killed_check_comes_back(tmp_path):
    # Second review: SIGKILL while the earlier output was checked left it at .NAME.old-PID with no output at
    # NAME; the next write saw nothing to check, and its cleanup deleted it with the user's file in it.
    import subprocess
    import sys

    target = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    aside = tmp_path / f".out.old-{int(dead.stdout)}"  # a writer gone: its pid no longer runs
    aside.mkdir()
    (aside / "notes.txt").write_text("mine")
    remove_stale_temps(target)
    assert (target / "notes.txt").read_text() == "mine" and not aside.exists()


def test_a_check_that_cannot_read_is_one_line_and_nothing_is_replaced(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "out.txt").write_text("old")

    def io_error(d: Path) -> str | None:
        raise OSError(5, "Input/output error", str(d / "index.html"))

    with pytest.raises(OutputError, match="could not be checked before it is replaced .*nothing was replaced"):
        with atomic_dir(target, refuse=io_error) as tmp:
            (tmp / "out.txt").write_text("new")
    assert (target / "out.txt").read_text() == "old"
