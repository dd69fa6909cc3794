"""Numba flags for every aspc kernel, in one place.

``cache=True`` writes compiled machine code next to the module so a warm
``aspc compile`` pays no JIT cost. ``fastmath`` stays off: the kernels compare
floating costs for exact ties and must give the same plan on every machine.
Set ``NUMBA_DISABLE_JIT=1`` to run kernels as plain Python (coverage, debug).

Numba finds a cache directory in this order: ``NUMBA_CACHE_DIR``, the
package's own ``__pycache__``, the user's cache directory (``~/.cache``).
When none is writable (a read-only install run by a user whose HOME is not
writable) it refuses to decorate a ``cache=True`` function at all
("cannot cache function ...: no locator available"). So before any kernel is
decorated we probe the same places and, if all fail, point
``NUMBA_CACHE_DIR`` at a per-user directory under the system temp dir; if
even that is unwritable, caching is switched off (kernels then compile on
every run, about a second each, but work). :data:`CACHE_NOTE` says which.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def _writable_dir(path: Path) -> bool:
    """True when ``path`` exists or can be made, and a file can be created in it (numba's own test)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def _user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "numba"


def choose_cache(package_dir: Path | None = None) -> tuple[bool, str | None, str]:
    """Decide how kernels cache: (cache enabled, NUMBA_CACHE_DIR to set or None, note).

    Parameters
    ----------
    package_dir
        Where the kernels' sources live (default: this package).
    """
    pkg = package_dir if package_dir is not None else Path(__file__).resolve().parent
    candidates = [Path(os.environ["NUMBA_CACHE_DIR"])] if os.environ.get("NUMBA_CACHE_DIR") else []
    candidates += [pkg / "__pycache__", _user_cache_dir()]
    # Numba takes the first that works, so one writable candidate is enough.
    if any(_writable_dir(c) for c in candidates):
        return True, None, ""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    fallback = Path(tempfile.gettempdir()) / f"aspc-numba-cache-{uid}"
    if _writable_dir(fallback):
        return True, str(fallback), f"numba cache: package dir and HOME not writable, caching in {fallback}"
    return False, None, "numba cache: no writable cache directory; kernels compile on every run"


def _apply() -> tuple[bool, str]:
    enabled, cache_dir, note = choose_cache()
    if cache_dir is not None:
        os.environ["NUMBA_CACHE_DIR"] = cache_dir
        # numba reads the variable once, when numba.core.config is imported.
        config = sys.modules.get("numba.core.config")
        if config is not None:
            config.CACHE_DIR = cache_dir
    return enabled, note


_CACHE_ENABLED, CACHE_NOTE = _apply()

NJIT_FLAGS = {"cache": _CACHE_ENABLED, "fastmath": False, "nogil": True}

# For kernels whose outer loop has independent iterations (one minibatch
# each, no reductions across them): results do not depend on thread count.
NJIT_PARALLEL_FLAGS = {**NJIT_FLAGS, "parallel": True}


def parallel_njit(fn: Any) -> Any:
    """``fn`` compiled with :data:`NJIT_PARALLEL_FLAGS`, run serially in a ``fork()``ed child of a process
    that ran parallel kernels on GNU OpenMP.

    GNU OpenMP cannot start its threads again after a fork: Numba's ``omp`` layer then ends the child
    ("Terminating: fork() called from a process already using GNU OpenMP", killed by SIGTERM), and a
    ``multiprocessing.Pool`` of such children waits for ever. Such a child compiles (uncached) and runs the
    kernel without ``parallel``: its outer iterations are independent, so the results are the same.
    """
    from numba import njit

    return _ForkAware(njit(**NJIT_PARALLEL_FLAGS)(fn), fn)


class _ForkAware:
    """A parallel kernel and, made when first needed, its serial twin (see :func:`parallel_njit`)."""

    def __init__(self, parallel: Any, fn: Any) -> None:
        self._parallel, self._fn, self._serial = parallel, fn, None
        self.__doc__, self.__name__, self.__wrapped__ = fn.__doc__, fn.__name__, fn

    def __call__(self, *args: Any) -> Any:
        if not _FORKED_AFTER_GOMP:
            return self._parallel(*args)
        if self._serial is None:
            from numba import njit

            # Not cached: an index entry of the serial compile would sit under the parallel one's name.
            self._serial = njit(**{**NJIT_FLAGS, "cache": False})(self._fn)
        return self._serial(*args)

    def __getattr__(self, name: str) -> Any:  # py_func, signatures, ...: the parallel dispatcher's
        return getattr(self._parallel, name)


_FORKED_AFTER_GOMP = False


def _after_fork_in_child() -> None:
    global _FORKED_AFTER_GOMP
    numba = sys.modules.get("numba")
    if numba is None or _FORKED_AFTER_GOMP:
        return
    try:
        layer = numba.threading_layer()
    except (ValueError, AttributeError):  # no parallel kernel ran in the parent
        return
    _FORKED_AFTER_GOMP = layer == "omp"  # Intel's OpenMP survives a fork; which one is loaded is not said


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
