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


# The batch size pyarrow.dataset's scanner cuts row groups at.
_SCAN_ROWS = 131_072


def read_parquet_parts(
    files: Sequence[str | os.PathLike], columns: list[str] | None = None, schema: Any = None
) -> Any:
    """``files`` read as one Parquet dataset (``schema``: the first file's where None), ``columns`` of it, a table.

    Files all of that schema (a run log's parts always are) are read one by one, chunked as the
    dataset scanner chunks them, so a table written back holds the same bytes: pyarrow.dataset
    imports pandas (~0.4 s of every report, resume and run). Any other mix, or a file that fails,
    goes to the dataset as before (and fails with the message it always gave).
    """
    import pyarrow as pa

    with contextlib.ExitStack() as stack:
        sources = [stack.enter_context(arrow_file(f)) for f in files]
        try:
            table = _read_alike(stack, sources, columns, schema)
        except (pa.ArrowException, OSError):
            table = None
        return table if table is not None else _read_dataset(sources, columns, schema)


def _read_alike(stack: contextlib.ExitStack, sources: list[Any], columns: list[str] | None, schema: Any) -> Any:
    """The dataset's table of ``sources`` read without it, or None where their schemas differ."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pfs = [stack.enter_context(pq.ParquetFile(s)) for s in sources]
    if not pfs:
        return None
    want = schema if schema is not None else pfs[0].schema_arrow
    names = want.names if columns is None else columns
    if len(set(names)) < len(names) or not set(names) <= set(want.names):
        return None
    if not all(pf.schema_arrow.equals(want) for pf in pfs):
        return None
    out = pa.schema([want.field(n) for n in names], metadata=want.metadata)
    return pa.concat_tables([_scanned(pf, names, out) for pf in pfs])


def _scanned(pf: Any, columns: list[str], schema: Any) -> Any:
    """``pf``'s ``columns`` in the chunks pyarrow.dataset gives: each row group cut at _SCAN_ROWS, none empty
    but an empty file's one."""
    import pyarrow as pa

    batches = [b for i in range(pf.num_row_groups) for b in pf.read_row_group(i, columns=columns).to_batches(_SCAN_ROWS)]
    return pa.Table.from_batches(batches, schema) if batches else empty_table(schema)


def empty_table(schema: Any) -> Any:
    """``schema.empty_table()`` (one empty chunk a column), which imports pandas."""
    import pyarrow as pa

    return pa.Table.from_batches([pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)])


def _read_dataset(sources: list[Any], columns: list[str] | None, schema: Any) -> Any:
    """By path, as before, where every name is UTF-8; else (legal on Linux, and pyarrow refused the str
    path) through the open files :func:`arrow_file` gives."""
    import pyarrow.dataset as ds

    if all(isinstance(s, str) for s in sources):
        return ds.dataset(sources, format="parquet", schema=schema).to_table(columns=columns)
    from pyarrow import fs

    fmt, local = ds.ParquetFileFormat(), fs.LocalFileSystem()
    frags = [fmt.make_fragment(s, filesystem=local) if isinstance(s, str) else fmt.make_fragment(s) for s in sources]
    return ds.FileSystemDataset(frags, schema or frags[0].physical_schema, fmt).to_table(columns=columns)
