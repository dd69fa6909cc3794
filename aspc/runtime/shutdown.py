"""Closing what a run owns, and what its log says when closing fails.

The engine, the backend and the trainer are closed after the last trainer
step: stopping Ray actors or a vLLM engine takes seconds, long enough for a
Ctrl-C to land there. A signal or an error that escapes the close must still
leave the log marked (``interrupted`` or ``failed``, resumable), never as a
crash leaves it (``running``).
"""

from __future__ import annotations

import os
from typing import Any

from aspc.errors import OutputError, RunError
from aspc.runtime.contracts import trainer_hook


def close_run(engine: Any, backend: Any, trainer: Any, closes: tuple[bool, bool], writer: Any, flush: Any) -> Any:
    """Close what this run owns (``closes``: backend, trainer); the trainer's close() failure, or ``None``.

    ``writer`` is the run log's writer while the log is still open (``None``
    once the run's own failure marked it, or when there is no log): what
    escapes the close marks the log with ``flush`` committing what is left.
    """
    try:
        engine.close(keep_workers=not closes[0])
        if closes[0]:
            backend.close()
        return trainer_hook(trainer, "close", fail=False) if closes[1] else None
    except BaseException as exc:
        if writer is not None:
            writer.abort(exc, flush)
        raise


def disk_full(exc: OutputError, log_dir: str | os.PathLike | None) -> RunError:
    """The one-line error for a run log that ran out of space: every committed part is kept."""
    return RunError(
        f"run log {log_dir}: {exc}; every committed part is kept and the log is resumable: "
        "free space, then rerun with --resume"
    )
