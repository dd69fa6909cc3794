"""Prompt-table columns gathered into a new row order, the big string column on a second core.

A plan holds every prompt in dispatch order, so compiling a million prompts
gathers ~200 MB of prompt text in random order. Arrow's ``take`` runs in C++
without the GIL, so the prompt column is gathered on a thread while the
caller builds everything else (ids, numeric columns, metrics): on two cores
that work costs no wall time.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyarrow as pa

# Under this many rows a thread costs more than it saves.
_THREAD_ROWS = 50_000


class Gathered:
    """``arr.take(indices)``, computed on a thread for large arrays; :meth:`result` waits for it."""

    def __init__(self, arr: pa.Array | pa.ChunkedArray, indices: pa.Array) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if len(indices) < _THREAD_ROWS:
            self._value = arr.take(indices)
        else:
            self._thread = threading.Thread(target=self._run, args=(arr, indices), daemon=True)
            self._thread.start()

    def _run(self, arr: pa.Array | pa.ChunkedArray, indices: pa.Array) -> None:
        try:
            self._value = arr.take(indices)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread by result()
            self._error = exc

    def result(self) -> pa.Array | pa.ChunkedArray:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
        return self._value


def dispatch_positions(bounds: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Row positions (into the rows ``bounds`` splits) of minibatches ``order`` laid end to end.

    The same as concatenating ``arange(bounds[k], bounds[k + 1])`` for each
    ``k`` in ``order``, without a Python loop over minibatches.
    """
    bounds = np.asarray(bounds, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    lens = bounds[order + 1] - bounds[order]
    out_starts = np.cumsum(lens) - lens
    n = int(lens.sum())
    return np.repeat(bounds[order] - out_starts, lens) + np.arange(n, dtype=np.int64)
