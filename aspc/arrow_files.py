"""Files as pyarrow opens them, whatever bytes their names hold."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def arrow_file(path: str | os.PathLike, mode: str = "rb") -> Iterator[Any]:
    """``path`` for ``pq.read_table``/``write_table``: the path itself, or an open file where it is not UTF-8.

    pyarrow encodes a str path as strict UTF-8, so a name that is not (legal on Linux; Python
    holds its bytes as lone surrogates) was refused as unreadable or failed to write. By path
    otherwise: pyarrow reads a path at least as fast as a file it is handed.
    """
    import pyarrow as pa

    name = os.fspath(path)
    try:
        name.encode()
    except UnicodeEncodeError:
        with pa.OSFile(os.fsencode(name), mode) as fh:
            yield fh
        return
    yield name
