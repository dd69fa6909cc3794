"""The process's file-creation mask, read as a library should: without changing it."""

from __future__ import annotations

import os
import threading

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask, read without changing it where the kernel says it (Linux 4.7+, /proc).

    ``os.umask(0)`` then ``os.umask(mask)`` sets the mask of the whole process to 0 in between: a host
    thread creating files then (a checkpoint writer) made them world-writable. That pair is the fallback
    only, serialised among aspc's own writers so that two of them can never leave the mask at 0.
    """
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o077)  # the strictest mask meanwhile, not the loosest
        os.umask(mask)
    return mask
