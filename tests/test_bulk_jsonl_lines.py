"""JSON lines the bulk reader must not vouch for where the row reader refuses them (a review's findings)."""

from __future__ import annotations

import json
from unittest import mock

import pytest

from aspc.errors import InputError
from aspc.io import bulk
from aspc.io.rows import read_rows

FIELDS = {"prompt_field": "prompt", "id_field": "id", "length_field": None}


def _both(path):
    data = path.read_bytes()
    cut = data.index(b"\n", len(data) - len(data.lstrip())) + 1  # past the first line that holds a record
    with mock.patch.object(bulk, "_JSON_PREFIX", cut):  # types from the first lines, as from a large file's first MiB
        got = bulk.read_jsonl_bulk(data, **FIELDS)
    try:
        ref = read_rows(path, on_bad_line="error", fmt="jsonl", **FIELDS)
    except InputError:
        ref = None
    return got, ref


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("joint", ["}{", "}\r{", "} {"])
def test_two_records_on_a_line_and_a_blank_line_are_left_to_the_row_reader(tmp_path, chat, joint):
    # As many rows as newlines: the shortcut took the lines as one row each, and the file compiled.
    def rec(i):
        return json.dumps({"id": i, "prompt": [{"role": "user", "content": f"q{i}"}] if chat else f"q{i}"})

    lines = [rec(i) for i in range(3)] + [rec(3) + joint[1:-1] + rec(4), ""]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    got, ref = _both(tmp_path / "t.jsonl")
    assert ref is None and got is None


@pytest.mark.parametrize("chat", [False, True])
def test_an_index_that_first_appears_late_is_not_dropped(tmp_path, chat):
    # extra_info was left out of the types when the first lines had none: the index was dropped unsaid.
    recs = [{"prompt": [{"role": "user", "content": f"q{i}"}] if chat else f"q{i}"} for i in range(3)]
    recs[2]["extra_info"] = {"index": 7}
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    got, ref = _both(tmp_path / "t.jsonl")
    assert ref is None  # ids on some rows only
    assert got is None


def test_clean_files_keep_the_shortcut_and_blank_lines_the_slow_path(tmp_path):
    body = "".join(json.dumps({"id": i, "prompt": f"q{i}"}) + "\n" for i in range(4))
    for name, text in [("a", body), ("b", body.rstrip("\n")), ("c", body + "\n"), ("d", "\n" + body),
                       ("e", body.replace("\n", "\r\n")), ("f", body + "  ")]:  # fmt: skip
        (tmp_path / f"{name}.jsonl").write_text(text)
        got, ref = _both(tmp_path / f"{name}.jsonl")
        assert got is not None and ref is not None, name
        assert got.ids == ref.ids and got.source_rows.tolist() == ref.source_rows.tolist(), name
