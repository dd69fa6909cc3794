"""What each epoch of ``aspc run --epochs`` replays, and the predictions its plan is compiled from.

Predictions: the last epoch's observed lengths blended into a refit of the
per-run correction of :mod:`aspc.replan`, carried forward by the growth
between the last two epochs (see :mod:`aspc.epochs`). Replayed lengths: the
recorded ones rotated by epoch, scaled by the simulator's length drift.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aspc import portable_math as pm
from aspc.emit import schema as S
from aspc.emit.plan import Plan
from aspc.io.history import read_history
from aspc.predict.base import LengthPrediction
from aspc.predict.history import DEFAULT_KAPPA, at_least_one_token, blend_history
from aspc.replan import prediction_of, refit_factor


def epoch_lengths(actual: dict[str, np.ndarray], epoch: int, n: int, drift: float = 0.0) -> dict[str, np.ndarray]:
    """The lengths epoch ``epoch`` (1-based) replays: rotated by ``(epoch-1)*n``, scaled by ``(1+drift)**(epoch-1)``."""
    scale = (1.0 + drift) ** (epoch - 1)
    out = {}
    for pid, v in actual.items():
        v = np.asarray(v, dtype=np.float64)
        shift = ((epoch - 1) * n) % v.size if v.size else 0
        # No floor: a response that ends at once (0 tokens) replays as 0, as in a run without --epochs.
        out[pid] = np.rint(np.roll(v, -shift) * scale)
    return out


def epoch_prediction(plan: Plan, logs: list[Path]) -> LengthPrediction:
    """Predictions for the next epoch of ``plan``'s prompts from the run logs of the epochs so far."""
    t = plan.table
    ids = t.column(S.PROMPT_ID).to_pylist()
    base = at_least_one_token(prediction_of(t))  # the refit below works in log space too
    per_epoch = [read_history(p) for p in logs]
    last = per_epoch[-1]
    observed = [last.get(pid) for pid in ids]
    seen = np.array([o is not None and o.size > 0 for o in observed])
    if seen.sum() >= 32:
        # Refit of the per-run correction (see aspc.replan) on every observed prompt.
        obs = np.flatnonzero(seen)
        y = pm.log(np.maximum([float(np.mean(observed[i])) for i in obs], 1.0))
        f = refit_factor(t.column(S.PROMPT).to_pylist(), base.mean, obs, y)
        base = LengthPrediction(base.mean * f, base.q10 * f, base.q50 * f, base.q90 * f)
    pred = blend_history(base, observed, DEFAULT_KAPPA)
    if len(per_epoch) >= 2:
        # Growth between the last two epochs, carried one epoch forward.
        prev = per_epoch[-2]
        common = [pid for pid in ids if pid in prev and pid in last]
        if common:
            # Per-prompt means of token counts are exact; the mean over prompts goes in pm's fixed order.
            g = pm.mean([np.mean(last[p]) for p in common]) / max(pm.mean([np.mean(prev[p]) for p in common]), 1e-9)
            pred = LengthPrediction(pred.mean * g, pred.q10 * g, pred.q50 * g, pred.q90 * g)
    return pred
