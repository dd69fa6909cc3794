"""What makes ``meta.json`` a run log's: its format name and version, checked without the runtime.

The runtime writes and reads run logs (:mod:`aspc.runtime.record`); the
compiler and the predictors read their samples as history and training pairs.
Both check the same identity here, so a log of another major version is
refused by every command, not only by those that load the runtime.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from aspc import __version__
from aspc.errors import InputError, SchemaVersionError

RUNLOG_FORMAT = "aspc.runlog"
# Major.minor, as for plans: a reader refuses another major version.
# 1.1: committed part ranges in meta.json, consumed/ parts (resume); 1.2: samples' decode_time
RUNLOG_VERSION = "1.2"
RUNLOG_MAJOR = 1
_PART_RE = re.compile(r"^part-(\d{6,})\.parquet$")


def is_runlog_meta(meta: Any) -> bool:
    """Whether a parsed ``meta.json`` names the run log format (any version)."""
    return isinstance(meta, dict) and meta.get("format") == RUNLOG_FORMAT


def refuse_runlog_meta(path: Path) -> None:
    """A run log's ``meta.json`` given where its directory is read: name the directory to pass.

    Read as a JSON dataset it said "meta.json: expected a JSON array of records; use JSONL", which
    sent the user to convert a file that was never their data.
    """
    import json

    if path.name != "meta.json" or not path.is_file():
        return
    try:
        meta = json.loads(path.read_bytes())
    except (ValueError, OSError, RecursionError):  # not JSON, or unreadable: the reader says why
        return
    if is_runlog_meta(meta):
        run = path.parent if str(path.parent) not in ("", ".") else Path(".")
        raise InputError(f"{path} is the meta.json of the run log {run}; pass the run log directory {run} "
                         "itself")  # fmt: skip


def check_runlog_version(meta: dict[str, Any], path: Path, invalid: type[Exception]) -> None:
    """Refuse a run log of another major format version (``invalid`` for a malformed version)."""
    version = str(meta.get("format_version", "?"))
    try:
        major = int(version.split(".")[0])
    except ValueError:
        raise invalid(f"{path}: invalid run log format_version {version!r}") from None
    if major != RUNLOG_MAJOR:
        newer = "newer" if major > RUNLOG_MAJOR else "older"
        raise SchemaVersionError(
            f"{path}: run log format {version} is {newer} than this aspc {__version__} reads ({RUNLOG_VERSION}); "
            f"use an aspc that reads run log format {major}.x"
        )


def part_ranges(meta: dict[str, Any], path: Path, invalid: type[Exception]) -> dict[str, tuple[int, int]] | None:
    """The committed part numbers of each kind, ``kind -> [first, end)``; ``None`` for a log without them (1.0).

    A kind missing from ``parts`` has none. Anything but ``{kind: [first, end]}``
    with ``0 <= first <= end`` is a damaged (or hand-edited) ``meta.json``:
    ``invalid``, in one line, rather than a traceback in whichever reader met it.
    """
    if "parts" not in meta:
        return None
    ranges = meta["parts"]
    ok = isinstance(ranges, dict)
    out: dict[str, tuple[int, int]] = {}
    for kind, r in ranges.items() if ok else ():
        ok = isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r) and 0 <= r[0] <= r[1]
        if not ok:
            break
        out[kind] = (r[0], r[1])
    if not ok:
        raise invalid(f"{path}: corrupt part ranges in meta.json; the run log is damaged")
    return out


def committed(files: list[Path], kind: str, ranges: dict[str, tuple[int, int]] | None, path: Path,
              invalid: type[Exception]) -> list[Path]:  # fmt: skip
    """The ``part-N.parquet`` files of ``kind`` that ``ranges`` committed, all of them there (else ``invalid``)."""
    if ranges is None:
        return files
    first, end = ranges.get(kind, (0, 0))
    live = [f for f in files if (n := part_number(f)) is not None and first <= n < end]
    if len(live) != end - first:
        raise invalid(f"{path}: committed parts of {kind}/ are missing; the run log is damaged")
    return live


def part_number(path: Path) -> int | None:
    """The number of a ``part-NNNNNN.parquet`` file (``part-000012.parquet`` -> 12), or None for any other name."""
    m = _PART_RE.match(path.name)
    return int(m.group(1)) if m else None
