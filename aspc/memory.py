"""Handing freed memory back to the OS between the phases of a large compile.

Two allocators keep what a phase frees: Arrow's (mimalloc, the input's
decompression buffers, a gathered column's source) and glibc's (NumPy's
temporaries: after the first large free, glibc raises its mmap threshold, so
later arrays of a few MB come from the heap and stay mapped once freed). The
next phase would fault in new pages on top of them, so a million-prompt
compile's peak RSS was ~50 MB higher at the plan write than the live data
needed (``benchmarks/cli_scale.py``, the README).

The commands that hold a million prompts also keep to small pages
(``small_pages_only``): the README's "The command at scale" measures why.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

import pyarrow as pa


@functools.cache
def _libc():
    """The C library (glibc, musl), or None where ctypes cannot load it."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _malloc_trim():
    """glibc's ``malloc_trim``, or None (musl, macOS, Windows)."""
    return getattr(_libc(), "malloc_trim", None)


# prctl(2) option, <linux/prctl.h>: no transparent huge pages for this process
# (inherited by its children, kept across exec).
_PR_SET_THP_DISABLE = 41
# Set to 1 to keep the kernel's huge-page policy (benchmarks compare both).
HUGE_PAGES_ENV = "ASPC_HUGE_PAGES"


def _prctl():
    return getattr(_libc(), "prctl", None)


def small_pages_only() -> bool:
    """Back this process's memory with 4 KiB pages only; True if Linux took the request.

    NumPy asks for huge pages on every array of 4 MB or more and Arrow's
    mimalloc on its 1 GiB arena; a compile touches ~1.6 GB once and frees most
    of it. On a virtual machine that hands free guest memory back to its host
    (free-page reporting works on 2 MiB blocks: what a huge page needs),
    huge-page faults are slow, most likely because they land on memory the
    host has to supply again, while 4 KiB faults reuse pages the guest freed
    a moment ago. On one such VM (the README's figures) the kernel's zeroing
    of huge pages was a third of a million-prompt compile's CPU time; small
    pages cost ~0.3 M more minor faults and cut its system time from 4.6-5.9 s
    to 1.2-2.1 s. For the offline commands only: a process that runs a model
    keeps huge pages.
    """
    if not sys.platform.startswith("linux") or os.environ.get(HUGE_PAGES_ENV) == "1":
        return False
    prctl = _prctl()
    if prctl is None:
        return False
    return prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0


def release_free_memory() -> None:
    """Return the memory both allocators hold free to the OS (what is live stays)."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def available_bytes() -> int | None:
    """The memory the kernel says a new allocation can have (``MemAvailable``), or ``None`` where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
