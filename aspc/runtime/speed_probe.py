"""``--speed-probe``: the reference minibatch timed on each worker before and after a run."""

from __future__ import annotations

from typing import Any

from aspc.errors import short_reason


def speed_probes(engine: Any, workers: int, notes: list[str] | None = None) -> list[float | None]:
    """Seconds of the reference minibatch on each worker, one after another (the workers are idle).

    Before the run a failing probe fails the run (that worker could not have
    generated either). After it (``notes`` given) the work is done and
    logged: a worker that cannot probe any more gets ``None`` and a note.
    """
    if notes is None:
        return [engine.speed_probe(w) for w in range(workers)]
    out: list[float | None] = []
    for w in range(workers):
        try:
            out.append(engine.speed_probe(w))
        except Exception as exc:  # noqa: BLE001 - a measurement after the run must not undo the run
            out.append(None)
            notes.append(f"the speed probe after the run failed on worker {w} ({type(exc).__name__}: "
                         f"{short_reason(exc, limit=200)}); its 'after' value is null")
    return out
