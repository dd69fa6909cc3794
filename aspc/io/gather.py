"""Prompt-table columns gathered into a new row order, the big string column on a second core.

A plan holds every prompt in dispatch order, so compiling a million prompts
gathers ~200 MB of prompt text in random order. Arrow's ``take`` runs in C++
without the GIL, so the prompt column is gathered on a thread while the
caller builds everything else (ids, numeric columns, metrics): on two cores
that work costs no wall time.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

# Under this many rows a thread costs more than it saves.
THREAD_ROWS = 50_000


class Background:
    """``fn(*args)`` on a thread (inline when ``threaded`` is False); :meth:`result` waits for it.

    For calls that run in C++ without the GIL (Arrow compute, hashing), so the
    caller's own work goes on beside them.
    """

    def __init__(self, fn: Callable[..., Any], *args: Any, threaded: bool = True) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
            self._thread.start()
        else:
            self._value = fn(*args)

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            self._value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread by result()
            self._error = exc

    def result(self) -> Any:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
        return self._value


def gathered(arr: pa.Array | pa.ChunkedArray, indices: pa.Array) -> Background:
    """``arr.take(indices)``, on a thread for large arrays."""
    return Background(arr.take, indices, threaded=len(indices) >= THREAD_ROWS)


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


# Inputs this large take long enough to read that start-up work fits beside them.
_WARM_BYTES = 8 << 20


def _warm_kernels() -> None:
    import numpy as np

    import aspc.anneal  # noqa: F401 - Numba and the compile kernels' modules
    import aspc.emit.check  # noqa: F401
    from aspc.partition.kernel import _partition_tables

    # The first call of any cached kernel loads Numba's typing registries
    # (~0.5 s once per process); same argument types as the real call, so
    # this loads the cached machine code and compiles nothing.
    one = (np.empty(2), np.empty(2, np.int64), np.empty(2, np.int64))
    none = (np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64))
    _partition_tables(np.zeros(1), 1, 1, 1, 0.0, 0.0, one, none, np.empty(1, np.int64), np.zeros(1, np.int64))
    from aspc.schedule_kernel import float_order_bits, id_keys, lex_argsort

    ends = np.zeros(1, np.int64)
    with np.errstate(over="ignore"):  # the keys wrap on purpose; interpreted, NumPy would warn
        lex_argsort(float_order_bits(np.zeros(1)), id_keys(np.zeros(1, np.uint8), ends, ends, np.uint64(0)))


@contextlib.contextmanager
def kernels_warmed_for(path: str | os.PathLike) -> Iterator[None]:
    """Import Numba and load the compile kernels on a thread while the caller reads ``path``.

    Reading a large Parquet or JSONL file runs mostly in C++ without the GIL,
    so the one-time start-up of the kernels (imports, Numba's first dispatch)
    costs no wall time beside it. Joined on exit, so no import is left
    running when the caller goes on (or the process ends); small inputs skip
    the thread.
    """
    try:
        big = os.stat(path).st_size >= _WARM_BYTES
    except (OSError, TypeError, ValueError):
        big = False  # the reader words the error
    thread = None
    # The imports build a few hundred thousand long-lived objects (Numba's
    # typing registries) and no garbage cycles: with the cyclic collector on,
    # it would traverse them again and again while they are built (~0.2 s CPU
    # on a core the reader wants). Switched back on (if it was on) at exit.
    collecting = big and gc.isenabled()
    if collecting:
        gc.disable()
    if big:
        # What both threads import comes first, so the two never import one module at once.
        import pyarrow.compute  # noqa: F401

        import aspc.emit.schema  # noqa: F401

        thread = threading.Thread(target=_swallow, args=(_warm_kernels,), daemon=True)
        thread.start()
    try:
        yield
    finally:
        if thread is not None:
            thread.join()
        if collecting:
            gc.enable()


def _swallow(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - warming is an optimisation; the real call reports any failure
        pass
