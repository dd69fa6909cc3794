"""Checks of the rows ``aspc run --resume`` restores, before any of their values indexes or sizes an array.

A crashed job, a hand edit or another aspc version can leave a committed part holding a minibatch id the
plan lacks, a time that is not finite, a weights version no trainer step published or a sample consumed
by a step the log does not hold. :meth:`Recorder.restore <aspc.runtime.record.recorder.Recorder.restore>`
refuses such a log in one line naming the row and the value, and leaves it as it found it.
"""

from __future__ import annotations

import numpy as np

from aspc.errors import RunError
from aspc.runtime.record import runlog as R
from aspc.runtime.record.metrics import NONFINITE_LOG, nonfinite_time
from aspc.runtime.work import WorkPlan

_ADVICE = "the run log is damaged: start a new run with --overwrite or a new --log"


def sorted_steps(where: str, log: R.RunLog) -> dict[str, np.ndarray]:
    """The log's trainer step rows in step order; a :class:`RunError` unless they are steps 0..n-1."""
    st = R.to_columns(log.tables[R.STEPS])
    order = np.argsort(st["step"], kind="stable")
    st = {k: v[order] for k, v in st.items()}
    n = int(st["step"].size)
    if not np.array_equal(st["step"], np.arange(n)):
        raise RunError(f"{where}: its trainer steps are not 0..{n - 1}")
    return st


def check_restored(
    where: str,
    work: WorkPlan,
    log: R.RunLog,
    mbc: dict[str, np.ndarray],
    steps: dict[str, np.ndarray],
    queue_time: np.ndarray,
    consumed: np.ndarray,
) -> None:
    """Raise :class:`RunError` unless ``log``'s rows fit ``work`` (``where``: "LOG: cannot resume").

    ``mbc``: the minibatch rows' columns; ``steps``: the trainer steps' (already 0..n-1); ``consumed``:
    each restored sample's consumed_step (-1 = not consumed).
    """
    n_mb, n_steps = work.n_minibatches, int(steps["step"].size)
    m = mbc["minibatch"].astype(np.int64)
    if (bad := np.flatnonzero((m < 0) | (m >= n_mb))).size:
        raise RunError(f"{where}: its minibatch row {int(bad[0])} names minibatch {int(m[bad[0]])}, outside this "
                       f"plan's 0..{n_mb - 1}; {_ADVICE}")  # fmt: skip
    bad_time = nonfinite_time({R.MINIBATCHES: mbc, R.STEPS: steps})
    if bad_time is not None:
        raise RunError(f"{where}: {NONFINITE_LOG.format(bad=bad_time)}")
    workers = (log.meta.get("config") or {}).get("workers")  # check_resumable: this run's, an object
    w = mbc["worker"].astype(np.int64)
    if type(workers) is int and (bad := np.flatnonzero((w < 0) | (w >= workers))).size:
        raise RunError(f"{where}: its minibatch {int(m[bad[0]])} ran on worker {int(w[bad[0]])}, outside the run's "
                       f"workers 0..{workers - 1}; {_ADVICE}")  # fmt: skip
    if (bad := np.flatnonzero(~np.isfinite(queue_time))).size:
        raise RunError(f"{where}: its queue row {int(bad[0])} has time {queue_time[bad[0]]}, not a finite "
                       f"number of seconds; {_ADVICE}")  # fmt: skip
    # A version above the log's steps may come from a step not yet durable (it waited on a minibatch still
    # running), but each such step consumed at least one sample: no run of this plan publishes more.
    v = mbc["weights_version"].astype(np.int64)
    top = n_steps + work.n_total_samples
    if (bad := np.flatnonzero((v < 0) | (v > top))).size:
        raise RunError(f"{where}: its minibatch {int(m[bad[0]])} names weights version {int(v[bad[0]])}, which no "
                       f"trainer step of this plan published (it holds {n_steps} steps); {_ADVICE}")  # fmt: skip
    c = consumed.astype(np.int64)
    if (bad := np.flatnonzero((c < -1) | (c >= n_steps))).size:
        held = f"steps 0..{n_steps - 1}" if n_steps else "no trainer step"
        raise RunError(f"{where}: its sample row {int(bad[0])} names trainer step {int(c[bad[0]])} as its consumer, "
                       f"but the log holds {held}; {_ADVICE}")  # fmt: skip
