"""Read a prompt dataset into a validated :class:`PromptTable`.

A prompt is a string field or a chat list of ``{role, content}`` messages
(a ``messages`` field, or a verl-style ``prompt`` column holding a list).
Ids come from the id field, else from verl's ``extra_info.index``, else from a
hash of the prompt content, so the same prompt gets the same id on every
machine. Parquet and JSONL are read in bulk (:mod:`aspc.io.bulk`); any file
the bulk reader cannot vouch for, and JSON and CSV, are read row by row
(:mod:`aspc.io.rows`), which words every error.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from aspc.choices import ON_BAD_LINE
from aspc.errors import ConfigError
from aspc.io.readers import _check_file, check_not_parquet, detect_format
from aspc.io.rows import (  # noqa: F401 - re-exported: the historical home of these names
    BYTES_PER_TOKEN,
    CHAT_ROLES,
    MAX_LENGTH,
    MAX_PROMPT_BYTES,
    _RowError,
    content_id,
    parse_length,
    read_rows,
)
from aspc.io.table import PromptTable, SkippedRow  # noqa: F401
from aspc.memory import release_free_memory

# Files under this are hashed inline; larger ones on a thread beside parsing
# (hashlib releases the GIL on large buffers).
_HASH_THREAD_BYTES = 8 << 20


def file_hash(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _Hasher:
    """sha256 of a file's bytes (or of ``data``), computed on a thread while the caller parses."""

    def __init__(self, path: Path, data: bytes | None = None) -> None:
        self._digest = ""
        self._thread = None
        size = len(data) if data is not None else path.stat().st_size
        if size < _HASH_THREAD_BYTES:
            self._run(path, data)
        else:
            self._thread = threading.Thread(target=self._run, args=(path, data), daemon=True)
            self._thread.start()

    def _run(self, path: Path, data: bytes | None) -> None:
        self._digest = hashlib.sha256(data).hexdigest() if data is not None else file_hash(path)

    def result(self) -> str:
        if self._thread is not None:
            self._thread.join()
        return self._digest


def check_field_names(length_field: str | None, option: str = "--length-field") -> None:
    if length_field is not None and not length_field.strip():
        raise ConfigError(f"{option} is empty; name the field that holds the response lengths")


def read_prompts(
    path: str | os.PathLike,
    *,
    prompt_field: str = "prompt",
    id_field: str = "id",
    length_field: str | None = None,
    on_bad_line: str = "error",
) -> PromptTable:
    """Read and validate a prompt dataset.

    Parameters
    ----------
    path
        A ``.jsonl``, ``.json``, ``.csv`` or ``.parquet`` file.
    prompt_field, id_field
        Field names. Without an id field in the data, ids come from verl's
        ``extra_info.index`` when every row has one, else are content hashes
        when no row has one; a dataset where only some rows have one (in
        whichever order) is refused, as one where only some have the id field.
    length_field
        Optional field of known response lengths: a number or a list of
        numbers (several sampled lengths of the same prompt).
    on_bad_line
        ``"error"`` fails on the first bad row; ``"skip"`` drops bad rows and
        records each in :attr:`PromptTable.skipped` with its reason.

    Raises
    ------
    InputError
        Malformed, empty or inconsistent data; the message names the row.
    """
    from aspc.io import bulk

    if on_bad_line not in ON_BAD_LINE:
        raise ConfigError(f"--on-bad-line must be 'error' or 'skip', not {on_bad_line!r}")
    check_field_names(length_field)
    path = Path(path)
    fmt = detect_format(path)
    _check_file(path)
    fields = {"prompt_field": prompt_field, "id_field": id_field, "length_field": length_field}
    table = None
    digest = ""
    if fmt == "parquet":
        hasher = _Hasher(path)
        table = bulk.read_parquet_bulk(path, **fields)
        digest = hasher.result()
    elif fmt == "jsonl":
        data = path.read_bytes()
        check_not_parquet(data, path)
        hasher = _Hasher(path, data)
        # Handed over in a list: the reader drops the bytes once parsed (peak memory).
        holder = [data]
        del data
        table = bulk.read_jsonl_bulk(holder, **fields)
        digest = hasher.result()
    if table is None:
        table = read_rows(path, on_bad_line=on_bad_line, fmt=fmt, **fields)
    table.input_hash = digest or file_hash(path)
    # Return what the batch buffers and the chunk merge left to the OS, so the
    # compile's own peak (input + plan columns) is not stacked on top of it.
    release_free_memory()
    return table
