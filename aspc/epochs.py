"""Several passes over the prompts (``aspc run PLAN --epochs N``), each planned from the run so far.

Epoch 1 runs the given plan. Before each later epoch its plan is compiled
from the run log so far: every prompt's prediction moves toward the lengths
its earlier samples had (history, :func:`aspc.predict.history.blend_history`),
after a refit of the per-run correction of :mod:`aspc.replan` on all
observed prompts, and scaled by the growth of the mean length between the
last two epochs (a policy whose responses grow keeps growing). Plans go to
``RUN/plans/epoch-K.parquet`` (valid plans: ``aspc check`` reads them), run
logs to ``RUN/epoch-K/``.

A length scout first (``--scout``, :mod:`aspc.scout`). Before epoch 1 every
prompt generates one response with the starting policy, cut at ``T`` tokens,
in wide minibatches and with no trainer step (its log: ``RUN/scout/``); epoch
1 then runs the plan compiled from the given plan's predictions blended with
those lengths (``RUN/plans/epoch-1.parquet``), not the given plan itself.
The scout's own time counts in the run's totals. Later epochs plan from the
epochs before them as without a scout (full-length samples say more than cut
ones). The simulator, and a real backend with ``--replay-lengths``, replay
each prompt's recorded length number ``n + 1`` in the scout (one epoch 1 does
not replay).

Resuming (``--resume``). Every epoch's plan is a function of the epochs
before it, so an interrupted run continues exactly: epochs whose logs are
complete are read back, the epoch that was running resumes its own log, and
the rest run fresh. A stored epoch plan must be the one its epochs compile
to (same rows hash and configuration), else the run stops before anything
is written.

Replayed lengths (simulator). Epoch ``k`` replays each prompt's recorded
lengths from position ``(k - 1) * n`` on (``n`` samples per prompt, wrapping
around), scaled by ``(1 + length_drift) ** (k - 1)``. Give at least ``2n``
recorded lengths per prompt for epochs whose samples differ from the
history they are planned from; with fewer, later epochs replay some lengths
an earlier epoch already saw.

Real backends (hf, vllm; local or Ray engine). The backend and the trainer
are built once and kept open across the epochs: the models load once (under
Ray the next run's engine takes over the actors), and the trainer goes on
training from where the last epoch left it (its weights,
optimiser state and baseline). Before each later epoch every worker loads
the trainer's current weights (:meth:`Trainer.current_weights`) as that
epoch's version 0, so no sample of epoch ``k`` comes from weights older than
the end of epoch ``k - 1``. With ``--replay-lengths`` each epoch replays its
own rotation of the recorded lengths, as the simulator does. On
``--resume`` each completed epoch read back calls :meth:`Trainer.restore`
with its step count, so a trainer that checkpoints (the bundled GRPO trainer
with a ``checkpoint_dir``) goes on from the end of the last one; one that
does not restarts from its initial weights, as a single run's does.

Sits above both halves (it compiles and runs); the runtime never imports it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aspc.caps import cap_for_plan, cap_prediction
from aspc.compiler import CompileConfig, compile_plan
from aspc.emit import schema as S
from aspc.emit.plan import Plan, write_plan
from aspc.epoch_checks import check_epoch_logs, check_lengths_cover, check_scout_part_of, check_stored_plan
from aspc.epoch_predict import epoch_lengths, epoch_prediction
from aspc.epoch_staleness import check_epochs_staleness, epoch_compile_config
from aspc.errors import ConfigError
from aspc.guards import SEED_MAX
from aspc.io.history import read_history
from aspc.io.rows import MAX_LENGTH
from aspc.predict.pairs import keep_plan_in_log
from aspc.replan import OnlineReplanner, prediction_of, prompt_table_of
from aspc.rolling_scout import check_roll_run, rolling_epoch
from aspc.rolling_scout import scout_lengths as scout_lengths_of
from aspc.run_layout import check_log_layout, clear_run_dir
from aspc.runtime.api import RunResult, run
from aspc.runtime.backends.options import DEFAULT_MAX_NEW_TOKENS
from aspc.runtime.config import OPERATIONAL_KEYS
from aspc.runtime.record.lock import RunLogLock
from aspc.runtime.record.resume import config_record
from aspc.scout import (
    check_keep,
    check_scout_cut,
    history_prior_metadata,
    scout_plan,
    scout_run_config,
    scout_summary,
    scouted_prediction,
    spare_length_map,
)
from aspc.scout import scout_tokens as scout_tokens_of

MAX_EPOCHS = 1000
# Drifted replay lengths stay within what a length file may hold (aspc.io.rows.MAX_LENGTH).
MAX_REPLAYED_LENGTH = MAX_LENGTH


@dataclass
class EpochsResult:
    """What :func:`run_epochs` returns."""

    runs: list[RunResult]  # one per epoch
    plans: list[Plan]  # the plan each epoch ran
    notes: list[str] = field(default_factory=list)
    scout: RunResult | None = None  # the length scout before epoch 1 (--scout)

    def to_dict(self) -> dict[str, Any]:
        """Per-epoch metrics under ``epochs`` and the run's totals."""
        epochs = []
        for k, r in enumerate(self.runs, start=1):
            d = r.summary.to_dict()
            d["epoch"] = k
            epochs.append(d)
        steps = sum(int(d["n_trainer_steps"]) for d in epochs)
        time = sum(float(d["run_time"]) for d in epochs)
        scout: dict[str, Any] = {}
        if self.scout is not None:
            s = self.scout.summary
            scout = {"scout": {**scout_summary(self.scout, s.extra["scout_tokens"]), "run_time": s.run_time,
                               "responses": s.samples_generated}}  # fmt: skip
            if self.runs and "samples_carried" in self.runs[0].summary.extra:  # --scout-keep
                scout["scout"]["responses_kept"] = int(self.runs[0].summary.extra["samples_carried"])
            time += float(s.run_time)  # the epochs waited for it
        lags = [d["policy_lag_max"] for d in epochs if d.get("policy_lag_max") is not None]
        totals = {
            "n_epochs": len(epochs),
            "n_trainer_steps": steps,
            "run_time": time,
            "mean_iteration_time": time / steps if steps else None,
            "samples_generated": sum(int(d["samples_generated"]) for d in epochs),
            "policy_lag_max": max(lags) if lags else None,
        }
        return {"epochs": epochs, **scout, **totals}


def check_epoch_count(n_epochs: Any) -> None:
    """``--epochs`` is an integer in ``1..MAX_EPOCHS`` (the CLI asks before anything else about epochs)."""
    if isinstance(n_epochs, bool) or not isinstance(n_epochs, int) or not 1 <= n_epochs <= MAX_EPOCHS:
        raise ConfigError(f"--epochs must be an integer in 1..{MAX_EPOCHS}, got {n_epochs!r}")


def run_epochs(
    plan: Plan,
    n_epochs: int,
    log_dir: str | os.PathLike,
    *,
    config: Any,
    actual_lengths: dict[str, np.ndarray] | None = None,
    lengths_source: dict[str, Any] | None = None,
    length_drift: float = 0.0,
    overwrite: bool = False,
    compile_overrides: dict[str, Any] | None = None,
    replan_every: int | None = None,
    resume: bool = False,
    backend: Any = None,
    trainer: Any = None,
    scout: bool = False,
    scout_tokens: int | None = None,
    scout_keep: bool = False,
    scout_keep_through: int | None = None,
    scout_roll: bool = False,
    scout_windows: int | None = None,
    plan_name: str = "",
    **run_kwargs: Any,
) -> EpochsResult:
    """Run ``plan`` for ``n_epochs`` passes; epoch ``k >= 2`` is compiled from epochs ``1..k-1``.

    Parameters
    ----------
    plan
        The first epoch's plan (:class:`aspc.emit.Plan`).
    n_epochs
        Passes, ``1..MAX_EPOCHS``.
    log_dir
        Directory for ``plans/epoch-K.parquet`` and the ``epoch-K/`` run logs.
    config
        :class:`aspc.runtime.RunConfig` of every epoch (the seed moves by one per epoch).
    actual_lengths
        Recorded lengths the simulator replays (see the module notes); None
        draws them from each epoch's plan.
    lengths_source
        Their file's identity (:func:`aspc.runtime.run`), logged with ``length_drift`` for ``--resume``.
    length_drift
        ``F``: epoch ``k`` replays lengths scaled by ``(1 + F) ** (k - 1)``; ``> -1``.
    compile_overrides
        :class:`CompileConfig` fields to change from the plan's own record.
    replan_every
        Re-plan every epoch during its run too (``--replan``), every this many
        trainer steps; its revisions go to ``RUN/epoch-K/plans/``.
    resume
        Continue the epochs at ``log_dir`` (see the module notes); with no
        epoch there yet it is a fresh run.
    backend, trainer
        Real components (:func:`aspc.runtime.registry.make_components`),
        kept open across the epochs and closed at the end (see the module
        notes); ``None`` lets each epoch's run build the sim ones.
    scout, scout_tokens
        Run a length scout before epoch 1 and plan epoch 1 from it (see the
        module notes); its cut ``T`` (default: the response cap / 4,
        :func:`aspc.scout.scout_tokens`).
    scout_keep, scout_keep_through
        Keep each scout response that finished under the cut as its
        prompt's last sample of epoch 1 (:mod:`aspc.runtime.carry`; the sim
        backend only), only in minibatches dispatched with weights version
        ``<= scout_keep_through`` (``None``: all).
    scout_roll, scout_windows
        Scout inside epoch 1 instead, window by window (``--scout-roll``,
        :mod:`aspc.rolling_scout`; any backend): no ``RUN/scout/``, epoch 1's
        plan holds the scout rows and each window's revision is in
        ``RUN/epoch-1/plans/``.
    plan_name
        The PLAN path, for messages.
    run_kwargs
        Passed to :func:`aspc.runtime.run` (cost model, lengths name, progress).
    """
    check_epoch_count(n_epochs)
    if isinstance(config.seed, int) and 0 <= config.seed <= SEED_MAX < config.seed + n_epochs - 1:
        # Refused after epoch 1 had run (its run() checks its own seed), for a seed the user never gave.
        raise ConfigError(f"--seed {config.seed} with --epochs {n_epochs}: epoch k runs seed {config.seed} + k - 1, "
                          f"past 2**63-1; use a --seed of at most {SEED_MAX - n_epochs + 1}")  # fmt: skip
    if scout_tokens is not None and not scout:
        raise ConfigError("--scout-tokens sets the cut of the length scout: pass --scout too, or drop it")
    tokens = scout_tokens_of(config.max_new_tokens, scout_tokens) if scout else None
    check_keep(scout, scout_keep, scout_keep_through, real=backend is not None or trainer is not None,
               replan=replan_every is not None)  # fmt: skip
    check_roll_run(scout, scout_roll, scout_windows, keep=scout_keep, replan=replan_every is not None)
    if not np.isfinite(length_drift) or length_drift <= -1:
        raise ConfigError(f"--length-drift must be a number > -1, got {length_drift}")
    if length_drift and actual_lengths is None:
        raise ConfigError("--length-drift scales replayed lengths: pass --actual-lengths too")
    if length_drift:
        top = max((float(np.max(v)) for v in actual_lengths.values() if len(v)), default=0.0)
        try:
            grown = top * (1.0 + length_drift) ** (n_epochs - 1) if top else 0.0
        except OverflowError:  # past a float: refused below, where it was a traceback
            grown = float("inf")
        if not np.isfinite(grown) or grown > MAX_REPLAYED_LENGTH:
            raise ConfigError(
                f"--length-drift {length_drift:g}: epoch {n_epochs}'s longest response would be {grown:.3g} tokens, "
                f"above {MAX_REPLAYED_LENGTH:,.0f}; use a smaller drift or fewer --epochs"
            )
    replays = backend is not None and bool(getattr(getattr(backend, "options", None), "replay", False))
    if length_drift and backend is not None and not replays:
        raise ConfigError("--length-drift scales replayed lengths: a real backend replays them only with --replay-lengths")
    carry = backend is not None or trainer is not None
    root = Path(log_dir)
    plans_dir = root / "plans"
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; pass one of them")
    layout = check_log_layout(root, epochs=True, scout=scout and not scout_roll, resume=resume, overwrite=overwrite,
                              n_epochs=n_epochs, scout_roll=scout and scout_roll)  # fmt: skip
    if resume and tokens is not None and not scout_roll:
        check_scout_cut(root, tokens)
    run_kwargs["lengths_source"] = {**(lengths_source or {}), "length_drift": float(length_drift)}
    n = config.samples_per_prompt or int(plan.table.column(S.N_SAMPLES)[0].as_py())
    if scout_roll and n < 2 and config.max_staleness is None:
        raise ConfigError(f"--scout-roll keeps a scout response as one of its prompt's samples, so it needs "
                          f"--samples-per-prompt >= 2 (got {n}) or --max-staleness (under which it keeps none); use --scout or "
                          "--scout --scout-keep")  # fmt: skip
    # Refused here, before the lock, the plans directory, a scout or epoch 1.
    check_epochs_staleness(plan, config, epochs=n_epochs, scout=tokens is not None, scout_roll=scout_roll,
                           windows=scout_windows, replan=replan_every is not None,
                           compile_overrides=compile_overrides)  # fmt: skip
    cfg = epoch_compile_config(plan, config, compile_overrides)
    if SEED_MAX < cfg.seed + n_epochs - 1:
        # Epoch k's plan is compiled with the plan's seed + k - 1: refused before epoch 1, not after it.
        raise ConfigError(f"--epochs {n_epochs}: {plan_name or 'the plan'} was compiled with --seed {cfg.seed}, and "
                          f"epoch k's plan is compiled with seed {cfg.seed} + k - 1, past 2**63-1; compile the plan "
                          f"with a --seed of at most {SEED_MAX - n_epochs + 1}")  # fmt: skip
    table = prompt_table_of(plan.table, plan.input_hash)
    replay_base = backend.options.replay_lengths if replays else None
    scout_lengths = scout_replay = None
    if tokens is not None:  # refused before anything is written
        ids = [str(p) for p in table.ids]
        scout_lengths = None if actual_lengths is None else spare_length_map(actual_lengths, n, ids)
        scout_replay = None if replay_base is None else spare_length_map(replay_base, n, ids)
    replay_name = getattr(getattr(backend, "options", None), "replay_source", "") or ""
    check_lengths_cover(plan, [(actual_lengths, run_kwargs.get("lengths_name", "")), (replay_base, replay_name)], n,
                        length_drift)  # fmt: skip
    # One epochs run per directory: a second one (two --resume at once, an --overwrite of a live
    # run) stops here, before it writes anything; each epoch's log has its own lock as well.
    root_lock = RunLogLock(root)
    try:
        root_lock.acquire()
        if resume:  # before anything is written: an epoch log no resume reads, or another --length-drift
            check_epoch_logs(root, n_epochs, None if actual_lengths is None else length_drift)
        if overwrite and layout is not None:
            # Another kind of run, or more epochs than this one will write: none of it may survive.
            clear_run_dir(root, root_held=True)
        plans_dir.mkdir(parents=True, exist_ok=True)
        runs: list[RunResult] = []
        plans: list[Plan] = []
        current = plan
        scouted = carried = None
        if tokens is not None and not scout_roll:
            part_of = {k: v for k, v in config_record(config).items() if k not in OPERATIONAL_KEYS}
            # Not --epochs: a resume may ask for more epochs than the run began with.
            part_of.update(scout_keep=bool(scout_keep), scout_keep_through=scout_keep_through, replan_every=replan_every)
            if resume:
                check_scout_part_of(root, part_of)
            scout_kw = dict(lengths=scout_lengths, replay=scout_replay, backend=backend, trainer=trainer,
                            overwrite=overwrite, resume=resume, carry=carry, part_of=part_of)  # fmt: skip
            scouted, current, seen = _scout_epoch(plan, table, cfg, config, root, tokens, scout_kw, run_kwargs)
            if scout_keep:
                kept = dict(zip(table.ids, np.where(seen < tokens, np.rint(seen), -1).astype(np.int64).tolist(),
                                strict=True))  # fmt: skip
                carried = np.array([kept[p] for p in current.table.column(S.PROMPT_ID).to_pylist()], dtype=np.int64)
        for k in range(1, n_epochs + 1):
            roll = None
            if k == 1 and scout_roll:
                assert tokens is not None
                current, roll = rolling_epoch(plan, table, dataclasses.replace(cfg, samples_per_prompt=n), config.workers,
                                              tokens, scout_windows, history_prior_metadata(), root / "epoch-1",
                                              keep=config.max_staleness is None)  # fmt: skip
            if k > 1:
                pred = epoch_prediction(plan, [root / f"epoch-{j}" for j in range(1, k)])
                current = compile_plan(
                    table,
                    pred,
                    dataclasses.replace(cfg, seed=cfg.seed + k - 1),
                    predictor_identity={"kind": "epochs", "epoch": k, "base": plan.predictor},
                )
            plan_path = plans_dir / f"epoch-{k}.parquet"
            if resume and plan_path.exists():
                current = check_stored_plan(current, plan_path, k, plan_name, given=k == 1 and tokens is None)
            else:
                write_plan(current, plan_path)
            plans.append(current)
            lengths = None if actual_lengths is None else epoch_lengths(actual_lengths, k, n, length_drift)
            if replay_base is not None:
                # The real backend replays this epoch's rotation too (read when the run sets it up).
                replay = epoch_lengths(replay_base, k, n, length_drift)
                if roll is not None:  # and a scout row its prompt's spare length, cut at T
                    replay = {**replay, **scout_lengths_of(scout_replay, tokens)}
                backend.options = dataclasses.replace(backend.options, replay_lengths=replay)
            if roll is not None and lengths is not None:
                lengths = {**lengths, **scout_lengths_of(scout_lengths, tokens)}
            replanner = roll
            if replan_every is not None:
                replanner = OnlineReplanner(
                    current.table,
                    dataclasses.replace(cfg, seed=cfg.seed + k - 1, workers=config.workers),
                    every_steps=replan_every,
                    log_dir=root / f"epoch-{k}",
                    input_hash=plan.input_hash,
                )
            runs.append(
                run(
                    current,
                    # A rolling scout's plan holds its own counts (its scout rows one sample each).
                    config=dataclasses.replace(config, seed=config.seed + k - 1,
                                               samples_per_prompt=None if roll else config.samples_per_prompt),
                    actual_lengths=lengths,
                    log_dir=root / f"epoch-{k}",
                    overwrite=overwrite,
                    resume=resume,
                    replanner=replanner,
                    backend=backend,
                    trainer=trainer,
                    keep_open=carry,
                    start_weights=trainer.current_weights() if (k > 1 and trainer is not None) else None,
                    carried=carried if k == 1 else None,
                    carry_through=scout_keep_through,
                    **run_kwargs,
                )
            )
            # The plan's prompt texts let 'aspc predict train RUN/epoch-K' learn from the epoch.
            keep_plan_in_log(plan_path, root / f"epoch-{k}")
        return EpochsResult(runs, plans, scout=scouted)
    finally:
        root_lock.release()
        if carry:  # kept open across the epochs; closed once, also after a failure
            for part in (backend, trainer):
                if part is not None:
                    part.close()


def _scout_epoch(
    plan: Plan, table: Any, cfg: CompileConfig, config: Any, root: Path, tokens: int,
    kw: dict[str, Any], run_kwargs: dict[str, Any],
) -> tuple[RunResult, Plan, np.ndarray]:  # fmt: skip
    """Run the length scout into ``root/scout`` and compile epoch 1's plan from it; also each prompt's scouted length."""
    t = plan.table
    ids = [str(p) for p in table.ids]
    assert ids == [str(p) for p in t.column(S.PROMPT_ID).to_pylist()]
    prior = prediction_of(t)
    backend = kw["backend"]
    saved = None
    if backend is not None:  # the scout's cut, and its replayed lengths, for this run only
        saved = backend.options
        replay = {"replay_lengths": kw["replay"]} if kw["replay"] is not None else {}
        backend.options = dataclasses.replace(saved, max_new_tokens=tokens, **replay)
        # The epochs' cap, checked before the scout, not after it (without --max-new-tokens: the default,
        # unless the epochs replay lengths, whose longest sets it when they run).
        backend.later_cap = saved.max_new_tokens or (None if saved.replay else DEFAULT_MAX_NEW_TOKENS)
    splan = scout_plan(table, prior, cfg, config.workers, tokens)
    try:
        result = run(
            splan,
            config=scout_run_config(config, len(ids), tokens),
            actual_lengths=kw["lengths"],
            log_dir=root / "scout",
            overwrite=kw["overwrite"],
            resume=kw["resume"],
            backend=backend,
            trainer=kw["trainer"],
            keep_open=kw["carry"],
            part_of=kw["part_of"],  # a resume killed in the scout is checked against the epochs' options
            **run_kwargs,
        )
    finally:
        if saved is not None:
            backend.options, backend.later_cap = saved, None
    result.summary.extra["scout_tokens"] = tokens
    observed = read_history(root / "scout")
    seen = np.array([float(np.min(observed[p])) if p in observed and len(observed[p]) else np.nan for p in ids])
    if np.isnan(seen).any():
        raise ConfigError(f"the length scout in {root / 'scout'} has no response for some prompts; pass --overwrite")
    pred = scouted_prediction(table, prior, np.minimum(seen, tokens), history_prior_metadata())
    first = compile_plan(
        table,
        cap_prediction(pred, cap_for_plan(plan.config, cfg.max_response_length)),
        cfg,
        predictor_identity={"kind": "scout", "scout_tokens": tokens, "base": plan.predictor},
    )
    return result, first, seen
