"""Files as pyarrow opens them, whatever bytes their names hold."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
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


def read_parquet_parts(
    files: Sequence[str | os.PathLike], columns: list[str] | None = None, schema: Any = None
) -> Any:
    """``files`` read as one Parquet dataset (``schema``: the first file's where None), ``columns`` of it, a table.

    By path, as before, where every name is UTF-8; else (legal on Linux, and pyarrow
    refused the str path) through the open files :func:`arrow_file` gives.
    """
    # Here: importing pyarrow.dataset imports pandas (~0.5 s), which a run or a compile never needs.
    import pyarrow.dataset as ds

    with contextlib.ExitStack() as stack:
        sources = [stack.enter_context(arrow_file(f)) for f in files]
        if all(isinstance(s, str) for s in sources):
            return ds.dataset(sources, format="parquet", schema=schema).to_table(columns=columns)
        from pyarrow import fs

        fmt, local = ds.ParquetFileFormat(), fs.LocalFileSystem()
        frags = [fmt.make_fragment(s, filesystem=local) if isinstance(s, str) else fmt.make_fragment(s) for s in sources]
        return ds.FileSystemDataset(frags, schema or frags[0].physical_schema, fmt).to_table(columns=columns)
