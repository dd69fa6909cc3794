"""Re-planning during a run: what came back revises the plan of what has not started.

The preprint's predictor is fixed for the whole run. Here, at windows of
trainer steps (once 1/MAX_REVISIONS of the plan was dispatched since the
previous revision), the lengths the workers returned update the
predictions of the prompts not yet dispatched, and the undispatched remainder
is re-partitioned, re-annealed and re-ordered (:func:`aspc.compiler.compile_plan`);
minibatches already handed out are never touched.

Updates, all in log-length space against the plan's own predictions:

- a per-run correction fitted on the prompts whose samples all returned:
  ridge regression of the observed log mean length on the prompt's lexical
  features (:mod:`aspc.predict.features`) with the plan's log prediction as
  offset. Its unpenalised intercept and length terms are the per-run scale
  (a policy more verbose than the predictor's training data); its hashed
  word weights learn what this policy writes long answers to, which a
  predictor trained on other prompts (CASTILLO's code-heavy ``train`` split
  for chat prompts) did not know;
- sibling samples: a remainder prompt some of whose samples already
  returned (a retried or split prompt) is shrunk toward their mean.

This module sits above both halves (it compiles and is handed to
:func:`aspc.runtime.run` as a :class:`~aspc.runtime.contracts.Replanner`), so
the runtime never imports the compiler. Each revision can be written as a
plan file ``RUN/plans/revision-R.parquet`` (the remainder only, minibatches
numbered from 0; ``aspc check`` reads it like any plan).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from aspc import portable_math as pm
from aspc.choices import REPLAN_EVERY
from aspc.compiler import CompileConfig, compile_plan
from aspc.emit import schema as S
from aspc.emit.plan import write_plan
from aspc.io.prompts import PromptTable
from aspc.io.table import column_numpy
from aspc.predict.base import LengthPrediction
from aspc.predict.features import FeatureConfig, Features, featurize_compact
from aspc.predict.ridge import ridge_fit
from aspc.runtime.config import revised_minibatch_bound
from aspc.runtime.contracts import Replanner, ReplanView

# Fewest fully returned prompts before a correction is fitted: below this the
# ridge's intercept alone would be a noisy scale.
MIN_OBSERVED = 32
# Ridge penalties on the hashed word weights (log-length units) tried at each
# revision; the one with the least held-out squared error on the returned
# prompts is refitted on all of them. How much a run's own prompts can teach
# depends on how many came back and how far the predictor is from this policy:
# on CASTILLO validate with 25% returned, 1 was best where the predictor knew
# little (Kendall tau on the rest 0.47 vs 0.43 at 10 for gemma-3-4b) and 10
# where the returned prompts were the predicted-longest (longest-first dispatch).
RIDGE_LAMBDAS = (1.0, 3.0, 10.0, 30.0)
# Share of the returned prompts held out to choose the penalty.
HOLDOUT_SHARE = 0.25
# Sibling shrinkage: a remainder prompt with j returned samples takes
# (sum of them + SIBLING_PRIOR * predicted) / (j + SIBLING_PRIOR).
SIBLING_PRIOR = 1.0
# No revision once fewer than this many minibatches per worker are left.
TAIL_ROUNDS = 4
# At most about this many revisions in a run: a window revises only once 1/MAX_REVISIONS of the plan's
# minibatches were dispatched since the previous revision. Each revision refits on every returned prompt,
# compiles the whole remainder and writes it (prompt texts too), so a window every 8 trainer steps made a
# run's time and log quadratic in its size (30,000 prompts: 458 revisions, 166 s, an 826 MB log). The
# reference scenario's runs dispatch more than that between windows: their revisions did not change.
MAX_REVISIONS = 16
# How the note of a run that re-planned nothing starts (OnlineReplanner.notes): the commands that print a
# run's notes selectively (`run --epochs`, `simulate`) pick it out by this prefix.
NO_REVISION = "--replan made no revision"


def used_columns(x: Features) -> Features:
    """The same matrix over only the hashed columns some prompt uses.

    A run's prompts touch a few thousand of the 2**18 hashed columns; the
    ridge's conjugate-gradient vectors shrink by as much (a window's refit
    drops from seconds to tens of milliseconds).
    """
    # np.unique's sorted columns and inverse, without sorting every entry (20M at 300,000 prompts: 7 s):
    # the columns are bucket numbers below n_hashed, so a mask and its running count rank them.
    mask = np.zeros(x.n_hashed, dtype=bool)
    mask[x.cols] = True
    rank = np.cumsum(mask, dtype=np.int64) - 1
    return Features(x.dense, x.rows, rank[x.cols], x.vals, max(1, int(rank[-1]) + 1))


def bounded_correction(sol: Any, x: Features, fitted: np.ndarray, residual: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The log correction of ``sol`` at ``rows`` of ``x``, never extrapolated past the rows it was fitted on.

    The unpenalised length terms (quadratic in log bytes) fitted on a few
    dozen prompts extrapolate wildly to a prompt longer than any of them (a
    1e10-token prediction on CASTILLO's Ministral-8B, whose first returned
    prompts were all under 60 bytes): ``rows`` are scored with their length
    features inside the range of the ``fitted`` rows, and no correction goes
    past the largest or below the smallest ``residual`` (observed log length
    minus the plan's) a fitted row showed.
    """
    dense = np.clip(x.dense[rows], x.dense[fitted].min(axis=0), x.dense[fitted].max(axis=0))
    return np.clip(sol.predict(x.take_rows(rows, dense=dense)), residual.min(), residual.max())


def refit_factor(texts: list[str], base_mean: np.ndarray, obs: np.ndarray, y: np.ndarray, lam: float = 10.0) -> np.ndarray:
    """Per prompt of ``texts``, the factor of the per-run correction refit on the prompts ``obs`` (log mean lengths ``y``).

    Between epochs (:func:`aspc.epoch_predict.epoch_prediction`): a ridge of the
    observed log lengths on the prompts' features, offset by ``base_mean``'s
    logs, bounded as :func:`bounded_correction` bounds a revision's.
    """
    x = used_columns(featurize_compact(texts, FeatureConfig()))
    off = pm.log(np.maximum(base_mean, 1.0))
    sol = ridge_fit(x.take_rows(obs), y, lam, offset=off[obs], max_iter=100)
    return pm.exp(bounded_correction(sol, x, obs, y - off[obs], np.arange(len(texts))))


def prompt_table_of(rows: pa.Table, input_hash: str) -> PromptTable:
    """The prompts of plan rows, as a table the compiler takes (no known lengths)."""
    prompts = rows.column(S.PROMPT).to_pylist()
    return PromptTable(
        ids=rows.column(S.PROMPT_ID).to_pylist(),
        prompts=prompts,
        texts=prompts,
        source_rows=column_numpy(rows.column(S.SOURCE_ROW)).astype(np.int64),
        prompt_tokens=column_numpy(rows.column(S.PROMPT_TOKENS)).astype(np.int64),
        lengths=None,
        input_hash=input_hash,
    )


def prediction_of(rows: pa.Table) -> LengthPrediction:
    """The predictions stored in plan rows (``predicted_len``, ``predicted_q10/q50/q90``)."""
    col = lambda name: column_numpy(rows.column(name)).astype(np.float64)  # noqa: E731
    return LengthPrediction(col(S.PREDICTED_LEN), col(S.PREDICTED_Q10), col(S.PREDICTED_Q50), col(S.PREDICTED_Q90))


def compile_config_of(plan_config: dict[str, Any], **overrides: Any) -> CompileConfig:
    """The :class:`CompileConfig` a plan was compiled with (its stored record), for its remainder."""
    names = {f.name for f in dataclasses.fields(CompileConfig)}
    stored = dict(plan_config)
    # Plans record CompileConfig.minibatch_cost under its historical key (``compiler._config_record``);
    # read as it was, a --minibatch-cost padded plan's later epochs and revisions went expected-max.
    if "cost_model" in stored and "minibatch_cost" not in stored:
        stored["minibatch_cost"] = stored.pop("cost_model")
    # Plans before the order option (every plan records it since) dispatched in today's "interleave" order.
    stored.setdefault("order", "interleave")
    keep = {k: v for k, v in stored.items() if k in names and k not in ("predictor", "history", "groups")}
    keep["history"] = ()
    keep["strategy"] = "asp"
    keep.update(overrides)
    return CompileConfig(**keep)


def _revision_number(name: str) -> int:
    """``revision-R.parquet`` -> R (-1 for any other name, which sorts first and fails the check)."""
    stem = name[len("revision-") : -len(".parquet")]
    return int(stem) if stem.isdigit() else -1


def read_revisions(log_dir: Path | None, what: str) -> list[tuple[int, Any]]:
    """The plan revisions under ``log_dir/plans`` (``revision-R.parquet``), oldest first, as (first minibatch, plan).

    Raises
    ------
    RunError
        A revision file is unreadable, or the files do not form the
        sequence 1..R with non-decreasing first minibatches (the log was
        edited or mixed with another run's).
    """
    from aspc.emit.plan import read_plan
    from aspc.errors import AspcError, RunError, finding

    if log_dir is None:
        return []
    paths = sorted((log_dir / "plans").glob("revision-*.parquet"), key=lambda p: _revision_number(p.name))
    out: list[tuple[int, Any]] = []
    last_first = -1
    for k, path in enumerate(paths, start=1):
        where = f"{path}: cannot resume with {what}"
        try:
            plan = read_plan(path)
        except AspcError as exc:
            # The plan reader's own advice (compile it again) does not apply to a run's revision.
            raise RunError(f"{where}: {finding(exc)}; the run log is damaged: start a new run with --overwrite") from None
        rev = plan.config.get("revision") or {}
        first = rev.get("first_minibatch")
        if rev.get("id") != k or _revision_number(path.name) != k or not isinstance(first, int):
            raise RunError(f"{where}: revisions must be revision-1 .. revision-{len(paths)} with their ids; "
                           "start a new run with --overwrite")
        if first < last_first:  # equal is fine: two windows may pass with nothing dispatched
            raise RunError(f"{where}: it starts at minibatch {first}, before the previous revision's "
                           f"{last_first}; start a new run with --overwrite")
        last_first = first
        out.append((first, plan))
    return out


class OnlineReplanner(Replanner):
    """Revises the remainder from the lengths observed so far (see the module notes).

    Parameters
    ----------
    plan_table
        The run's plan rows (PLAN_SCHEMA) at the start of the run.
    config
        Compile settings for the remainder (batch size, slack, groups, seed,
        workers, cap); the strategy is always ``asp``.
    every_steps
        Window length, trainer steps.
    log_dir
        Run directory: each revision goes to ``plans/revision-R.parquet``.
    """

    def __init__(
        self,
        plan_table: pa.Table,
        config: CompileConfig,
        *,
        every_steps: int = REPLAN_EVERY,
        log_dir: str | os.PathLike | None = None,
        input_hash: str = "",
    ):
        if every_steps < 1:
            raise ValueError("every_steps must be >= 1")
        self.every_steps = int(every_steps)
        self.config = dataclasses.replace(config, strategy="asp", history=())
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.input_hash = input_hash
        ids = plan_table.column(S.PROMPT_ID).to_pylist()
        self._index = {pid: i for i, pid in enumerate(ids)}
        texts = plan_table.column(S.PROMPT).to_pylist()
        self._features = used_columns(featurize_compact(texts, FeatureConfig()))
        self._base = prediction_of(plan_table)
        self._offset = pm.log(np.maximum(self._base.mean, 1.0))
        self.revisions: list[dict[str, Any]] = []  # per revision: step, first minibatch, observed prompts
        self._skipped: tuple[int, str] | None = None  # the first window that kept the plan, and why
        # Prompts in the plan's largest minibatch: a revision's mean never exceeds it (largest_minibatch).
        mb = column_numpy(plan_table.column(S.MINIBATCH))  # not to_numpy: that imports pandas
        self._rows = int(np.bincount(mb).max()) if plan_table.num_rows else 1
        self._n_minibatches = len(np.unique(mb))
        self._spacing = self._n_minibatches / MAX_REVISIONS

    def _observed(self, view: ReplanView) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per plan row of ``view.work``: returned samples' count and sum, and the global index of the row."""
        w = view.work
        got = view.response_len >= 0
        rows = w.sample_row
        n_got = np.bincount(rows[got], minlength=len(w.prompt_ids))
        s_got = np.bincount(rows[got], weights=view.response_len[got], minlength=len(w.prompt_ids))
        glob = np.array([self._index[p] for p in w.prompt_ids.tolist()], dtype=np.int64)
        return n_got, s_got, glob, w.n_samples

    def _choose_lambda(self, obs_g: np.ndarray, y: np.ndarray, revision: int) -> float:
        """The penalty of :data:`RIDGE_LAMBDAS` with the least held-out error on the returned prompts.

        The split is seeded by the plan's seed and the revision, so a run and
        its ``--resume`` choose the same penalty.
        """
        rng = np.random.default_rng([self.config.seed, revision])
        held = rng.random(obs_g.size) < HOLDOUT_SHARE
        if held.sum() < MIN_OBSERVED // 4 or (~held).sum() < MIN_OBSERVED:
            return RIDGE_LAMBDAS[-2]
        fit_x = self._features.take_rows(obs_g[~held])
        test_x = self._features.take_rows(obs_g[held])
        errors = []
        for lam in RIDGE_LAMBDAS:
            sol = ridge_fit(fit_x, y[~held], lam, offset=self._offset[obs_g[~held]], max_iter=60)
            err = sol.predict(test_x) + self._offset[obs_g[held]] - y[held]
            errors.append(pm.dot(err, err))
        return RIDGE_LAMBDAS[int(np.argmin(errors))]

    def predict_remainder(self, view: ReplanView) -> tuple[np.ndarray, LengthPrediction] | None:
        """Row indices (in ``view.work``) of the remainder and their revised predictions; None if too little came back."""
        w = view.work
        n_got, s_got, glob, n_total = self._observed(view)
        full = (n_got == n_total) & (n_got > 0)
        if int(full.sum()) < MIN_OBSERVED:
            return None
        r0 = int(w.row_offsets[view.first_undispatched])
        rest = np.arange(r0, len(w.prompt_ids))
        obs_g = glob[full]
        y = pm.log(np.maximum(s_got[full] / n_got[full], 1.0))
        lam = self._choose_lambda(obs_g, y, view.revision)
        sol = ridge_fit(self._features.take_rows(obs_g), y, lam, offset=self._offset[obs_g], max_iter=60)
        rest_g = glob[rest]
        factor = pm.exp(bounded_correction(sol, self._features, obs_g, y - self._offset[obs_g], rest_g))
        base = self._base.take(rest_g)
        mean = base.mean * factor
        # Siblings: returned samples of a remainder prompt pull its mean toward theirs.
        j = n_got[rest].astype(np.float64)
        if np.any(j > 0):
            shrunk = (s_got[rest] + SIBLING_PRIOR * mean) / (j + SIBLING_PRIOR)
            factor = factor * np.where(j > 0, shrunk / mean, 1.0)
            mean = np.where(j > 0, shrunk, mean)
        return rest, LengthPrediction(mean, base.q10 * factor, base.q50 * factor, base.q90 * factor)

    def notes(self) -> list[str]:
        """Why a run asked to re-plan made no revision (a flag that silently did nothing misleads)."""
        if self.revisions:
            return []
        step, why = self._skipped or (self.every_steps, "every minibatch was already dispatched (or the run had ended)")
        w = self.config.workers or 1
        if self._n_minibatches - w < TAIL_ROUNDS * w:  # even the earliest window, after the first dispatch
            earlier = (f" (at least {(TAIL_ROUNDS + 1) * w} for {w} workers; this plan has {self._n_minibatches}, "
                       "so no window could revise it)")  # fmt: skip
        elif self.every_steps > 1:
            earlier = f" (or perhaps an earlier window than every {self.every_steps} trainer steps: aspc run --replan-every)"
        else:
            earlier = ""
        return [f"{NO_REVISION}: at its first window (trainer step {step}) {why}; re-planning needs a "
                f"run of more minibatches per worker{earlier}"]  # fmt: skip

    def stored_revisions(self) -> list[tuple[int, pa.Table]]:
        """The revisions written under ``log_dir/plans`` by the run being resumed, oldest first (:func:`read_revisions`)."""
        out = [(first, plan.table) for first, plan in read_revisions(self.log_dir, "--replan")]
        self.revisions = [{"revision": k, "first_minibatch": f} for k, (f, _) in enumerate(out, start=1)]
        return out

    def largest_minibatch(self, work: Any) -> int:
        """A bound on the samples of a minibatch of ``work`` or of a revision of it (see :meth:`revise`).

        A revision cuts the remainder into as many minibatches as it had, of
        ``b`` prompts on average, kept at most the plan's largest, and each
        holds at most ``b`` plus the slack (:func:`aspc.compiler.resolve_sizes`).
        """
        return revised_minibatch_bound(self._rows, self.config.slack, int(work.n_samples.max()),
                                       int(work.minibatch_sizes.max()))  # fmt: skip

    def revise(self, view: ReplanView) -> pa.Table | None:
        # Near the end a revision can only hurt: prompts it now thinks long
        # would form a long minibatch that starts late and ends the run late.
        # Revise only while at least TAIL_ROUNDS minibatches per worker remain.
        left = view.work.n_minibatches - view.first_undispatched
        if left < TAIL_ROUNDS * (self.config.workers or 1):
            self._skipped = self._skipped or (view.step, f"{left} minibatches were left to dispatch, fewer than "
                                              f"{TAIL_ROUNDS} rounds of {self.config.workers or 1} workers")  # fmt: skip
            return None
        if self.revisions and view.first_undispatched - self.revisions[-1]["first_minibatch"] < self._spacing:
            return None  # too little dispatched since the last revision (MAX_REVISIONS)
        got = self.predict_remainder(view)
        if got is None:
            self._skipped = self._skipped or (view.step, f"fewer than {MIN_OBSERVED} prompts had all their samples back")
            return None
        rest, pred = got
        w = view.work
        sub = prompt_table_of(w.table.slice(int(rest[0]), len(rest)), self.input_hash)
        n = int(np.median(w.n_samples[rest]))
        # Keep the remainder's minibatch count (a revision re-cuts, it does not
        # add minibatches: each one pays the fixed decode-step cost).
        left = w.n_minibatches - view.first_undispatched
        # At most the plan's largest: minibatches dispatched smaller than the mean would otherwise raise it
        # revision after revision, past what the --max-staleness check sized the run for.
        b = max(1, min(int(round(len(rest) / left)), self._rows))
        slack = self.config.slack if self.config.slack is not None and self.config.slack < b else None
        cfg = dataclasses.replace(self.config, samples_per_prompt=n, batch_size=b, slack=slack)
        plan = compile_plan(sub, pred, cfg, predictor_identity={"kind": "replan", "revision": view.revision + 1})
        self.revisions.append(
            {"revision": view.revision + 1, "step": view.step, "first_minibatch": view.first_undispatched}
        )
        if self.log_dir is not None:
            plan.config["revision"] = {
                "id": view.revision + 1,
                "after_step": view.step,
                "first_minibatch": view.first_undispatched,
            }
            (self.log_dir / "plans").mkdir(parents=True, exist_ok=True)
            write_plan(plan, self.log_dir / "plans" / f"revision-{view.revision + 1}.parquet")
        return plan.table
