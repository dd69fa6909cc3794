"""Known lengths keyed by prompt id, kept as columns: an Arrow id array and ragged lengths.

``aspc simulate`` replays each prompt's recorded lengths. A Python dict of a
million ids to a million small arrays costs ~0.5 s to build and ~200 MB, and
joining it to the plan row by row a few seconds more; this mapping holds the
two columns the reader already has, joins by id in C++
(``pyarrow.compute.index_in``), and still behaves as a read-only
``dict[str, np.ndarray]`` for code that looks ids up one at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aspc.io.ragged import RaggedLengths
from aspc.io.table import arrow_scalar, column_numpy, string_column


class LengthsById(Mapping):
    """``ids[i] -> lengths[i]``: unique string ids and one segment of lengths each."""

    def __init__(self, ids: pa.Array | pa.ChunkedArray, lengths: RaggedLengths) -> None:
        if len(ids) != len(lengths):
            raise ValueError(f"{len(ids)} ids for {len(lengths)} length entries")
        self.ids = ids if ids.type == pa.string() else ids.cast(pa.string())
        self.lengths = lengths
        self._row: dict[str, int] | None = None

    def _rows(self) -> dict[str, int]:
        if self._row is None:
            self._row = {pid: i for i, pid in enumerate(self.ids.to_pylist())}
        return self._row

    def __getitem__(self, pid: str) -> np.ndarray:
        return self.lengths[self._rows()[pid]]

    def __contains__(self, pid: object) -> bool:
        return pid in self._rows()

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids.to_pylist())

    def __len__(self) -> int:
        return len(self.ids)

    def rows_of(self, ids: pa.Array | pa.ChunkedArray | Sequence[str]) -> np.ndarray:
        """Row of each of ``ids`` here (int64), ``-1`` where an id is absent."""
        if not isinstance(ids, (pa.Array, pa.ChunkedArray)):
            ids = string_column(list(ids))  # pa.array would import pandas to probe them
        elif ids.type != pa.string():
            ids = ids.cast(pa.string())
        found = pc.index_in(ids, value_set=self.ids)
        if isinstance(found, pa.ChunkedArray):
            found = pa.concat_arrays(found.chunks) if found.num_chunks != 1 else found.chunk(0)
        return column_numpy(found.cast(pa.int64()).fill_null(arrow_scalar(-1, pa.int64())))  # no pandas probe

    def join(self, ids: pa.Array | pa.ChunkedArray | Sequence[str]) -> tuple[np.ndarray, RaggedLengths | None]:
        """(positions of ``ids`` that have no lengths here, their lengths in ``ids`` order or None if any is missing)."""
        rows = self.rows_of(ids)
        missing = np.flatnonzero(rows < 0)
        if missing.size:
            return missing, None
        return missing, self.lengths.take(rows)
