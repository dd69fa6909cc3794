"""Schedules side by side: compile one input with several strategies, simulate each.

The library form of ``aspc simulate``. It sits above both halves of aspc: it
compiles (:mod:`aspc.compiler`) and runs (:func:`aspc.runtime.run`), so
neither half imports the other. Every strategy is compiled from the
same prompts and predictions and replayed on the same actual lengths with the
same run configuration and seed, so differences come from the schedule alone.
``oracle`` is ``asp`` compiled with the actual lengths as its predictions
(each prompt's recorded length distribution: the realistic ceiling of a
per-prompt predictor); ``oracle-exact`` with exactly the lengths each sample
will replay. ``asp+replan`` is ``asp`` re-planned during the run
(:mod:`aspc.replan`); ``asp+scout`` is ``asp`` planned from a length scout
run first (:mod:`aspc.scout`: one response per prompt, cut at
``scout_tokens``, replaying a recorded length the run itself does not), the
scout's time included; ``asp+scout+keep`` also keeps every scouted response
that finished under the cut as its prompt's last sample, so the run generates
one sample fewer of that prompt (the kept sample's weights version is the
run's first, so its policy lag grows with how late its group is consumed).
``asp+scout+roll`` scouts window by window inside the run and keeps the same
way, a window or two old (:mod:`aspc.rolling_scout`).

Repeats. One simulation is one draw: which recorded lengths the samples
replay, and the random baseline's shuffle, move a single ratio by several
percent. With ``repeats`` R, repeat r uses seed ``seed + r`` for the compile
(random baseline, annealer) and the run, and when prompts have more recorded
lengths than samples, repeats after the first draw (seeded) which of them the
samples replay; repeat 0 replays them in recorded order, so it is the single
run of seed ``seed``. :func:`aspc.simulate_compare.comparison_table` reports
the repeats' means (maxima for ``*_max``) and each ratio's spread.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from aspc.caps import cap_lengths, cap_prediction
from aspc.choices import STRATEGIES
from aspc.compiler import compile_plan, prediction_from_lengths, prepare_selected
from aspc.emit import schema as S
from aspc.errors import ConfigError, InputError
from aspc.guards import SEED_MAX
from aspc.io.history import read_history
from aspc.io.lengths_by_id import LengthsById
from aspc.io.table import PromptTable
from aspc.progress import NULL_PROGRESS, Progress
from aspc.runtime.api import run
from aspc.runtime.backends.sim_cost import SimCostModel
from aspc.runtime.config import RunConfig
from aspc.simulate_compare import comparison_table  # noqa: F401  (the results' table, re-exported)
from aspc.simulate_inputs import ReadOnce, RowAligned, draw_lengths, known_lengths, unaligned

ORACLE = "oracle"
ORACLE_EXACT = "oracle-exact"
REPLAN = "asp+replan"
SCOUT = "asp+scout"
SCOUT_KEEP = "asp+scout+keep"
SCOUT_ROLL = "asp+scout+roll"
SCOUTS = (SCOUT, SCOUT_KEEP, SCOUT_ROLL)
EXTRA_STRATEGIES = (REPLAN, SCOUT, SCOUT_KEEP, SCOUT_ROLL, ORACLE, ORACLE_EXACT)
# Strategies that read every prompt's actual lengths before the run.
NEEDS_ALL_LENGTHS = (SCOUT, SCOUT_KEEP, SCOUT_ROLL, ORACLE, ORACLE_EXACT)

# Every repeat's result is kept for the spread; a thousand already pins a mean down.
MAX_REPEATS = 1000


# Peak memory per simulated sample, at least: 216 bytes for asp alone, 413 for the default
# strategies (600 prompts x -n 100 vs 1000, /usr/bin/time -v aspc simulate examples/prompts.jsonl).
SIM_BYTES_PER_SAMPLE = 200


def check_sample_memory(samples: int) -> None:
    """Refuse a simulation that cannot fit: the kernel's OOM killer ended it with no word (``-n 1000000``)."""
    from aspc.memory import available_bytes

    have = available_bytes()
    need = samples * SIM_BYTES_PER_SAMPLE
    if have is not None and need > have:
        raise ConfigError(f"simulating {samples:,} samples needs at least {need / 2**30:.1f} GiB, more than the "
                          f"{have / 2**30:.1f} GiB available; lower --samples-per-prompt or simulate fewer prompts")


def parse_strategies(spec: str | list[str]) -> list[str]:
    """Strategy names from ``"random,sorted,asp,oracle"``; :class:`ConfigError` if unknown or empty."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    allowed = (*STRATEGIES, *EXTRA_STRATEGIES)
    bad = [s for s in names if s not in allowed]
    if bad:
        raise ConfigError(f"unknown strategies {bad}; use a comma list of {', '.join(allowed)}")
    if not names:
        raise ConfigError(f"--strategies is empty; use a comma list of {', '.join(allowed)}")
    return list(dict.fromkeys(names))


def simulate_strategies(
    input_path: str | os.PathLike,
    inputs: Any,
    config: Any,
    run_config: RunConfig,
    *,
    strategies: list[str],
    sim_cost_model: SimCostModel | None = None,
    actual_lengths_path: str | os.PathLike | None = None,
    repeats: int = 1,
    scout_tokens: int | None = None,
    keep_through: int | None = None,
    scout_windows: int | None = None,
    progress: Progress = NULL_PROGRESS,
    skipped: list[Any] | None = None,
    selected: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Compile ``input_path`` with each strategy and simulate every plan.

    Parameters
    ----------
    input_path
        The prompt dataset.
    inputs, config
        :class:`aspc.compiler.InputOptions` and :class:`aspc.compiler.CompileConfig`
        applied to every strategy (its ``strategy`` field is replaced).
        ``inputs.length_field`` names the actual lengths; they are never used
        as predictions, except by ``oracle``.
    run_config
        Workers, global batch, queue, reload, return mode, seed.
    strategies
        Names from :func:`parse_strategies`.
    actual_lengths_path
        A separate dataset (or run log) of actual lengths, joined by prompt id
        on ``inputs.id_field`` / ``inputs.length_field``.

    repeats
        Simulations per strategy (see the module notes); ``>= 1``.
    scout_tokens
        ``asp+scout``'s cut T (default: the response cap / 4, see
        :func:`aspc.scout.scout_tokens`).
    keep_through
        ``asp+scout+keep``: keep a scout response only where its minibatch is
        dispatched with weights version <= this (older dispatches generate
        that sample afresh), which bounds how much older than its group a
        kept sample is; ``None`` keeps every finished one.
    scout_windows
        ``asp+scout+roll``'s window count (default
        :data:`aspc.rolling_scout.DEFAULT_WINDOWS`).
    skipped
        A list to extend with the rows ``--on-bad-line skip`` left out of
        ``input_path`` (:class:`aspc.io.SkippedRow`), for the caller to report.
    selected
        A dict to update with the prompts ``--max-prompt-length`` and ``--for
        verl`` left out of every plan (``n_excluded_overlong``, ..., as in a
        compiled plan's metrics; nothing when neither is given).

    Returns
    -------
    dict
        strategy -> :class:`aspc.runtime.RunResult` (a list of one per repeat
        when ``repeats > 1``), in the order given.
    """
    config, run_config = _one_cap(config, run_config)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
        raise ConfigError(f"--repeats must be an integer in 1..{MAX_REPEATS}, got {repeats!r}")
    if isinstance(config.seed, int) and 0 <= config.seed <= SEED_MAX < config.seed + repeats - 1:
        raise ConfigError(f"--seed {config.seed} with --repeats {repeats}: repeat r runs seed {config.seed} + r, past "
                          f"2**63-1; use a --seed of at most {SEED_MAX - repeats + 1}")  # fmt: skip
    if scout_tokens is not None:
        from aspc.scout import scout_tokens as check_tokens

        if not any(s in SCOUTS for s in strategies):
            raise ConfigError(f"--scout-tokens applies to the {SCOUT} strategy; add it to --strategies or drop the option")
        check_tokens(run_config.max_new_tokens, scout_tokens)
    if keep_through is not None:
        if SCOUT_KEEP not in strategies:
            raise ConfigError(f"--scout-keep-through applies to the {SCOUT_KEEP} strategy; add it to --strategies or drop the option")
        if isinstance(keep_through, bool) or not isinstance(keep_through, int) or keep_through < 0:
            raise ConfigError(f"--scout-keep-through must be an integer >= 0 (a weights version), got {keep_through!r}")
    if scout_windows is not None or SCOUT_ROLL in strategies:
        from aspc.rolling_scout import check_rolling

        check_rolling(SCOUT_ROLL in strategies, scout_windows)
    if inputs.length_field is None and actual_lengths_path is None:
        raise InputError(
            "simulate needs actual response lengths: pass --length-field FIELD or --actual-lengths FILE"
        )
    no_lengths = dataclasses.replace(inputs, length_field=None)
    reader = ReadOnce(inputs, no_lengths) if actual_lengths_path is None else no_lengths
    # Every strategy plans the prompts a compile would hold: an oracle-only run read them all, past
    # --max-prompt-length and --for verl's remainder, and compared other prompts than a mixed run.
    needs_predictor = any(s not in (ORACLE, ORACLE_EXACT) for s in strategies)
    table, prediction, identity, selection = prepare_selected(input_path, reader, config, progress,
                                                              predict=needs_predictor)  # fmt: skip
    if selected is not None:
        selected.update(selection.metrics())
    if actual_lengths_path is not None:
        actual = read_history(
            actual_lengths_path, id_field=inputs.id_field, length_field=inputs.length_field or "length",
            option="--length-field",
        )
        name = os.path.basename(os.fspath(actual_lengths_path))
    else:
        same_read = reader.with_lengths is not None
        with_lengths = reader.with_lengths or inputs.read(input_path)
        assert with_lengths.lengths is not None
        actual = LengthsById(with_lengths.id_array, with_lengths.lengths)
        name = os.path.basename(os.fspath(input_path))
        if same_read:
            # The prompts are rows of this very read: each one's lengths are found by its input row.
            actual = RowAligned(actual, with_lengths.source_rows)

    if skipped is not None:
        skipped.extend(table.skipped)
    check_sample_memory(len(table.ids) * int(run_config.samples_per_prompt or config.samples_per_prompt or 1))
    if isinstance(actual, RowAligned):
        missing = []  # the table's prompts are some of the rows the lengths were read with
    elif isinstance(actual, LengthsById):
        missing = [table.ids[i] for i in actual.join(table.id_array)[0].tolist()]
    else:
        missing = [pid for pid in table.ids if pid not in actual]
    if missing and any(s in NEEDS_ALL_LENGTHS for s in strategies):
        raise InputError(
            f"{len(missing)} of {len(table.ids)} prompts have no actual length in {name}, "
            f"e.g. id {missing[0]!r}; check --length-field and --id-field"
        )
    if any(s in SCOUTS for s in strategies):
        # Refused before any strategy runs: found when the scout's turn came, a comparison of 10,000
        # prompts failed after 59 s and lost every result it had.
        from aspc.scout import spare_lengths

        spare_lengths(known_lengths(actual, table), run_config.samples_per_prompt or config.samples_per_prompt,
                      table.ids)  # fmt: skip
    results: dict[str, Any] = {}
    for r in range(repeats):
        seed = config.seed + r
        cfg_r = dataclasses.replace(config, seed=seed)
        run_r = dataclasses.replace(run_config, seed=seed)
        actual_r = actual if r == 0 else draw_lengths(unaligned(actual), seed)
        for strategy in strategies:
            res = _simulate_one(
                strategy, table, prediction, identity, actual_r, name, inputs, cfg_r, run_r,
                sim_cost_model, progress, scout_tokens, keep_through, scout_windows,
            )
            results.setdefault(strategy, []).append(res)
    return {k: (v[0] if repeats == 1 else v) for k, v in results.items()}


def _one_cap(config: Any, run_config: RunConfig) -> tuple[Any, RunConfig]:
    """The response cap, ``--max-response-length`` or ``--max-new-tokens``, set on both the compile and the run.

    One cap: the plans are predicted for responses that stop there, and the
    simulated responses stop there too. The compile's cap alone capped the
    plans and left every replayed response at its recorded length; the run's
    alone capped the responses and left the predictions uncapped.
    """
    from aspc.caps import check_cap

    asked = check_cap("--max-response-length", config.max_response_length)
    new_tokens = run_config.max_new_tokens
    if asked is not None and new_tokens is not None and asked != new_tokens:
        raise ConfigError(f"--max-response-length {asked} and --max-new-tokens {new_tokens} both cap the simulated "
                          "responses; give one of them (or both with the same value)")  # fmt: skip
    cap = asked if asked is not None else new_tokens
    return dataclasses.replace(config, max_response_length=cap), dataclasses.replace(run_config, max_new_tokens=cap)


def _simulate_one(
    strategy, table, prediction, identity, actual, name, inputs, config, run_config, cost, progress, scout_tokens=None,
    keep_through=None, scout_windows=None,
):
    from aspc.replan import OnlineReplanner

    if strategy == SCOUT_ROLL:
        return _rolling(table, prediction, actual, name, config, run_config, cost, progress, scout_tokens, scout_windows)
    no_lengths = dataclasses.replace(inputs, length_field=None)
    replanner = None
    n = run_config.samples_per_prompt or config.samples_per_prompt
    scout = None
    if strategy in (ORACLE, ORACLE_EXACT):
        known = known_lengths(actual, table)
        known = known if strategy == ORACLE else known.head(n)
        pred = prediction_from_lengths(cap_lengths(known, config.max_response_length))
        cfg = dataclasses.replace(config, strategy="asp", history=())
        ident: dict[str, Any] = {"kind": strategy, "field": inputs.length_field}
    elif strategy in SCOUTS:
        scout, pred, scouted = _scout(table, prediction, actual, n, config, run_config, cost, scout_tokens)
        cfg = dataclasses.replace(config, strategy="asp", history=())
        ident = {"kind": strategy, "base": identity, "scout_tokens": scout.summary.extra["scout_tokens"]}
    else:
        base = "asp" if strategy == REPLAN else strategy
        pred, cfg, ident = prediction, dataclasses.replace(config, strategy=base), identity
    plan = compile_plan(table, pred, cfg, predictor_identity=ident, inputs=no_lengths, progress=progress)
    if strategy == REPLAN:
        replanner = OnlineReplanner(plan.table, cfg, input_hash=table.input_hash)
    carried = None
    if strategy == SCOUT_KEEP:
        carried = _kept(table, plan.table, scouted, scout.summary.extra["scout_tokens"])
    res = run(
        plan,
        config=run_config,
        sim_cost_model=cost,
        actual_lengths=actual.for_plan(plan.table) if isinstance(actual, RowAligned) else actual,
        lengths_name=name,
        replanner=replanner,
        progress=progress,
        carried=carried,
        carry_through=keep_through if strategy == SCOUT_KEEP else None,
    )
    if scout is not None:
        from aspc.scout import after_scout

        res = after_scout(scout, res, run_config.workers, scout.summary.extra["scout_tokens"])
        if carried is not None:
            res.summary.extra["scout"]["responses_kept"] = res.summary.extra.pop("samples_carried")
    return res


def _scout(table, prediction, actual, n, config, run_config, cost, tokens):
    """Simulate the length scout and blend what it measured into the text prior (:mod:`aspc.scout`)."""
    from aspc.predict import load_predictor
    from aspc.scout import run_scout, scout_tokens, scouted_prediction, spare_lengths

    if config.history:
        raise ConfigError("asp+scout plans from its own scout of every prompt; drop --history")
    t = scout_tokens(run_config.max_new_tokens, tokens)
    lengths = spare_lengths(known_lengths(actual, table), n, table.ids)
    scout = run_scout(table, prediction, lengths, config, run_config, t, cost)
    scout.summary.extra["scout_tokens"] = t
    seen = np.minimum(lengths, t)  # what a response cut at T tokens shows
    metadata = getattr(load_predictor(config.predictor or "default", target=config.head), "metadata", {}) or {}
    pred = cap_prediction(scouted_prediction(table, prediction, seen, metadata), config.max_response_length)
    return scout, pred, lengths


def _rolling(table, prediction, actual, name, config, run_config, cost, progress, tokens, windows):
    """``asp+scout+roll``: the rolling scout (:mod:`aspc.rolling_scout`) in one simulated run."""
    from aspc.predict import load_predictor
    from aspc.rolling_scout import simulate_rolling
    from aspc.scout import scout_tokens, spare_lengths

    if config.history:
        raise ConfigError(f"{SCOUT_ROLL} plans from its own scouts of every prompt; drop --history")
    known = known_lengths(actual, table)
    spare = spare_lengths(known, run_config.samples_per_prompt or config.samples_per_prompt, table.ids)
    metadata = getattr(load_predictor(config.predictor or "default", target=config.head), "metadata", {}) or {}
    t = scout_tokens(run_config.max_new_tokens, tokens)
    return simulate_rolling(table, prediction, known, spare, name, config, run_config, cost, progress, t, windows,
                            metadata)  # fmt: skip


def _kept(table: PromptTable, plan_table: Any, scouted: np.ndarray, tokens: int) -> np.ndarray:
    """Per plan row, the scouted length where the scout's response finished under its cut ``tokens``, else -1.

    A response cut at the cap is unfinished: its prompt's group gets all its
    samples from the run.
    """
    row = {str(p): i for i, p in enumerate(table.ids)}
    order = np.array([row[str(p)] for p in plan_table.column(S.PROMPT_ID).to_pylist()], dtype=np.int64)
    s = np.asarray(scouted, dtype=np.float64)[order]
    return np.where(s < tokens, np.rint(s), -1).astype(np.int64)
