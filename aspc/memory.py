"""Handing freed memory back to the OS between the phases of a large compile.

Two allocators keep what a phase frees: Arrow's (mimalloc, the input's
decompression buffers, a gathered column's source) and glibc's (NumPy's
temporaries: after the first large free, glibc raises its mmap threshold, so
later arrays of a few MB come from the heap and stay mapped once freed). The
next phase would fault in new pages on top of them, so a million-prompt
compile's peak RSS was ~50 MB higher at the plan write than the live data
needed (``benchmarks/cli_scale.py``, the README).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import pyarrow as pa


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (musl, macOS, Windows)."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release_free_memory() -> None:
    """Return the memory both allocators hold free to the OS (what is live stays)."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
