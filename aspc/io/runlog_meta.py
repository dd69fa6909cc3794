"""What makes ``meta.json`` a run log's: its format name and version, checked without the runtime.

The runtime writes and reads run logs (:mod:`aspc.runtime.record`); the
compiler and the predictors read their samples as history and training pairs.
Both check the same identity here, so a log of another major version is
refused by every command, not only by those that load the runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aspc import __version__
from aspc.errors import SchemaVersionError

RUNLOG_FORMAT = "aspc.runlog"
# Major.minor, as for plans: a reader refuses another major version.
# 1.1: committed part ranges in meta.json, consumed/ parts (resume); 1.2: samples' decode_time
RUNLOG_VERSION = "1.2"
RUNLOG_MAJOR = 1


def is_runlog_meta(meta: Any) -> bool:
    """Whether a parsed ``meta.json`` names the run log format (any version)."""
    return isinstance(meta, dict) and meta.get("format") == RUNLOG_FORMAT


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
