"""Under ``--max-staleness``: the plans an epochs or scout run compiles as it goes, sized before it starts.

``aspc run --epochs N`` compiles each epoch after the first from the log so
far, and ``--scout`` compiles epoch 1 from the scout's lengths; a bound that
one of those plans' minibatches could not meet was refused only when that
plan reached the runtime, after a whole epoch (or the scout) had run and its
plan had been written under ``--log``. The sizes are known up front: the
plans are asp over the run's prompts with the plan's batch size and slack, in
equal minibatches of ``b`` prompts under the bound's default order
(:data:`aspc.choices.BOUNDED_ORDER`), else cut by the DP into at most
``b + slack``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow.compute as pc

from aspc.choices import BOUNDED_ORDER, DEFAULT_ORDER
from aspc.compiler import CompileConfig, resolve_sizes
from aspc.emit import schema as S


def epoch_compile_config(plan: Any, config: Any, compile_overrides: dict[str, Any] | None) -> CompileConfig:
    """The settings the run's later plans are compiled with: the plan's own, in the bound's order under one."""
    from aspc.errors import ConfigError, PlanError, finding
    from aspc.guards import check_compile_config
    from aspc.replan import compile_config_of

    stored = plan.config or {}
    if not stored:  # later epochs would compile with every default (one sample per prompt, ...)
        raise PlanError("the plan has no stored compile settings (aspc.config), which later epochs and scouts "
                        "compile with (edited by hand?); recompile the plan")  # fmt: skip
    try:
        cfg = compile_config_of(stored, **(compile_overrides or {}))
        check_compile_config(cfg)
    except (ConfigError, TypeError) as exc:  # a value of the wrong type failed only when epoch 2 compiled
        raise PlanError(f"the plan's stored compile settings (aspc.config) fail a check: {finding(exc)} (edited by "
                        "hand?); recompile the plan") from None  # fmt: skip
    n = plan.table.column(S.N_SAMPLES)
    spp = stored.get("samples_per_prompt")
    if len(n) and spp is not None and pc.min(n).as_py() == pc.max(n).as_py() != spp:
        # Epoch 1 runs its rows' samples; later epochs compiled the config's, silently another count.
        raise PlanError(f"the plan's stored samples_per_prompt {spp!r} is not its rows' {pc.min(n).as_py()} "
                        "(edited by hand?); recompile the plan")  # fmt: skip
    if config.samples_per_prompt and config.samples_per_prompt != cfg.samples_per_prompt:
        # The run's -n: later plans balance the samples the epochs generate (their rows said the plan's count).
        cfg = dataclasses.replace(cfg, samples_per_prompt=int(config.samples_per_prompt))
    if config.max_staleness is not None and cfg.order == DEFAULT_ORDER:  # plans made here are for the bound
        cfg = dataclasses.replace(cfg, order=BOUNDED_ORDER)
    return cfg


def compiled_minibatch_bound(cfg: CompileConfig, n_prompts: int, samples: int, *, replan: bool) -> int:
    """Samples a minibatch of a plan compiled with ``cfg`` (or, with ``replan``, of its revisions) holds at most."""
    from aspc.runtime.config import revised_minibatch_bound

    b, d = resolve_sizes(cfg, n_prompts)
    rows = b if cfg.order == BOUNDED_ORDER else b + d  # equal minibatches, or the DP's widest
    largest = rows * int(samples)
    return revised_minibatch_bound(rows, d, samples, largest) if replan else largest


def check_epochs_staleness(
    plan: Any, config: Any, *, epochs: int, scout: bool, scout_roll: bool, windows: int | None,
    replan: bool, compile_overrides: dict[str, Any] | None,
) -> None:  # fmt: skip
    """Refuse a ``--max-staleness`` that a plan this run compiles later could not meet.

    Epoch 1's own plan is checked where it runs as it is
    (:func:`aspc.runtime.config.staleness_notes`); this covers the plans made
    from a scout (window by window with ``scout_roll``) and for epochs 2..N.
    """
    if config.max_staleness is None or not (scout or epochs > 1):
        return
    from aspc.rolling_scout import check_roll_staleness
    from aspc.runtime.config import check_staleness

    n_prompts = plan.table.num_rows
    n = config.samples_per_prompt or int(plan.table.column(S.N_SAMPLES)[0].as_py())
    if scout_roll:
        check_roll_staleness(config, n_prompts, n, windows)
    if (scout and not scout_roll) or epochs > 1:
        cfg = epoch_compile_config(plan, config, compile_overrides)
        check_staleness(config, compiled_minibatch_bound(cfg, n_prompts, n, replan=replan), revised=True)
