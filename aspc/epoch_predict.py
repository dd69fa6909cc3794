"""What each epoch of ``aspc run --epochs`` replays, and the predictions its plan is compiled from.

Predictions: the last epoch's observed lengths blended into a refit of the
per-run correction of :mod:`aspc.replan`, carried forward by the growth
between the last two epochs (see :mod:`aspc.epochs`). Replayed lengths: the
recorded ones rotated by epoch, scaled by the simulator's length drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa

from aspc import portable_math as pm
from aspc.emit import schema as S
from aspc.emit.plan import Plan
from aspc.io.history import history_groups
from aspc.io.lengths_by_id import LengthsById
from aspc.io.ragged import RaggedLengths
from aspc.io.table import string_column
from aspc.predict.base import LengthPrediction
from aspc.predict.history import DEFAULT_KAPPA, at_least_one_token, blend_history_flat
from aspc.replan import prediction_of, refit_factor


def epoch_lengths(actual: Mapping[str, np.ndarray], epoch: int, n: int, drift: float = 0.0) -> Mapping[str, np.ndarray]:
    """The lengths epoch ``epoch`` (1-based) replays: rotated by ``(epoch-1)*n``, scaled by ``(1+drift)**(epoch-1)``.

    Returned as a :class:`LengthsById` where the prompts' lengths fit one (a run joins it to its plan
    in one call; a dict of 300,000 arrays took seconds to build and join), else as a dict.
    """
    scale = (1.0 + drift) ** (epoch - 1)
    cols = _columns(actual)
    if cols is None:
        out = {}
        for pid, v in actual.items():
            v = np.asarray(v, dtype=np.float64)
            shift = ((epoch - 1) * n) % v.size if v.size else 0
            # No floor: a response that ends at once (0 tokens) replays as 0, as in a run without --epochs.
            out[pid] = np.rint(np.roll(v, -shift) * scale)
        return out
    ids, lengths = cols
    sizes, starts = lengths.sizes(), lengths.offsets[:-1]
    first = np.repeat(starts, sizes)
    # np.roll(v, -shift) of every prompt at once: position i takes v[(i + shift) % size].
    at = np.arange(lengths.values.size, dtype=np.int64) - first + np.repeat(((epoch - 1) * n) % sizes, sizes)
    return LengthsById(ids, RaggedLengths(np.rint(lengths.values[first + at % np.repeat(sizes, sizes)] * scale),
                                          lengths.offsets))  # fmt: skip


def _columns(actual: Mapping[str, np.ndarray]) -> tuple[pa.Array, RaggedLengths] | None:
    """``actual`` as (string ids, lengths), or None where it is not one-dimensional, non-empty lengths by string id."""
    if isinstance(actual, LengthsById):
        return actual.ids, actual.lengths
    keys = list(actual)
    if not keys or not all(type(k) is str for k in keys):
        return None
    arrays = [np.asarray(v, dtype=np.float64) for v in actual.values()]
    if not all(a.ndim == 1 and a.size for a in arrays):
        return None
    try:
        ids = string_column(keys)  # pa.array(keys) would import pandas (~0.5 s) to probe them
    except (pa.ArrowException, UnicodeEncodeError):  # a lone surrogate
        return None
    return ids, RaggedLengths.from_arrays(arrays)


def epoch_prediction(plan: Plan, logs: list[Path]) -> LengthPrediction:
    """Predictions for the next epoch of ``plan``'s prompts from the run logs of the epochs so far."""
    t = plan.table
    ids = t.column(S.PROMPT_ID).to_pylist()
    base = at_least_one_token(prediction_of(t))  # the refit below works in log space too
    # Every log is read (a damaged one is refused as before); the last two say what comes next.
    per_epoch = [_Epoch(history_groups(p), ids) for p in logs][-2:]
    last = per_epoch[-1]
    seen = last.rows >= 0
    seen[seen] = last.sizes[last.rows[seen]] > 0
    obs = np.flatnonzero(seen)
    if obs.size >= 32:
        # Refit of the per-run correction (see aspc.replan) on every observed prompt.
        y = pm.log(np.maximum(last.means()[last.rows[obs]], 1.0))
        f = refit_factor(t.column(S.PROMPT).to_pylist(), base.mean, obs, y)
        base = LengthPrediction(base.mean * f, base.q10 * f, base.q50 * f, base.q90 * f)
    pred = blend_history_flat(base, obs, *last.gather(last.rows[obs]), DEFAULT_KAPPA)
    if len(per_epoch) >= 2:
        # Growth between the last two epochs, carried one epoch forward.
        prev = per_epoch[0]
        common = np.flatnonzero((prev.rows >= 0) & (last.rows >= 0))
        if common.size:
            # Per-prompt means of token counts are exact; the mean over prompts goes in pm's fixed order.
            g = pm.mean(last.means()[last.rows[common]]) / max(pm.mean(prev.means()[prev.rows[common]]), 1e-9)
            pred = LengthPrediction(pred.mean * g, pred.q10 * g, pred.q50 * g, pred.q90 * g)
    return pred


class _Epoch:
    """One epoch's observed lengths, grouped by prompt id, and the group of each plan row (-1: none)."""

    def __init__(self, groups: tuple[list[str], np.ndarray, np.ndarray], ids: list[str]) -> None:
        keys, self.values, self.offsets = groups
        self.sizes = np.diff(self.offsets)
        where = {k: i for i, k in enumerate(keys)}
        self.rows = np.fromiter((where.get(pid, -1) for pid in ids), dtype=np.int64, count=len(ids))
        self._means: np.ndarray | None = None

    def means(self) -> np.ndarray:
        """Each group's ``np.mean``, bit for bit."""
        if self._means is None:
            v, sizes = self.values, self.sizes
            # Sums of whole numbers below 2**53 are exact in any order, so one pass over the groups
            # gives np.mean's own result; anything else is averaged group by group, as np.mean does.
            if sizes.size and sizes.min() > 0 and np.array_equal(v, np.rint(v)) and np.abs(v).sum() < 2.0**53:
                # 0.0 + as np.mean's sum starts: a group of -0.0 means 0.0, not -0.0.
                self._means = (0.0 + np.add.reduceat(v, self.offsets[:-1])) / sizes
            else:
                bounds = self.offsets.tolist()
                self._means = np.array([np.mean(v[s:e]) for s, e in zip(bounds[:-1], bounds[1:], strict=True)],
                                       dtype=np.float64)  # fmt: skip
        return self._means

    def gather(self, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sizes, values) of ``groups``, one after another."""
        sizes = self.sizes[groups]
        ends = np.cumsum(sizes)
        total = int(ends[-1]) if sizes.size else 0
        at = np.repeat(self.offsets[groups] - (ends - sizes), sizes) + np.arange(total, dtype=np.int64)
        return sizes, self.values[at]
