"""Parquet files read row by row: the records of the fields a reader uses, each text cell checked as UTF-8.

The row readers' Parquet half (:func:`aspc.io.readers.iter_numbered_records` yields these records).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aspc.arrow_files import arrow_file
from aspc.errors import InputError, short_reason


class BadTextRow(dict):
    """A Parquet record with a :data:`BAD_TEXT` cell (the row reader checks only the fields it reads)."""


class BadText:
    """A Parquet string cell whose bytes are not UTF-8 (binary data stored with a string type)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<invalid UTF-8>"


BAD_TEXT = BadText()


def read_parquet_table(path: Path, columns: tuple[str, ...] | None = None):
    """Read a Parquet file, mapping Arrow errors to InputError.

    ``columns``: only those of them the file has (rows of no fields when it has none). A column no reader
    looks at (a date past Python's range, a struct naming a field twice, a corrupt chunk) then refuses
    nothing, as in the bulk readers, which decode only what they use.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # A name that is not UTF-8 (legal on Linux) is opened by its bytes: pyarrow refused it.
        with arrow_file(path) as fh:
            names = pq.read_schema(fh).names
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is None:
            wanted = [n for n in names if n in columns] if columns is not None else None
            with arrow_file(path) as fh:
                return pq.read_table(fh, columns=wanted)  # none of them: rows of no fields, each "missing ..."
    except MemoryError:  # pyarrow's ArrowMemoryError too: out of memory, not a bad file
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"{path.name}: not a readable Parquet file ({short_reason(exc)}); check the file") from None
    raise InputError(f"{path.name}: two columns are named {twice!r}; rename or drop one")


def iter_parquet(path: Path, columns: tuple[str, ...] | None = None) -> Iterator[tuple[int, int, Any]]:
    import pyarrow as pa

    table = read_parquet_table(path, columns)
    row = 0
    try:
        batches = table.to_batches(max_chunksize=65536)
        for batch in batches:
            try:
                recs = batch.to_pylist()
            except UnicodeDecodeError:
                recs = _records_with_bad_text(batch)
            for rec in recs:
                yield row, row + 1, rec
                row += 1
    except MemoryError:
        raise
    except (pa.ArrowException, ValueError, OverflowError) as exc:  # OverflowError: a date past Python's range
        raise InputError(f"{path.name}: row {row + 1}: unreadable Parquet data ({short_reason(exc)})") from None


def _records_with_bad_text(batch) -> list[dict[str, Any]]:
    """The batch's records, each cell that is not UTF-8 read as :data:`BAD_TEXT`.

    Converting the whole batch failed at its first row; a bad cell in a column
    the row reader never looks at must not refuse the row, and one it does
    look at names its own row (and can be skipped).
    """
    columns = []
    for col in batch.columns:
        try:
            columns.append(col.to_pylist())
        except UnicodeDecodeError:
            columns.append([_cell(col, i) for i in range(len(col))])
    names = batch.schema.names
    return [
        (BadTextRow if any(v is BAD_TEXT for v in values) else dict)(zip(names, values, strict=True))
        for values in zip(*columns, strict=True)
    ]


def _cell(col, i: int) -> Any:
    try:
        return col[i].as_py()
    except UnicodeDecodeError:
        return BAD_TEXT


def ids_complete(path: Path, id_field: str) -> bool:
    """Whether the Parquet file at ``path`` has an ``id_field`` column without nulls, so that no row takes
    its id from ``extra_info``; False where that cannot be read (the row reader then says why)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with arrow_file(path) as fh:
            pf = pq.ParquetFile(fh)
            if pf.schema_arrow.names.count(id_field) != 1:
                return False
            return pf.read(columns=[id_field]).column(id_field).null_count == 0
    except MemoryError:  # pa.ArrowMemoryError too
        raise
    except (pa.ArrowException, OSError, ValueError):
        return False
