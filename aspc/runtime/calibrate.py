"""Fit the simulator's cost model from a run log (``aspc calibrate``).

Each minibatch row of a run log carries the features of the step model
summed over its decode steps: ``max_len`` (steps), ``tokens`` (Σ active
sequences over steps), ``context_tokens`` (Σ context over steps) and
``prompt_tokens`` (prefill). Its duration is linear in the coefficients::

    end - start = p0 + p1·prompt_tokens + a·max_len + b·tokens + c·context_tokens

and a trainer step's is ``α + β·tokens``. Both are fitted by non-negative
least squares (a negative seconds-per-token has no meaning).

A minibatch row alone barely tells the per-step term ``a`` from the
per-sequence term ``b``: in a plan of equal minibatch sizes ``tokens`` and
``max_len`` move together. A run with continuous returns (``--return-mode
continuous``) also timed every sample: sample ``i`` of a minibatch left the
engine after its own ``l_i`` steps, at::

    finish_i - start = p0 + p1·prompt_tokens + a·l_i + b·Σ_j min(l_j, l_i)
                       + c·Σ_j (min(l_j, l_i)·p_j + min(l_j, l_i)(min(l_j, l_i) - 1)/2)

(the active set shrinks as sequences end), so such a log is fitted on its
sample rows, one per sample, which separate ``a`` from ``b`` by how the
step time falls as sequences finish. A static-return run keeps its samples
until the minibatch ends, but since run log format 1.2 every sample row also
holds ``decode_time``, the seconds from its minibatch's start to its last
token as the backend saw it, so static logs are fitted on sample rows too
(``finish_i - start`` above is then ``decode_time``). Not so for the ``hf``
backend: its static ``generate`` keeps computing finished rows, so the
active set does not shrink and the sample formula above does not hold; its
logs are fitted on minibatch rows. R² and the relative error are still
reported on minibatch durations.

Few rows (an older static log: one per minibatch, 20-odd for five
coefficients) make a five-coefficient fit chase noise, so below
:data:`~aspc.runtime.calibrate_fit.MIN_ROWS_PER_COEF` rows per coefficient the coefficients that are
left free are chosen by cross-validation over whole minibatches (the others
stay at 0): of all subsets, the one predicting held-out minibatches best,
the smallest one where several tie.

Load on a shared machine changes between minibatches, which a plain fit of
sample rows reads as coefficients, so sample rows are fitted with one speed
factor per minibatch (:func:`fit_with_speeds`: a minibatch's own rows fix
the coefficients' shape, whatever speed it ran at), then scaled so the
log's total minibatch time is reproduced. Standard errors resample whole
minibatches (a minibatch's sample rows share its noise: each is a prefix of
the same run of steps): a bootstrap for sample-row fits, cluster-robust
sandwich errors for minibatch rows.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from aspc.errors import RunError
from aspc.runtime.backends.sim_cost import COEFFICIENT_MAX, SimCostModel
from aspc.runtime.calibrate_fit import (  # noqa: F401 - nnls and select_free are part of this module's API
    BOOTSTRAP_MAX_ROWS,
    bootstrap_std_errors,
    cluster_std_errors,
    fit_generation,
    fit_with_speeds,
    keep_unmeasured,
    nnls,
    select_free,
    unseparated,
)
from aspc.runtime.record import runlog as R
from aspc.runtime.record.metrics import NONFINITE_LOG, nonfinite_time

# Rows needed per fit: a few more than unknowns, or the fit is not a fit.
MIN_MINIBATCHES = 8
MIN_STEPS = 3
# κ beyond this ranks minibatches by their longest sequence alone (sequences no longer matter).
MAX_MINIBATCH_OVERHEAD = 1000.0
# Generation coefficients, in the column order of the fit's rows.
GEN_COEFS = ("prefill_base", "prefill_per_token", "decode_base", "decode_per_seq", "decode_per_context_token")
# Backends whose static generation computes every sequence until the longest ends (no shrinking active set).
PADDED_BACKENDS = frozenset({"hf"})


@dataclass
class Calibration:
    """A fitted cost model and how well it explains the log."""

    sim_cost_model: SimCostModel  # the fitted coefficients (defaults where a fit was impossible)
    n_minibatches: int  # minibatch rows used
    n_steps: int  # trainer-step rows used
    r2_generation: float | None  # R² of minibatch durations
    r2_trainer: float | None  # R² of trainer-step durations; None if not fitted
    generation_rel_error: float | None  # |Σ predicted - Σ measured| / Σ measured, minibatch time
    notes: list[str]  # what was not fitted and why
    # Standard error per fitted coefficient (generation: a bootstrap over minibatches for sample-row fits
    # of real logs, else cluster-robust by minibatch); None = held at 0 (or its default) by the fit.
    std_errors: dict[str, float | None] = field(default_factory=dict)
    fit_rows: str = "minibatches"  # what the generation coefficients were fitted on: "samples" or "minibatches"
    n_fit_rows: int = 0  # rows of that fit
    # Mean seconds of the log's speed probes (aspc run --speed-probe), None without: how fast the machine
    # was while the fitted run ran; scale a prediction by probe_B / probe_A to compare at equal speed.
    speed_probe_s: float | None = None

    @property
    def minibatch_overhead(self) -> float | None:
        """``aspc compile --minibatch-overhead`` matching this fit: seconds per decode step over seconds per
        active sequence, capped at :data:`MAX_MINIBATCH_OVERHEAD`; None if neither was fitted above 0.

        The compiler charges a minibatch ``(|b| + κ)·max``; an engine that stops computing finished
        sequences (vLLM) spends ``a·max + b·Σ len ≤ b·(|b| + a/b)·max`` on it, so ``κ = a/b``.
        """
        a, b = self.sim_cost_model.decode_base, self.sim_cost_model.decode_per_seq
        if a <= 0 and b <= 0:
            return None
        return MAX_MINIBATCH_OVERHEAD if b <= 0 else min(a / b, MAX_MINIBATCH_OVERHEAD)


def _r2(y: np.ndarray, pred: np.ndarray) -> float | None:
    ss = float(((y - y.mean()) ** 2).sum())
    # Durations equal up to the clock subtraction's last bits have nothing to explain: an R² of that
    # rounding noise came out 0 or -3.7 for a fit that reproduces every one of them.
    if ss <= y.size * (1e-9 * float(np.abs(y).max(initial=0.0))) ** 2:
        return None
    return 1.0 - float(((y - pred) ** 2).sum()) / ss


def sample_rows(
    samples: dict[str, np.ndarray], minibatches: dict[str, np.ndarray], *, continuous: bool | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step-model features of each sample's own finish, its seconds from its minibatch's start, its minibatch.

    Rows as in the module docstring: (1, minibatch prompt tokens, l_i,
    Σ_j min(l_j, l_i), context term). The seconds are the sample's
    ``decode_time``; where a log has none (before format 1.2) and its
    samples returned continuously (``continuous``; found from the log when
    None), ``finish_time - start``; other samples are left out. The third
    array is each row's minibatch position in ``minibatches``.

    Vectorised over all minibatches by sorting samples by (minibatch,
    length): the sums over shorter samples are prefix sums, the
    longer-or-equal ones contribute ``l_i`` each. Features use every sample
    of a minibatch, also those left out for lack of a time.
    """
    pos = _positions(minibatches["minibatch"], samples["minibatch"])
    keep = pos >= 0  # samples of minibatches the log has rows for
    row = pos[keep]
    if not row.size:  # none: the sums below assume at least one
        return np.empty((0, 5)), np.empty(0), row
    lens = np.asarray(samples["response_len"], dtype=np.float64)[keep]
    ptok = np.asarray(samples["prompt_tokens"], dtype=np.float64)[keep]
    y = np.full(row.size, np.nan)
    if "decode_time" in samples:
        y = np.asarray(samples["decode_time"], dtype=np.float64)[keep].copy()
    missing = np.isnan(y)
    if missing.any():
        if continuous is None:
            continuous = is_continuous(samples, minibatches)
        if continuous and "finish_time" in samples:
            fin = np.asarray(samples["finish_time"], dtype=np.float64)[keep]
            y[missing] = fin[missing] - np.asarray(minibatches["start"], dtype=np.float64)[row[missing]]
    order = np.lexsort((lens, row))
    r, ls, ps = row[order], lens[order], ptok[order]
    n = r.size
    idx = np.arange(n)
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = r[1:] != r[:-1]
    new_tie = new_group.copy()
    new_tie[1:] |= ls[1:] != ls[:-1]
    g0 = np.maximum.accumulate(np.where(new_group, idx, 0))  # first position of the sample's minibatch
    first = np.maximum.accumulate(np.where(new_tie, idx, 0))  # first position of its length within it
    ends = np.flatnonzero(np.append(new_group[1:], True)) + 1
    g1 = np.repeat(ends, np.diff(np.concatenate([[0], ends])))  # one past the minibatch's last position

    def cum(v: np.ndarray) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum(v)])

    c_l, c_lp, c_tri, c_p = cum(ls), cum(ls * ps), cum(ls * (ls - 1) / 2.0), cum(ps)
    n_ge = (g1 - first).astype(np.float64)  # samples at least as long (itself included)
    active = (c_l[first] - c_l[g0]) + ls * n_ge
    context = (c_lp[first] - c_lp[g0]) + ls * (c_p[g1] - c_p[first]) + (c_tri[first] - c_tri[g0]) \
        + n_ge * ls * (ls - 1) / 2.0
    x = np.empty((n, 5))
    x[order] = np.column_stack([np.ones(n), np.asarray(minibatches["prompt_tokens"], dtype=np.float64)[r],
                                ls, active, context])
    timed = ~np.isnan(y)
    return x[timed], y[timed], row[timed]


def _positions(row_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Where each of ``ids`` is in ``row_ids`` (the last row where one repeats); -1 for an id without a row.

    Found by search, not in an array indexed by id: one id of 2**31 - 1 made that array 16 GB, and a
    negative id wrapped around to the last place.
    """
    row_ids, ids = np.asarray(row_ids, dtype=np.int64), np.asarray(ids, dtype=np.int64)
    if not row_ids.size:
        return np.full(ids.size, -1, dtype=np.int64)
    if 0 <= int(row_ids.min()) and int(row_ids.max()) < 4 * row_ids.size:  # dense ids (every real log): by index
        pos_of = np.full(int(row_ids.max()) + 1, -1, dtype=np.int64)
        pos_of[row_ids] = np.arange(row_ids.size)
        inside = (ids >= 0) & (ids < pos_of.size)
        return np.where(inside, pos_of[np.where(inside, ids, 0)], -1)
    order = np.argsort(row_ids, kind="stable")
    at = np.searchsorted(row_ids[order], ids, side="right") - 1
    pos = order[np.maximum(at, 0)]
    return np.where((at >= 0) & (row_ids[pos] == ids), pos, -1)


def sample_features(samples: dict[str, np.ndarray], minibatches: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Features and seconds of every sample (:func:`sample_rows` of a continuous log, without minibatch positions)."""
    x, y, _ = sample_rows(samples, minibatches, continuous=True)
    return x, y


def is_continuous(samples: dict[str, np.ndarray], minibatches: dict[str, np.ndarray]) -> bool:
    """Whether samples left before their minibatch ended (a ``--return-mode continuous`` log)."""
    if not samples or "finish_time" not in samples or samples["finish_time"].size == 0:
        return False
    pos = _positions(minibatches["minibatch"], samples["minibatch"])
    ok = pos >= 0  # samples of minibatches the log has rows for
    end = np.asarray(minibatches["end"], dtype=np.float64)[pos[ok]]
    dur = float(np.max(minibatches["end"] - minibatches["start"], initial=0.0))
    early = end - samples["finish_time"][ok] > 1e-6 * max(dur, 1.0)
    return bool(np.any(early))


def calibrate_columns(
    minibatches: dict[str, np.ndarray],
    steps: dict[str, np.ndarray],
    *,
    base: SimCostModel | None = None,
    samples: dict[str, np.ndarray] | None = None,
    padded: bool = False,
) -> Calibration:
    """Fit a :class:`SimCostModel` from minibatch and step columns of a run log.

    With ``samples`` (the log's sample columns), the generation coefficients
    are fitted on the samples' own decode times (``decode_time``; for an
    older continuous-return log, finish times) instead of minibatch
    durations (see the module docstring). ``padded``: the backend computed
    finished sequences until the longest ended (``hf``), so sample times do
    not follow the step model and minibatch rows are used.

    Raises
    ------
    RunError
        Fewer than :data:`MIN_MINIBATCHES` minibatch rows.
    """
    base = base or SimCostModel()
    notes: list[str] = []
    n_mb = int(minibatches["end"].size)
    if n_mb < MIN_MINIBATCHES:
        raise RunError(
            f"the run log has {n_mb} minibatches; calibrating needs at least {MIN_MINIBATCHES}: run a larger plan"
        )
    y = np.asarray(minibatches["end"] - minibatches["start"], dtype=np.float64)
    x = np.column_stack(
        [
            np.ones(n_mb),
            minibatches["prompt_tokens"].astype(np.float64),
            minibatches["max_len"].astype(np.float64),
            minibatches["tokens"].astype(np.float64),
            minibatches["context_tokens"].astype(np.float64),
        ]
    )
    fx, fy, fg, rows = x, y, np.arange(n_mb), "minibatches"
    if samples is not None and samples.get("minibatch") is not None and samples["minibatch"].size:
        continuous = is_continuous(samples, minibatches)
        if padded and not continuous:
            notes.append("static generation computes finished sequences: fitted on minibatch durations")
        else:
            xs_, ys_, gs_ = sample_rows(samples, minibatches, continuous=continuous)
            if ys_.size >= MIN_MINIBATCHES:
                fx, fy, fg, rows = xs_, ys_, gs_, "samples"
                what = "finish times (continuous returns)" if continuous else "decode times"
                notes.append(f"generation fitted on {ys_.size} sample {what}")
    if rows == "samples":
        g, speed, se = fit_with_speeds(fx, fy, fg)
        # The speeds average to 1 over minibatches; the run's level is its total generation time.
        level = float(y.sum()) / max(float((x @ g).sum()), 1e-300)
        g, se, chose = g * level, se * level, False
        if fy.size <= BOOTSTRAP_MAX_ROWS:
            se = np.where(g > 0, bootstrap_std_errors(fx, fy, fg, x, y), np.nan)
        notes.append(f"one speed factor per minibatch (they span {speed.min():.2f}-{speed.max():.2f}); "
                     f"coefficients scaled by {level:.3f} to the log's generation time")
    else:
        g, se, chose = fit_generation(fx, fy, fg)
    if chose:
        held = [k for k, c in zip(GEN_COEFS, g, strict=True) if c == 0]
        notes.append(f"{fy.size} rows for {len(GEN_COEFS)} coefficients: free ones chosen by cross-validation over "
                     f"minibatches" + (f" ({', '.join(held)} held at 0)" if held else ""))
    _withhold(se, unseparated(fx, g), GEN_COEFS, "generation", rows, notes)
    pred = x @ g
    g = keep_unmeasured(fx, g, se, GEN_COEFS, _defaults(base, GEN_COEFS), rows, notes)
    values = dict(zip(GEN_COEFS, g, strict=True))
    std_errors: dict[str, float | None] = {k: (None if np.isnan(e) else float(e)) for k, e in zip(GEN_COEFS, se,
                                                                                                 strict=True)}
    n_st = int(steps["end"].size)
    r2_t = None
    if n_st >= MIN_STEPS:
        ys = np.asarray(steps["end"] - steps["start"], dtype=np.float64)
        xs = np.column_stack([np.ones(n_st), steps["tokens"].astype(np.float64)])
        t = nnls(xs, ys)
        t_se = cluster_std_errors(xs, ys, np.arange(n_st), t)
        _withhold(t_se, unseparated(xs, t), ("train_base", "train_per_token"), "trainer", "steps", notes)
        r2_t = _r2(ys, xs @ t)
        t = keep_unmeasured(xs, t, t_se, ("train_base", "train_per_token"), _defaults(base, ("train_base", "train_per_token")),
                            "steps", notes)  # fmt: skip
        values.update(train_base=t[0], train_per_token=t[1])
        std_errors.update({k: (None if np.isnan(e) else float(e)) for k, e in zip(("train_base", "train_per_token"),
                                                                                 t_se, strict=True)})
    else:
        notes.append(f"{n_st} trainer steps (< {MIN_STEPS}): trainer coefficients kept at their defaults")
    # A fit at the largest coefficient a model holds comes out a rounding above it (1e6 as
    # 1000000.0000000001), which the model refused with advice about a file calibrate writes itself.
    fitted = {k: min(float(v), COEFFICIENT_MAX) if float(v) <= COEFFICIENT_MAX * (1 + 1e-9) else float(v)
              for k, v in values.items()}  # fmt: skip
    model = SimCostModel(**{**base.to_dict(), **fitted})
    total = float(y.sum())
    return Calibration(
        sim_cost_model=model,
        n_minibatches=n_mb,
        n_steps=n_st,
        r2_generation=_r2(y, pred),
        r2_trainer=r2_t,
        generation_rel_error=abs(float(pred.sum()) - total) / total if total > 0 else None,
        notes=notes,
        std_errors=std_errors,
        fit_rows=rows,
        n_fit_rows=int(fy.size),
    )


def _defaults(base: SimCostModel, names: tuple[str, ...]) -> np.ndarray:
    return np.array([float(getattr(base, k)) for k in names])


def _withhold(se: np.ndarray, mask: np.ndarray, names: tuple[str, ...], what: str, rows: str, notes: list[str]) -> None:
    """No standard error for coefficients the rows cannot separate (:func:`unseparated`), and a note naming them."""
    if mask.any():
        se[mask] = np.nan
        named = ", ".join(k for k, m in zip(names, mask, strict=True) if m)
        notes.append(f"the log's {rows} do not vary enough to separate the {what} coefficients {named}: they "
                     "reproduce its times, but their split is not measured (no standard errors); calibrate on a run "
                     "with varied prompt and response lengths")  # fmt: skip


def calibrate(path: str | os.PathLike) -> Calibration:
    """Fit a cost model from the run log at ``path`` (see :func:`calibrate_columns`)."""
    log = R.read_run_log(path, allow_incomplete=True)
    held = log.tables[R.MINIBATCHES].num_rows
    run = log.meta.get("run") if isinstance(log.meta.get("run"), dict) else {}
    planned = run.get("n_minibatches")
    if log.status != R.STATUS_COMPLETE and held < MIN_MINIBATCHES and (
        not isinstance(planned, int) or planned >= MIN_MINIBATCHES
    ):  # the plan is large enough: the run stopped before enough of it was logged
        # An epoch's or a scout's log is resumed through its root (aspc run --epochs N --log ROOT --resume).
        root = Path(path).parent if re.fullmatch(r"epoch-\d+|scout", Path(path).name) else Path(path)
        how = f"aspc run PLAN --log {root} --resume" + (", with its --epochs and options" if root != Path(path)
                                                         else ", with its options")  # fmt: skip
        raise RunError(
            f"the run log at {path} holds {held} minibatches so far (status {log.status!r}); calibrating needs at "
            f"least {MIN_MINIBATCHES}: finish the run ({how}), then calibrate"
        )
    backend = (log.meta.get("config") or {}).get("backend") if isinstance(log.meta.get("config"), dict) else None
    if backend is not None and not isinstance(backend, str):  # ["hf"] was a TypeError (unhashable list)
        raise RunError(f"{path}: meta.json config.backend must be a string, got {json.dumps(backend)[:40]}; "
                       "the run log is damaged")
    mbs, steps = R.to_columns(log.tables[R.MINIBATCHES]), R.to_columns(log.tables[R.STEPS])
    bad = nonfinite_time({R.MINIBATCHES: mbs, R.STEPS: steps})
    if bad is not None:  # the fit came out NaN, refused as a cost-model coefficient the user never wrote
        raise RunError(f"{path}: {NONFINITE_LOG.format(bad=bad)} and calibrate the new log")
    samples = R.to_columns(log.tables[R.SAMPLES])
    # A plan revision (aspc run --replan) re-cuts the remainder: its minibatch count may differ from the plan's.
    # float: a run log 1.1 has no plan_revision (read back as NaN, which an int64 cast warned of on stderr).
    revised = bool(np.any(np.asarray(mbs.get("plan_revision", ()), dtype=np.float64) > 0))
    bad = damaged_row(mbs, steps, samples, planned if type(planned) is int and planned > 0 and not revised else None)
    if bad is not None:
        raise RunError(f"{path}: {bad}; the run log is damaged: run the plan again with a new --log and calibrate "
                       "the new log")
    cal = calibrate_columns(mbs, steps, samples=samples, padded=backend in PADDED_BACKENDS)
    if log.status != R.STATUS_COMPLETE:
        cal.notes.append(f"run log status is {log.status!r}: fitted on the rows it holds")
    cal.speed_probe_s = mean_speed_probe(log.meta)
    return cal


def damaged_row(mbs: dict[str, np.ndarray], steps: dict[str, np.ndarray], samples: dict[str, np.ndarray],
                planned: int | None) -> str | None:
    """The first row value a cost model cannot be fitted on, as "minibatch 3 context_tokens is nan, ..."; None if none.

    :func:`~aspc.runtime.record.metrics.nonfinite_time` checks the clocks every row has; these are the
    other values the fit reads. A damaged or hand-edited one was fitted silently (an infinite decode
    time gave a cost model of zeros) or refused as a cost-model coefficient the user never wrote.
    ``planned``: the plan's minibatch count (meta.json ``run.n_minibatches``), None if unknown.
    """
    for what, cols in (("a minibatch row", mbs), ("a sample row", samples)):
        ids = np.asarray(cols.get("minibatch", ()), dtype=np.int64)
        bad = np.flatnonzero((ids < 0) | (ids >= (planned or 2**31)))
        if bad.size:
            ok = f"the plan's minibatches are 0 to {planned - 1}" if planned else "minibatch ids start at 0"
            return f"{what} names minibatch {ids[bad[0]]}, out of range ({ok})"
    for kind, cols, counts in ((R.MINIBATCHES, mbs, ("prompt_tokens", "max_len", "tokens", "context_tokens")),
                               (R.STEPS, steps, ("tokens",))):  # fmt: skip
        key = "minibatch" if kind == R.MINIBATCHES else "step"
        dur = np.asarray(cols["end"], dtype=np.float64) - np.asarray(cols["start"], dtype=np.float64)
        if (bad := np.flatnonzero(dur < 0)).size:
            return f"{key} {cols[key][bad[0]]} ends {-dur[bad[0]]:g} s before it starts"
        for name in counts:
            v = np.asarray(cols[name], dtype=np.float64)
            if (bad := np.flatnonzero(~(np.isfinite(v) & (v >= 0)))).size:
                return f"{key} {cols[key][bad[0]]} {name} is {_shown(v[bad[0]])}, not a finite count >= 0"
    n = np.asarray(samples.get("minibatch", ())).size
    checks = [(name, np.asarray(samples[name], dtype=np.float64), "not a count >= 0", lambda v: v < 0)
              for name in ("response_len", "prompt_tokens") if name in samples]
    # NaN is "no time" (a log before format 1.2; a sample that never returned), +-inf or < 0 is damage
    checks += [(name, np.asarray(samples[name], dtype=np.float64), "not a finite number of seconds >= 0",
                lambda v: np.isinf(v) | (v < 0)) for name in ("decode_time", "finish_time") if name in samples]
    for name, v, must, wrong in checks:
        if v.size == n and (bad := np.flatnonzero(wrong(v))).size:
            i = bad[0]
            which = (f"sample {samples['sample_index'][i]} of prompt {str(samples['prompt_id'][i])[:40]!r}"
                     if "prompt_id" in samples and "sample_index" in samples else f"sample row {i}")
            return f"{which} {name} is {_shown(v[i])}, {must}"
    return None


def _shown(x: float) -> str:
    """A count as an integer (-1000000, not -1e+06), anything else as ``:g`` writes it."""
    return str(int(x)) if np.isfinite(x) and x == int(x) and abs(x) < 2**63 else f"{x:g}"


def mean_speed_probe(meta: dict) -> float | None:
    """Mean of a run log's speed probes (``summary.speed_probe_s``: before/after, per worker), or None."""
    summary = meta.get("summary") if isinstance(meta, dict) else None
    probes = summary.get("speed_probe_s") if isinstance(summary, dict) else None
    probes = probes if isinstance(probes, dict) else {}
    lists = [p for k in ("before", "after") if isinstance(p := probes.get(k), list)]  # {"before": 5}: no list
    values = [v for p in lists for v in p if isinstance(v, (int, float)) and v > 0]
    return float(np.mean(values)) if values else None
