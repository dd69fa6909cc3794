"""A length scout before an epoch: one response per prompt, cut at T tokens, then asp planned from it.

Text predictions rank a new policy's response lengths at Kendall tau 0.2-0.45
on prompts from sources they never saw (README, "Length prediction"), and at
that tau asp gains 4% over random at best. One observed response of a prompt
ranks its mean length at ~0.8, but an epoch's own responses come back only
after most of its work has been dispatched. The scout buys that observation
before the epoch: every prompt generates ONE response with the current
policy, cut at ``T`` tokens (``T`` = a quarter of the response cap by
default), in wide minibatches; each prompt's scouted length (``T`` when cut)
is blended into the text prior as one earlier epoch
(:class:`~aspc.predict.history.HistoryPredictor`), and asp plans the epoch
from that.

The scout's responses are then thrown away, so every GRPO group is still
generated whole by the epoch's own run: the trainer, the staleness bound,
resume and the plan schema are untouched. ``simulate --strategies
asp+scout+keep`` keeps instead each response that finished under the cut as
its prompt's last sample (:func:`aspc.runtime.carry.carry`): the epoch
generates one sample fewer of that prompt, at the price of that sample's
policy lag, which counts from the epoch's first weights. The price is the scout's own
generation: about ``T / cap`` of a full-length pass at one sample per
prompt, paid before the epoch's first dispatch, with the trainer idle. It
pays for itself when prompt lengths vary widely and the text predictor
knows little of them (see ``benchmarks/scout_ceiling.py`` and the README's
figures: mean iteration time 0.89 x random over 13 policies with T = 1,024
of a 4,096 cap, against 0.96 for asp on the text prior, the scout's
generation included).

This module sits above both halves, like :mod:`aspc.simulate`: the scout's
plan (:func:`scout_plan`) and run settings (:func:`scout_run_config`) serve
``aspc simulate --strategies asp+scout`` (:func:`run_scout`, simulated) and
``aspc run PLAN --scout`` on any backend (:mod:`aspc.epochs`: the scout's
log in ``RUN/scout/``, epoch 1 planned from it; ``--scout-keep`` on the sim
backend, :func:`check_keep`). Outside aspc's runtime the
same is two commands::

    aspc probe PROMPTS --prompts N --max-new-tokens T --batch-size 256 --log scout/ -o scout-pred/
    aspc compile PROMPTS --history scout/ -o plan.parquet

(``N`` at least the number of prompts: every prompt is scouted once.)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from aspc.compiler import CompileConfig, compile_plan
from aspc.emit.plan import Plan
from aspc.errors import ConfigError, InputError
from aspc.io.ragged import RaggedLengths
from aspc.io.rows import MAX_LENGTH
from aspc.io.table import PromptTable
from aspc.predict.base import LengthPrediction
from aspc.runtime.api import RunResult, run
from aspc.runtime.backends.sim_cost import SimCostModel
from aspc.runtime.config import RunConfig
from aspc.runtime.record import runlog as R
from aspc.runtime.record.metrics import summarize

# Widest scout minibatch, sequences: vLLM's default max_num_seqs. One sample
# per prompt has no sibling to share its minibatch's longest response with,
# so a scout minibatch is wide to spread the per-step cost over many prompts.
SCOUT_MAX_SEQS = 256
# T = the response cap / this, by default: long enough that most responses
# finish (and are measured exactly), short enough that the scout costs a
# fraction of a full-length pass. 1,024 of 4,096 on the CASTILLO reference
# scenario: 0.892 x random mean over 13 policies (512: 0.889, 768: 0.881; README).
CAP_FRACTION = 4
# Without a response cap.
DEFAULT_TOKENS = 1024


def scout_tokens(max_new_tokens: int | None, tokens: int | None = None) -> int:
    """The scout's cut ``T``: ``tokens`` if given, else the response cap / :data:`CAP_FRACTION`."""
    if tokens is not None:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_LENGTH:
            raise ConfigError(f"--scout-tokens must be an integer in 1..{int(MAX_LENGTH):,}, got {tokens!r}")
        return tokens if max_new_tokens is None else min(tokens, max_new_tokens)
    if max_new_tokens is None:
        return DEFAULT_TOKENS
    return max(1, max_new_tokens // CAP_FRACTION)


def scout_batch_size(n_prompts: int, workers: int) -> int:
    """Prompts per scout minibatch: a worker's share, at most :data:`SCOUT_MAX_SEQS`."""
    return max(1, min(SCOUT_MAX_SEQS, math.ceil(n_prompts / max(1, workers))))


def spare_lengths(known: RaggedLengths, n: int, ids: Sequence[str]) -> np.ndarray:
    """Each prompt's recorded length number ``n + 1``: one the epoch's ``n`` samples do not replay.

    The scout is an independent response of the same policy; replaying one
    of the epoch's own samples would let it see the future.

    Raises
    ------
    InputError
        Some prompt has no more than ``n`` recorded lengths.
    """
    sizes = known.sizes()
    _check_spare(sizes, n, ids)
    return known.values[known.offsets[:-1] + n]


def spare_length_map(known: dict[str, np.ndarray], n: int, ids: Sequence[str]) -> dict[str, np.ndarray]:
    """:func:`spare_lengths` of recorded lengths by prompt id, as one-length arrays by id."""
    sizes = np.array([len(known.get(str(p), ())) for p in ids], dtype=np.int64)
    _check_spare(sizes, n, ids)
    return {str(p): np.asarray(known[str(p)], dtype=np.float64)[n : n + 1] for p in ids}


def _check_spare(sizes: np.ndarray, n: int, ids: Sequence[str]) -> None:
    short = np.flatnonzero(sizes <= n)
    if short.size:
        raise InputError(
            f"the scout replays a recorded length the run does not: {short.size} of {sizes.size} prompts have "
            f"only {int(sizes[short[0]])} for {n} samples (e.g. id {ids[int(short[0])]!r}); record more lengths "
            "per prompt or lower --samples-per-prompt"
        )


class _Fixed:
    """A predictor whose predictions are already made (in ``ids`` order): the scout's text prior."""

    kind = "fixed"

    def __init__(self, prediction: LengthPrediction, ids: Sequence[str], metadata: dict[str, Any]) -> None:
        self.prediction = prediction
        self.row = {str(p): i for i, p in enumerate(ids)}
        self.metadata = metadata

    def identity(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def predict(self, texts: Sequence[str], *, ids: Sequence[str] | None = None) -> LengthPrediction:
        assert ids is not None
        return self.prediction.take(np.array([self.row[str(p)] for p in ids], dtype=np.int64))


def scouted_prediction(
    table: PromptTable, prior: LengthPrediction, scouted: np.ndarray, prior_metadata: dict[str, Any]
) -> LengthPrediction:
    """The text prior blended with one scouted length per prompt (as one earlier epoch)."""
    from aspc.predict.history import HistoryPredictor

    ids = [str(p) for p in table.ids]
    observed = {p: np.array([float(v)]) for p, v in zip(ids, scouted.tolist(), strict=True)}
    history = HistoryPredictor(_Fixed(prior, ids, prior_metadata), observed)  # type: ignore[arg-type]
    return history.predict(table.texts, ids=ids)


def scout_plan(table: PromptTable, prior: LengthPrediction, config: CompileConfig, workers: int, tokens: int) -> Plan:
    """The scout's own plan: asp over the prior, one sample per prompt, responses cut at ``tokens``, wide minibatches."""
    b = scout_batch_size(len(table.ids), workers)
    # No trainer target: the scout runs in aspc's own runtime, never in verl, and its wide, unequal
    # minibatches are what --for verl refuses (the epoch's plans keep the target).
    cfg = dataclasses.replace(config, strategy="asp", samples_per_prompt=1, batch_size=b, slack=b // 4,
                              max_response_length=tokens, history=(), target=None)  # fmt: skip
    return compile_plan(table, prior, cfg, predictor_identity={"kind": "scout"})


def scout_run_config(run_config: RunConfig, n_prompts: int, tokens: int) -> RunConfig:
    """The run settings of a scout: one sample per prompt, cut at ``tokens``, no trainer step, no reload.

    The global batch (and the queue) is larger than the scout, so its
    responses fill no trainer batch: no step is taken and no worker reloads
    weights; the policy the epoch starts from is the one the scout measured.
    """
    return dataclasses.replace(
        run_config,
        samples_per_prompt=1,
        max_new_tokens=tokens,
        global_batch=n_prompts + 1,
        queue_capacity=str(n_prompts + 1),
        max_staleness=None,
    )


def run_scout(
    table: PromptTable,
    prior: LengthPrediction,
    scout_lengths: np.ndarray,
    config: CompileConfig,
    run_config: RunConfig,
    tokens: int,
    cost: SimCostModel | None = None,
) -> RunResult:
    """Compile and simulate the scout (:func:`scout_plan`, :func:`scout_run_config`)."""
    n = len(table.ids)
    plan = scout_plan(table, prior, config, run_config.workers, tokens)
    lengths = {str(p): np.array([float(v)]) for p, v in zip(table.ids, scout_lengths.tolist(), strict=True)}
    return run(plan, config=scout_run_config(run_config, n, tokens), sim_cost_model=cost, actual_lengths=lengths,
               lengths_name="scout")  # fmt: skip


def scout_summary(scout: RunResult, tokens: int) -> dict[str, Any]:
    """What a report says of a scout run: its cut, makespan, minibatches and responses cut."""
    return {
        "tokens": int(tokens),
        "makespan": float(scout.summary.makespan),
        "n_minibatches": int(scout.summary.n_minibatches),
        "responses_cut": int(np.count_nonzero(np.asarray(scout.columns[R.SAMPLES]["response_len"]) >= tokens)),
    }


def after_scout(scout: RunResult, epoch: RunResult, n_workers: int, tokens: int) -> RunResult:
    """The epoch's run as it happens after the scout: its clock starts when the scout's last minibatch ends.

    The scout's minibatches keep the workers busy first (their samples are
    discarded, so they appear as worker time, not as samples); the epoch's
    minibatches, samples, trainer steps and queue follow, shifted by the
    scout's makespan. The summary is recomputed from those columns, so every
    metric (iteration times, makespan, lower bound, trainer wait) counts the
    scout.
    """
    t0 = float(scout.summary.makespan)
    m0 = int(scout.summary.n_minibatches)
    s_mb, e_mb = scout.columns[R.MINIBATCHES], epoch.columns[R.MINIBATCHES]
    mbs = {}
    for k in e_mb:
        a, b = np.asarray(s_mb[k]), np.asarray(e_mb[k])
        if k in ("dispatch_time", "start", "end"):
            b = b + t0
        elif k == "minibatch":
            b = b + m0
        mbs[k] = np.concatenate([a, b.astype(a.dtype, copy=False)])
    smp = dict(epoch.columns[R.SAMPLES])
    smp["finish_time"] = np.asarray(smp["finish_time"]) + t0
    smp["minibatch"] = np.asarray(smp["minibatch"]) + m0
    stp = dict(epoch.columns[R.STEPS])
    stp["start"] = np.asarray(stp["start"]) + t0
    stp["end"] = np.asarray(stp["end"]) + t0
    if len(stp["wait"]):
        wait = np.asarray(stp["wait"], dtype=np.float64).copy()
        wait[np.argmin(np.asarray(stp["step"]))] += t0  # the trainer waited through the scout
        stp["wait"] = wait
    que = dict(epoch.columns[R.QUEUE])
    que["time"] = np.asarray(que["time"]) + t0
    columns = {**epoch.columns, R.MINIBATCHES: mbs, R.SAMPLES: smp, R.STEPS: stp, R.QUEUE: que}
    summary = summarize(
        columns,
        n_workers=n_workers,
        samples_planned=epoch.summary.samples_planned,
        queue_capacity=epoch.summary.queue_capacity,
    )
    summary.extra.update(epoch.summary.extra)
    summary.extra["scout"] = scout_summary(scout, tokens)
    return RunResult(summary=summary, columns=columns, lengths=epoch.lengths, notes=list(epoch.notes))


def check_keep(scout: bool, keep: bool, through: int | None, *, real: bool, replan: bool) -> None:
    """Usage errors of --scout-keep and --scout-keep-through (one line each), before anything is written."""
    if through is not None and not keep:
        raise ConfigError("--scout-keep-through bounds --scout-keep: pass --scout-keep too, or drop it")
    if keep and not scout:
        raise ConfigError("--scout-keep keeps the length scout's finished responses: pass --scout too")
    if through is not None and (isinstance(through, bool) or not isinstance(through, int) or through < 0):
        raise ConfigError(f"--scout-keep-through must be an integer >= 0 (a weights version), got {through!r}")
    if keep and real:
        # The rolling scout with one window keeps the same responses on a model backend, in one run
        # (0.852 x random against 0.853 on the reference scenario; README).
        raise ConfigError("--scout-keep is simulated only so far (a real trainer would need the scout's tokens); on "
                          "this backend --scout --scout-roll --scout-windows 1 scouts every prompt first and keeps "
                          "its finished responses the same way")  # fmt: skip
    if keep and replan:
        raise ConfigError("--scout-keep does not combine with --replan yet; drop one of the two")


def history_prior_metadata() -> dict[str, Any]:
    """The shipped default's metadata: the history prior (within-prompt spread, kappa) the scout's blend uses.

    A plan records no predictor path (``"dir"`` at most), so the predictor
    that made it is not found again; the default's CASTILLO figures stand in
    for any plan.
    """
    from aspc.predict import load_predictor

    return dict(getattr(load_predictor("default"), "metadata", {}) or {})


def check_scout_cut(root: Any, tokens: int) -> None:
    """Refuse to resume a scout cut at another T (its log would otherwise name only --max-new-tokens)."""
    from pathlib import Path

    from aspc.runtime.record.runlog import is_run_log, read_meta

    root = Path(root)
    if not is_run_log(root / "scout"):
        return
    old = (read_meta(root / "scout").get("config") or {}).get("max_new_tokens")
    if old is not None and int(old) != tokens:
        raise ConfigError(
            f"--resume {root}: its length scout was cut at {old} tokens, this run would cut at {tokens} "
            "(--scout-tokens, or the --max-new-tokens it defaults from); resume with the original options, "
            "or start a new run"
        )
