"""Row readers for JSONL, JSON, CSV and Parquet datasets.

Each reader yields ``(row_number, line, record)``: the 0-based row number
(the line number minus one for JSONL; the data row for CSV) and the 1-based
file line the row starts on, which error messages name. JSONL lines end at
``\n`` (or ``\r\n``) only: U+2028, U+2029 and U+0085 are valid inside JSON
strings. Integers too long for Python's int conversion become
:class:`HugeInt`, so the row's message can say which field holds one.
Readers fail with :class:`~aspc.errors.InputError` on anything malformed.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aspc.errors import InputError, short_reason


class HugeInt:
    """A JSON integer too long to convert (more than :data:`MAX_INT_DIGITS` digits)."""

    __slots__ = ("digits", "negative")

    def __init__(self, text: str) -> None:
        self.negative = text.startswith("-")
        self.digits = len(text) - self.negative

    def __repr__(self) -> str:
        return f"<{self.digits}-digit integer>"


# Below Python's default limit on int/str conversion (4,300 digits), which
# would raise a bare ValueError from inside json.loads.
MAX_INT_DIGITS = 4000


def json_int(text: str) -> int | HugeInt:
    """``parse_int`` hook for json.loads: a huge integer becomes a HugeInt, not a ValueError."""
    return int(text) if len(text) <= MAX_INT_DIGITS else HugeInt(text)


class BadRecord:
    """Stands in for a record that could not be parsed; carries the reason."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


SUPPORTED_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".parquet", ".pq")


def detect_format(path: Path) -> str:
    """Return ``jsonl``, ``json``, ``csv`` or ``parquet`` from the file suffix."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".json":
        return "json"
    if suffix == ".csv":
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if not os.path.lexists(path):  # say so before the suffix: "nonexist" is a typo more often than a format
        raise InputError(f"{path}: no such file; check the path")
    raise InputError(
        f"{path.name}: unsupported file type {suffix or '(none)'}; use one of {', '.join(SUPPORTED_SUFFIXES)}"
    )


def _check_file(path: Path) -> None:
    if not path.exists():
        raise InputError(f"{path}: no such file; check the path")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a dataset file")
    if not path.is_file():
        raise InputError(f"{path}: not a regular file (a pipe, socket or device); save the data to a file and pass that")
    if path.stat().st_size == 0:
        raise InputError(f"{path.name}: file is empty; give a dataset with at least one prompt")


def _decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{path.name}: line {line}: not valid UTF-8; re-encode the file as UTF-8") from None


def check_not_parquet(data: bytes, path: Path) -> None:
    if data[:4] == b"PAR1":
        raise InputError(f"{path.name}: this is a Parquet file, not JSONL; rename it to .parquet")


def iter_jsonl(path: Path) -> Iterator[tuple[int, int, Any]]:
    data = path.read_bytes()
    check_not_parquet(data, path)
    text = _decode(data, path)
    # Only \n ends a line (a trailing \r is JSON whitespace): str.splitlines
    # would also split at U+2028/U+2029/U+0085, which are valid inside strings.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line, parse_int=json_int)
        except json.JSONDecodeError as exc:
            # Not raised here: the caller decides between failing and skipping.
            rec = BadRecord(f"malformed JSON ({exc.msg} at column {exc.colno})")
        except RecursionError:
            rec = BadRecord("JSON nested too deeply")
        yield lineno - 1, lineno, rec


def iter_json(path: Path) -> Iterator[tuple[int, int, Any]]:
    text = _decode(path.read_bytes(), path)
    try:
        doc = json.loads(text, parse_int=json_int)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path.name}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    except RecursionError:
        raise InputError(f"{path.name}: JSON nested too deeply") from None
    if not isinstance(doc, list):
        raise InputError(f"{path.name}: expected a JSON array of records; use JSONL for one record per line")
    for i, rec in enumerate(doc):
        yield i, i + 1, rec


class _CsvError(Exception):
    def __init__(self, line: int, exc: csv.Error) -> None:
        super().__init__(str(exc))
        self.line = line  # file lines read when the error happened


def _unterminated_quote(text: str) -> int | None:
    """Line on which a quoted CSV field opens and never closes, else None.

    The lenient reader would swallow the rest of the file into that one
    cell; the strict one reports it (and resumes after its other errors,
    which the lenient reader accepts).
    """
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    start = 1
    while True:
        try:
            next(reader)
        except StopIteration:
            return None
        except csv.Error as exc:
            if "unexpected end of data" in str(exc):
                return start
        start = reader.line_num + 1


def _csv_rows(text: str) -> Iterator[tuple[int, list[str]]]:
    """(line the row starts on, cells) for every CSV row, the header and empty rows included."""
    reader = csv.reader(io.StringIO(text, newline=""))
    start = 1
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise _CsvError(reader.line_num, exc) from None
        yield start, cells
        start = reader.line_num + 1


def iter_csv(path: Path) -> Iterator[tuple[int, int, Any]]:
    text = _decode(path.read_bytes(), path)
    line = _unterminated_quote(text)
    if line is not None:
        raise InputError(
            f"{path.name}: line {line}: unterminated quote (a field opened with \" never closes); "
            'close it, and double any quote inside a quoted field ("")'
        )
    rows = _csv_rows(text)
    try:
        header = next(rows, None)
        if header is None or not header[1]:
            raise InputError(f"{path.name}: CSV has no header row; add one naming the columns")
        names = header[1]
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is not None:
            # A dict of the row would keep the last of the two silently: which one the user meant is unknown.
            raise InputError(f"{path.name}: line {header[0]}: two columns are named {twice!r}; rename or drop one")
        row = 0
        for line, cells in rows:
            if not cells:
                continue
            # csv.DictReader's layout: missing cells are None. Extra cells are a bad row: an unquoted comma in a
            # prompt ("Hello, world") would otherwise cut the prompt at the comma and drop the rest silently.
            rec: Any = dict(zip(names, cells, strict=False))
            if len(cells) < len(names):
                rec.update({k: None for k in names[len(cells) :]})
            elif len(cells) > len(names):
                rec = BadRecord(f"{len(cells)} fields but the header has {len(names)}; quote fields that hold commas")
            yield row, line, rec
            row += 1
    except _CsvError as exc:
        raise InputError(f"{path.name}: line {exc.line}: malformed CSV ({exc})") from None


def read_parquet_table(path: Path):
    """Read a Parquet file, mapping Arrow errors to InputError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is None:
            return pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"{path.name}: not a readable Parquet file ({short_reason(exc)}); check the file") from None
    raise InputError(f"{path.name}: two columns are named {twice!r}; rename or drop one")


def iter_parquet(path: Path) -> Iterator[tuple[int, int, Any]]:
    import pyarrow as pa

    table = read_parquet_table(path)
    row = 0
    try:
        batches = table.to_batches(max_chunksize=65536)
        for batch in batches:
            for rec in batch.to_pylist():
                yield row, row + 1, rec
                row += 1
    except (pa.ArrowException, ValueError) as exc:
        raise InputError(f"{path.name}: row {row + 1}: unreadable Parquet data ({short_reason(exc)})") from None


def iter_records(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """Yield ``(row_number, record)`` from a dataset file of any supported format."""
    return ((row, rec) for row, _line, rec in iter_numbered_records(path))


def iter_numbered_records(path: str | os.PathLike) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(row_number, line, record)`` from a dataset file of any supported format."""
    path = Path(path)
    fmt = detect_format(path)
    _check_file(path)
    if fmt == "jsonl":
        return iter_jsonl(path)
    if fmt == "json":
        return iter_json(path)
    if fmt == "csv":
        return iter_csv(path)
    return iter_parquet(path)
