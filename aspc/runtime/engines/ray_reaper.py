"""A watcher that ends what is left of the local Ray cluster aspc started when the driver dies without stopping it.

``ray.init`` without an address starts the cluster's processes (GCS server,
raylet, log monitor, ...) as children of the driver with
``PR_SET_PDEATHSIG``: a ``kill -9`` of the driver kills them at once. The
raylet's own children are not covered: the DashboardAgent and the
RuntimeEnvAgent notice the raylet gone at once, then report its unexpected
end to the GCS, which died with the driver, and wait out that call's 60 s
timeout re-parented to init (Ray 2.60
``ray/_private/process_watcher.py``: ``report_raylet_error_logs`` ->
``publish_error_to_driver``, timeout 60). No ``ray.init`` option, system
config or environment variable shortens that wait or starts the cluster
without the agents.

So while aspc owns a local cluster, one small process (this file run as a
script, standard library only, so it starts in milliseconds) follows the
cluster's process tree, once a second, from the processes ``ray.init``
started. When the driver dies without saying that it shut Ray down (its end
of the watcher's stdin closes with no :data:`DONE`), the watcher SIGKILLs
every process of that tree that is still the process it saw (same pid, same
start time), then exits. It runs in a session of its own, so the terminal's
Ctrl-C or a kill of the driver's process group does not end it first.

Linux only (``/proc``); elsewhere Ray has no kernel fate-sharing and starts
its own reaper, which kills the driver's process group.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

DONE = b"done\n"  # the driver's last words after ray.shutdown(): the cluster ended cleanly, kill nothing
POLL_S = 1.0  # seconds between two reads of the tree: processes Ray starts later (actor workers) join it

_watcher: subprocess.Popen | None = None  # the running watcher; one per driver, as Ray is one per process


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks since boot) of ``pid``, or ``None`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()  # the command name may hold spaces and parentheses
        return int(fields[1]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) of every process now."""
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc (a sandbox): no tree to follow, and the run goes on without a watcher
        return out
    for name in names:
        if name.isdigit() and (st := _stat(int(name))) is not None:
            out[int(name)] = st
    return out


def children(pid: int) -> set[int]:
    """The pids of ``pid``'s children now (none off Linux, where no watcher runs)."""
    if not sys.platform.startswith("linux"):
        return set()
    return {p for p, (parent, _) in _table().items() if parent == pid}


def _follow(roots: dict[int, int], seen: dict[int, int]) -> None:
    """Keep in ``seen`` (pid -> start time) the live processes of the tree under ``roots`` (pid -> start time)."""
    table = _table()
    for pid in [p for p, start in seen.items() if table.get(p, (0, -1))[1] != start]:
        del seen[pid]  # ended (or its pid now names another process)
    kids: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        kids.setdefault(parent, []).append(pid)
    todo = [p for p, start in roots.items() if table.get(p, (0, -1))[1] == start]
    while todo:
        pid = todo.pop()
        seen[pid] = table[pid][1]
        todo.extend(kids.get(pid, ()))


def _reap(seen: dict[int, int]) -> None:
    """SIGKILL each process of ``seen`` that is still the one seen (a pid reused since is left alone)."""
    for pid, start in seen.items():
        st = _stat(pid)
        if st is not None and st[1] == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # ended meanwhile
                pass


def watch(roots: set[int]) -> None:
    """Start the watcher over the processes ``roots`` (the driver's children that ``ray.init`` started)."""
    global _watcher
    if _watcher is not None or not roots or not sys.platform.startswith("linux"):
        return
    table = _table()
    args = [f"{p}:{table[p][1]}" for p in sorted(roots) if p in table]
    if not args:
        return
    try:  # -I -S: nothing but the standard library, and this file's folder is not put on sys.path
        _watcher = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), *args],
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)  # fmt: skip
    except OSError:  # the run does not need it: only a kill -9 of the driver would leave the agents a minute
        _watcher = None


def release() -> None:
    """Tell the watcher that Ray was shut down, and wait for it to exit (call after ``ray.shutdown()``)."""
    global _watcher
    proc, _watcher = _watcher, None
    if proc is None or proc.stdin is None:
        return
    try:
        proc.stdin.write(DONE)
        proc.stdin.close()
    except OSError:  # the watcher is gone already
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str]) -> None:
    roots = {int(p): int(s) for p, _, s in (a.partition(":") for a in argv)}
    seen: dict[int, int] = {}
    said = b""
    fd = sys.stdin.fileno()
    while True:
        _follow(roots, seen)
        if select.select([fd], [], [], POLL_S)[0]:
            chunk = os.read(fd, 64)
            if not chunk:  # the driver exited, or closed its end after DONE
                break
            said += chunk
    if not said.endswith(DONE):
        _follow(roots, seen)
        _reap(seen)


if __name__ == "__main__":
    main(sys.argv[1:])
