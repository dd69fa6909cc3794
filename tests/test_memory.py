"""aspc.memory: freed memory goes back to the OS between a compile's phases."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from aspc import memory


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux") or memory._malloc_trim() is None, reason="glibc only")
def test_freed_numpy_temporaries_leave_the_process():
    # After one large free glibc raises its mmap threshold: arrays of a few MB then come from the
    # heap, where freeing them keeps their pages mapped (what a compile's temporaries do).
    big = np.ones(16 << 20, dtype=np.uint8)  # glibc raises the threshold to a freed chunk of at most 32 MiB
    del big
    parts = [np.ones(3 << 20, dtype=np.uint8) for _ in range(60)]  # 180 MiB, touched
    # Every sixth stays live, so each freed run lies under a live chunk: glibc cannot shrink the heap's
    # top past them by itself, wherever in the heap (a fresh end or old holes) they were placed.
    pins = parts[5::6]
    held = _rss_mib()
    del parts
    before = _rss_mib()
    memory.release_free_memory()
    after = _rss_mib()
    assert all(int(p[0]) == 1 for p in pins)
    if held - before > 60:
        pytest.skip("this allocator returned the freed arrays by itself: nothing left to show")
    assert held - after > 100, (held, before, after)


def test_release_runs_without_glibc(monkeypatch):
    monkeypatch.setattr(memory, "_malloc_trim", lambda: None)
    memory.release_free_memory()


def _thp_enabled(code: str, env: dict[str, str] | None = None) -> int | None:
    """``THP_enabled`` of /proc/self/status after ``code`` ran in a fresh interpreter (None: not reported)."""
    import os
    import subprocess

    # Start from the kernel's default: a test process whose in-process compile turned huge pages
    # off hands that on to its children.
    reset = "import ctypes\nctypes.CDLL(None).prctl(41, 0, 0, 0, 0)\n"
    prog = f"{reset}{code}\nprint(*[ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('THP_enabled:')])"
    res = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})})  # fmt: skip
    return int(res.stdout) if res.stdout.strip() else None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_THP_DISABLE) is Linux's")
def test_small_pages_only_turns_huge_pages_off_for_the_process():
    before = _thp_enabled("from aspc import memory")
    if before is None:
        pytest.skip("this kernel does not report THP_enabled (Linux < 5.0)")
    assert before == 1  # the default: a madvise() may get huge pages
    assert _thp_enabled("from aspc import memory\nassert memory.small_pages_only()", {memory.HUGE_PAGES_ENV: "0"}) == 0
    kept = "from aspc import memory\nassert not memory.small_pages_only()"
    assert _thp_enabled(kept, {memory.HUGE_PAGES_ENV: "1"}) == 1


def test_small_pages_only_is_a_no_op_without_prctl(monkeypatch):
    monkeypatch.setattr(memory, "_prctl", lambda: None)
    monkeypatch.delenv(memory.HUGE_PAGES_ENV, raising=False)
    assert memory.small_pages_only() is False
