"""Row readers for JSONL, JSON, CSV and Parquet datasets.

Each reader yields ``(row_number, record)`` with 0-based row numbers (the
line number minus one for JSONL), so errors can point at the offending line.
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

from aspc.errors import InputError


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
    raise InputError(
        f"{path.name}: unsupported file type {suffix or '(none)'}; use one of {', '.join(SUPPORTED_SUFFIXES)}"
    )


def _check_file(path: Path) -> None:
    if not path.exists():
        raise InputError(f"{path}: no such file; check the path")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a dataset file")
    if path.stat().st_size == 0:
        raise InputError(f"{path.name}: file is empty; give a dataset with at least one prompt")


def _decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{path.name}: line {line}: not valid UTF-8; re-encode the file as UTF-8") from None


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    data = path.read_bytes()
    if data[:4] == b"PAR1":
        raise InputError(f"{path.name}: this is a Parquet file, not JSONL; rename it to .parquet")
    text = _decode(data, path)
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            # Not raised here: the caller decides between failing and skipping.
            rec = BadRecord(f"malformed JSON ({exc.msg} at column {exc.colno})")
        except RecursionError:
            rec = BadRecord("JSON nested too deeply")
        yield lineno - 1, rec


def iter_json(path: Path) -> Iterator[tuple[int, Any]]:
    text = _decode(path.read_bytes(), path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path.name}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(doc, list):
        raise InputError(f"{path.name}: expected a JSON array of records; use JSONL for one record per line")
    yield from enumerate(doc)


def iter_csv(path: Path) -> Iterator[tuple[int, Any]]:
    text = _decode(path.read_bytes(), path)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if not reader.fieldnames:
        raise InputError(f"{path.name}: CSV has no header row; add one naming the columns")
    try:
        yield from enumerate(reader)
    except csv.Error as exc:
        raise InputError(f"{path.name}: line {reader.line_num}: malformed CSV ({exc})") from None


def read_parquet_table(path: Path):
    """Read a Parquet file, mapping Arrow errors to InputError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"{path.name}: not a readable Parquet file ({_short(exc)}); check the file") from None


def iter_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa

    table = read_parquet_table(path)
    row = 0
    try:
        batches = table.to_batches(max_chunksize=65536)
        for batch in batches:
            for rec in batch.to_pylist():
                yield row, rec
                row += 1
    except (pa.ArrowException, ValueError) as exc:
        raise InputError(f"{path.name}: row {row + 1}: unreadable Parquet data ({_short(exc)})") from None


def _short(exc: Exception) -> str:
    msg = " ".join(str(exc).split())
    return msg[:160]


def iter_records(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """Yield ``(row_number, record)`` from a dataset file of any supported format."""
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
