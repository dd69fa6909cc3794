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


def _with_lengths(path):
    data = path.read_bytes()
    fields = {**FIELDS, "length_field": "len"}
    with mock.patch.object(bulk, "_JSON_PREFIX", data.index(b"\n") + 1):  # the later lines as a large file's
        got = bulk.read_jsonl_bulk(data, **fields)
    try:
        ref = read_rows(path, on_bad_line="error", fmt="jsonl", **fields)
    except InputError as exc:
        ref = str(exc)
    return got, ref


@pytest.mark.parametrize(
    "line",
    [
        '{"id": 9, "prompt": "q9", "len": 3, "x": Inf}',  # literals pyarrow reads and json.loads refuses
        '{"id": 9, "prompt": "q9", "len": 3, "x": -Inf}',
        '{"id": 9, "prompt": "q9", "len": 3, "x": [1, -NaN]}',
        '{"id": 9, "prompt": "q9", "len": 3, "x": ' + "[" * 5000 + "]" * 5000 + "}",  # past json.loads' depth
        "null",  # pyarrow: a row of nulls
        '{"id": 9, "prompt": "q9", "len": 3, "x": "\0"}',
    ],
)
def test_a_line_json_loads_refuses_is_left_to_the_row_reader(tmp_path, line):
    # pyarrow.json read each of these and the file compiled; the row reader refuses the line.
    recs = [json.dumps({"id": i, "prompt": f"q{i}", "len": i + 1}) for i in range(3)]
    (tmp_path / "t.jsonl").write_text("\n".join([*recs, line]) + "\n")
    got, ref = _with_lengths(tmp_path / "t.jsonl")
    assert isinstance(ref, str) and "line 4" in ref
    assert got is None


def test_an_object_over_two_lines_beside_two_on_one_is_left_to_the_row_reader(tmp_path):
    # As many rows as lines: the shortcut numbered the rows line by line (wrong source rows), and the file
    # compiled where the row reader says line 3 is malformed.
    def rec(i):
        return json.dumps({"id": i, "prompt": f"q{i}", "len": 5})

    split = rec(2).replace(", ", ",\n", 1)
    (tmp_path / "t.jsonl").write_text("\n".join([rec(0), rec(1), split, rec(3) + rec(4)]) + "\n")
    got, ref = _with_lengths(tmp_path / "t.jsonl")
    assert isinstance(ref, str) and "line 3" in ref
    assert got is None


def test_a_length_written_as_minus_zero_is_read_as_the_row_reader_reads_it(tmp_path):
    # pyarrow.json reads -0 as -0.0, json.loads as the integer 0: the plan's predicted_len differed by path.
    import numpy as np

    (tmp_path / "t.jsonl").write_text(
        "".join(json.dumps({"id": i, "prompt": f"q{i}", "len": 4}) + "\n" for i in range(3))
        + '{"id": 3, "prompt": "q3", "len": -0}\n{"id": 4, "prompt": "q4", "len": -0.0}\n'
    )
    got, ref = _with_lengths(tmp_path / "t.jsonl")
    assert got is None  # left to the row reader
    assert not np.signbit(ref.lengths.values[3]) and np.signbit(ref.lengths.values[4])


def test_nan_and_infinity_in_other_fields_keep_the_shortcut(tmp_path):
    # json.loads reads these; so must the scan, or every such file went row by row.
    recs = [{"id": i, "prompt": f"q{i} Inf -NaN", "len": 2} for i in range(3)]
    text = "".join(json.dumps(r)[:-1] + ', "x": [NaN, Infinity, -Infinity]}\n' for r in recs)
    (tmp_path / "t.jsonl").write_text(text)
    got, ref = _with_lengths(tmp_path / "t.jsonl")
    assert got is not None and not isinstance(ref, str)
    assert got.ids == ref.ids
