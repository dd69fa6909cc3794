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
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aspc.errors import InputError
from aspc.io.parquet_rows import (  # noqa: F401 - BAD_TEXT, BadText, read_parquet_table re-exported
    BAD_TEXT,
    BadText,
    BadTextRow,
    iter_parquet,
    read_parquet_table,
)


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


class TwiceKeys(dict):
    """A JSON object that names some keys more than once (json.loads keeps the last value of each)."""

    twice: frozenset[str] = frozenset()


def json_object(pairs: list[tuple[str, Any]]) -> dict:
    """``object_pairs_hook`` for json.loads: a plain dict, or a :class:`TwiceKeys` naming the repeated keys."""
    rec = dict(pairs)
    if len(rec) == len(pairs):
        return rec
    out = TwiceKeys(rec)
    seen: set[str] = set()
    out.twice = frozenset(k for k, _ in pairs if k in seen or seen.add(k))
    return out


class ShortRow(dict):
    """A CSV row with fewer cells than the header; the missing ones read as None."""

    missing: tuple[str, ...] = ()  # header names past the row's last cell
    width = 0  # cells in the header


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
    if suffix in _COMPRESSED_SUFFIXES:
        raise InputError(f"{path.name}: a {_COMPRESSED_SUFFIXES[suffix]}-compressed file; decompress it first and pass "
                         f"the {', '.join(SUPPORTED_SUFFIXES)} file inside")  # fmt: skip
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


# Compressed files by suffix, and by their first bytes where the suffix says text (a gzip saved as .jsonl).
_COMPRESSED_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".bz2": "bzip2", ".xz": "xz", ".zip": "zip"}
# bzip2's "BZh" is followed by the block size and a block's (or the end's) own magic: "BZh" alone opens text.
_COMPRESSED_MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"\xfd7zXZ\x00": "xz", b"PK\x03\x04": "zip"}
_BZIP2 = re.compile(rb"BZh[1-9](\x31\x41\x59\x26\x53\x59|\x17\x72\x45\x38\x50\x90)")


def _decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        # Only where the bytes are not text: a text file may well begin "BZh".
        kind = next((k for magic, k in _COMPRESSED_MAGIC.items() if data.startswith(magic)), None)
        kind = "bzip2" if kind is None and _BZIP2.match(data) else kind
        if kind is not None:
            xlsx = " (an Excel workbook is a zip too: save it as CSV)" if kind == "zip" else ""
            raise InputError(f"{path.name}: a {kind}-compressed file, not text; decompress it first{xlsx}") from None
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{path.name}: line {line}: not valid UTF-8; re-encode the file as UTF-8") from None


def check_not_parquet(data: bytes, path: Path) -> None:
    if data[:4] == b"PAR1":
        raise InputError(f"{path.name}: this is a Parquet file, not JSONL; rename it to .parquet")


def _key_tokens(keys: tuple[str, ...]) -> tuple[str, ...] | None:
    """How each key is written in a JSON object free of \\u escapes, or None if some key has other spellings."""
    if any(not k.isprintable() or any(c in k for c in '"\\/') for k in keys):
        return None
    return tuple(f'"{k}"' for k in keys)


# Built once: json.loads builds a decoder per call, a sixth of the row reader's time on short lines.
_DECODE = json.JSONDecoder(parse_int=json_int).decode
_DECODE_PAIRS = json.JSONDecoder(parse_int=json_int, object_pairs_hook=json_object).decode


def _loads_line(line: str, tokens: tuple[str, ...] | None) -> Any:
    if line.startswith("\ufeff"):
        return json.loads(line, parse_int=json_int)  # json.loads's own message for a BOM inside the file
    # The pairs hook costs a quarter more per line: a line that spells each key read at most once,
    # and escapes no character, cannot repeat one of them.
    if tokens is None or (tokens and ("\\u" in line or max(map(line.count, tokens)) > 1)):
        return _DECODE_PAIRS(line)
    return _DECODE(line)


def _json_reason(exc: json.JSONDecodeError) -> str:
    # "Unterminated string starting at" already ends in "at": without the cut it read "at at column 20".
    return exc.msg.removesuffix(" at")


def iter_jsonl(path: Path, keys: tuple[str, ...] = ()) -> Iterator[tuple[int, int, Any]]:
    """Rows of a JSONL file; an object that repeats one of ``keys`` is a :class:`TwiceKeys`."""
    tokens = _key_tokens(keys)
    data = path.read_bytes()
    check_not_parquet(data, path)
    text = _decode(data, path)
    # Only \n ends a line (a trailing \r is JSON whitespace): str.splitlines
    # would also split at U+2028/U+2029/U+0085, which are valid inside strings.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = _loads_line(line, tokens)
        except json.JSONDecodeError as exc:
            # Not raised here: the caller decides between failing and skipping.
            if exc.msg == "Extra data":  # json's own words named no fix
                rec = BadRecord(f"malformed JSON: more text follows the record, at column {exc.colno}; "
                                "put one record per line")
            else:
                rec = BadRecord(f"malformed JSON ({_json_reason(exc)} at column {exc.colno})")
        except RecursionError:
            rec = BadRecord("JSON nested too deeply")
        yield lineno - 1, lineno, rec


def iter_json(path: Path, keys: tuple[str, ...] = ()) -> Iterator[tuple[int, int, Any]]:
    """Records of a JSON array; an object that repeats one of ``keys`` is a :class:`TwiceKeys`."""
    text = _decode(path.read_bytes(), path)
    try:
        hook = json_object if keys else None
        doc = json.loads(text, parse_int=json_int, object_pairs_hook=hook)
    except json.JSONDecodeError as exc:
        hint = "fix the JSON"
        if exc.msg == "Extra data" and _one_record_a_line(text):
            hint = "it holds one record per line: rename the file to .jsonl"
        raise InputError(f"{path.name}: malformed JSON at line {exc.lineno}: {_json_reason(exc)}; {hint}") from None
    except RecursionError:
        raise InputError(f"{path.name}: JSON nested too deeply") from None
    if not isinstance(doc, list):
        raise InputError(f"{path.name}: expected a JSON array of records; use JSONL for one record per line")
    for i, rec in enumerate(doc):
        yield i, i + 1, rec


def _one_record_a_line(text: str) -> bool:
    """Whether the first line of ``text`` is a JSON object by itself: JSON lines saved as .json."""
    try:
        return isinstance(json.loads(text.lstrip().split("\n", 1)[0]), dict)
    except (ValueError, RecursionError):
        return False


class _CsvError(Exception):
    def __init__(self, line: int, exc: csv.Error) -> None:
        super().__init__(str(exc))
        self.line = line  # file lines read when the error happened


# Python's csv module refuses fields over 131,072 characters by default. The whole file is in memory
# already, so the cap protects nothing; it only refused prompts the JSON readers take. Prompt size is
# checked per row (MAX_PROMPT_BYTES in aspc.io.rows), and a runaway quote is found by _strict_check.
# Raised once, here, and never lowered: the limit is process-wide, and a reader that set it and put it
# back around its rows lowered it under another reader (a thread, an interleaved generator) mid-file.
_CSV_FIELD_LIMIT = 2**31 - 1  # the largest a C long holds on every platform
csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))


def _strict_check(text: str) -> tuple[int | None, bool]:
    """(line on which a quoted field opens and never closes, else None; whether any other quote is malformed).

    The lenient reader would swallow the rest of the file into an unclosed
    quote's cell, and reads ``"hi" there`` as ``hi there``; the strict one
    reports both (and resumes on the next line after the latter).
    """
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    start = 1
    bad = False
    while True:
        try:
            next(reader)
        except StopIteration:
            return None, bad
        except csv.Error as exc:
            if "unexpected end of data" in str(exc):
                return start, bad
            bad = True
        start = reader.line_num + 1


def _quoted_badly(raw: str) -> bool:
    """Whether the strict reader refuses one row's text (text after a closing quote)."""
    try:
        list(csv.reader(io.StringIO(raw, newline=""), strict=True))
    except csv.Error:
        return True
    return False


_BAD_QUOTE = 'a quoted field has text after its closing quote; quote the whole field and double each quote inside it ("")'


def _csv_rows(text: str) -> Iterator[tuple[int, int, list[str]]]:
    """(first line, last line, cells) of every CSV row, the header and empty rows included."""
    reader = csv.reader(io.StringIO(text, newline=""))
    start = 1
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise _CsvError(reader.line_num, exc) from None
        yield start, reader.line_num, cells
        start = reader.line_num + 1


# verl's extra_info (aspc.io.rows.VERL_INDEX): a CSV cell of it holding a JSON object is read as that object,
# so extra_info.index gives the ids it gives in JSON; any other cell (not JSON, a list, a number) stays text.
_CSV_JSON_OBJECTS = ("extra_info",)


def _csv_json_object(cell: Any) -> Any:
    """A CSV cell's JSON object (a dict), or the cell unchanged where it holds none."""
    if not isinstance(cell, str) or not cell.lstrip().startswith("{"):
        return cell
    try:
        value = _DECODE(cell)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return cell
    return value if isinstance(value, dict) else cell


def iter_csv(path: Path) -> Iterator[tuple[int, int, Any]]:
    text = _decode(path.read_bytes(), path)
    for row, line, rec in _iter_csv_text(text, path):
        if isinstance(rec, dict):
            for name in _CSV_JSON_OBJECTS:
                if name in rec:
                    rec[name] = _csv_json_object(rec[name])
        yield row, line, rec


def _iter_csv_text(text: str, path: Path) -> Iterator[tuple[int, int, Any]]:
    line, bad_quotes = _strict_check(text)
    if line is not None:
        raise InputError(
            f"{path.name}: line {line}: unterminated quote (a field opened with \" never closes); "
            'close it, and double any quote inside a quoted field ("")'
        )
    # Only a file the strict reader refused pays for checking its rows one by one.
    lines = io.StringIO(text, newline="").readlines() if bad_quotes else []
    rows = _csv_rows(text)
    try:
        # A blank line above the header is no header with no columns.
        header = next((r for r in rows if len(r[2]) > 1 or "".join(r[2]).strip()), None)
        if header is None:
            raise InputError(f"{path.name}: CSV has no header row; add one naming the columns")
        if lines and _quoted_badly("".join(lines[header[0] - 1 : header[1]])):
            raise InputError(f"{path.name}: line {header[0]}: header: {_BAD_QUOTE}")
        names = header[2]
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is not None:
            # A dict of the row would keep the last of the two silently: which one the user meant is unknown.
            raise InputError(f"{path.name}: line {header[0]}: two columns are named {twice!r}; rename or drop one")
        row = 0
        for line, last, cells in rows:
            if not cells:
                continue
            # csv.DictReader's layout: missing cells are None. Extra cells are a bad row: an unquoted comma in a
            # prompt ("Hello, world") would otherwise cut the prompt at the comma and drop the rest silently.
            rec: Any = dict(zip(names, cells, strict=False))
            if lines and _quoted_badly("".join(lines[line - 1 : last])):
                if last == len(lines) and "".join(lines[line - 1 : last]).count('"') % 2:
                    # Text after a closing quote hid a quote that opens later on that line from the strict
                    # pass; the lenient reader ran it to the end of the file, which skip would drop whole.
                    raise InputError(
                        f"{path.name}: line {line}: unterminated quote (a field opened with \" never closes); "
                        'close it, and double any quote inside a quoted field ("")'
                    )
                rec = BadRecord(_BAD_QUOTE)
            elif len(cells) < len(names):
                rec = ShortRow(rec)
                rec.missing = tuple(names[len(cells) :])
                rec.width = len(names)
                rec.update({k: None for k in rec.missing})
            elif len(cells) > len(names):
                rec = BadRecord(f"{len(cells)} fields but the header has {len(names)}; quote fields that hold commas")
            yield row, line, rec
            row += 1
    except _CsvError as exc:
        raise InputError(f"{path.name}: line {exc.line}: malformed CSV ({exc})") from None


def iter_records(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """Yield ``(row_number, record)`` from a dataset file of any supported format."""
    return ((row, rec) for row, _line, rec in iter_numbered_records(path))


def iter_numbered_records(
    path: str | os.PathLike, keys: tuple[str, ...] = (), columns: tuple[str, ...] | None = None
) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(row_number, line, record)`` from a dataset file of any supported format.

    A JSON object that repeats one of ``keys`` is a :class:`TwiceKeys` (CSV and
    Parquet refuse a repeated column name whatever it is). ``columns``: a Parquet
    file's records hold only these (the fields the caller reads).
    """
    path = Path(path)
    fmt = detect_format(path)
    _check_file(path)
    if fmt == "jsonl":
        return iter_jsonl(path, keys)
    if fmt == "json":
        return iter_json(path, keys)
    if fmt == "csv":
        return iter_csv(path)
    return iter_parquet(path, columns)
