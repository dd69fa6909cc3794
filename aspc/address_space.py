"""The process's address-space limit (``ulimit -v``), read before anything heavy is imported.

Under a limit of about 1.1 GiB or less, loading aspc's numerical libraries
does not fail cleanly: OpenBLAS (loaded by Numba through SciPy) retries a
failed allocation inside ``dlopen`` forever, ignoring SIGTERM, and LLVM aborts
with "out of memory" (measured on the 2-core development machine, x86-64,
for a 600-prompt compile). So the command line refuses a limit under
:data:`MIN_ADDRESS_SPACE` in one line before it imports them, and an out-of-
memory error under a limit names it.
"""

from __future__ import annotations

import os

# Where the smallest compile, simulate and run loaded and finished (1.2 GB worked, 1.1 GB hung or
# aborted), with headroom for machines whose libraries reserve more per core.
MIN_ADDRESS_SPACE = 1536 << 20


def address_space_limit() -> int | None:
    """The soft ``RLIMIT_AS`` in bytes, or None where there is none (unlimited, or not POSIX)."""
    try:
        import resource
    except ImportError:
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


# Set to 0 to skip the refusal: a command that reads a plan only (check, inspect) may finish under less.
SKIP_ENV = "ASPC_ADDRESS_SPACE_CHECK"


def too_small() -> str | None:
    """The one-line refusal of a limit too small to load aspc's libraries, or None."""
    if os.environ.get(SKIP_ENV) == "0":
        return None
    limit = address_space_limit()
    if limit is None or limit >= MIN_ADDRESS_SPACE:
        return None
    return (f"the address-space limit (ulimit -v) is {limit >> 20:,} MiB; aspc needs at least "
            f"{MIN_ADDRESS_SPACE >> 20:,} MiB (below it the numerical libraries it loads hang or abort): "
            f"raise it with 'ulimit -v unlimited' or 'ulimit -v {MIN_ADDRESS_SPACE >> 10}' "
            f"(or set {SKIP_ENV}=0 to try anyway)")  # fmt: skip


def out_of_memory() -> str:
    """What an out-of-memory error says: the address-space limit too, where one is set."""
    limit = address_space_limit()
    if limit is None:
        return "out of memory; try a smaller input or batch"
    return (f"out of memory under an address-space limit of {limit >> 20:,} MiB (ulimit -v); raise the limit, "
            "or try a smaller input or batch")  # fmt: skip
