"""Start-up work of ``aspc run`` done beside the plan read, on a second core."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def runtime_loading(backend: str, plan_path: Path) -> Iterator[None]:
    """Import the runtime and load the sim's kernels on a thread while the caller reads a large plan.

    Reading a plan is Arrow C++ without the GIL; the imports (Numba, the
    run log writer) and Numba's first dispatch take about a second
    of start-up that then costs no wall time. Joined on exit, before anything
    else is imported, so the two threads never import one module at once.
    A simulated run, where no model runs in this process, also keeps to
    small pages (``aspc.memory.small_pages_only``).
    """
    if backend == "sim":
        from aspc.memory import small_pages_only

        small_pages_only()
    try:
        big = plan_path.stat().st_size >= _PRELOAD_BYTES
    except OSError:
        big = False  # read_plan words the error
    thread = None
    if big:
        import aspc.emit.validate  # noqa: F401 - what read_plan imports, before the thread starts

        thread = threading.Thread(target=_preload, args=(backend,), daemon=True)
        thread.start()
    try:
        yield
    finally:
        if thread is not None:
            thread.join()


_PRELOAD_BYTES = 8 << 20  # smaller plans read too fast for a thread to pay


def _preload(backend: str) -> None:
    try:
        import aspc.runtime.api  # noqa: F401
        from aspc.runtime.registry import preload_kernels

        preload_kernels(backend)
    except Exception:  # noqa: BLE001 - preloading is an optimisation; the run itself reports any failure
        pass
