"""``aspc probe PROMPTS``: one response for a seeded sample of prompts, logged, then a predictor trained on it.

The first epoch of an RL run has no history, and the shipped predictor knows
other models, not the policy being trained. A probe run generates one
response for each of K prompts (default 4,000, the preprint's size) with the
policy, through the same runtime and backend options as ``aspc run``, writes
an ordinary run log (with the plan inside it, as ``RUN/plan.parquet``), and
trains a predictor on the logged (prompt, length) pairs, by default refitting
the shipped one (``--init default``). With ``--backend sim --actual-lengths``
it is the offline rehearsal of the same workflow.

    aspc probe prompts.jsonl --backend hf --model DIR --prompts 4000 --log probe/ -o pred/
    aspc probe prompts.jsonl --backend sim --actual-lengths prompts.jsonl --length-field lengths \\
        --prompts 500 --seed 0 --log probe/ -o pred/

With ``--prompts`` at least the dataset's size, ``--max-new-tokens T`` and
wide minibatches (``--batch-size 256``) it is a length scout
(:mod:`aspc.scout`): ``aspc compile PROMPTS --history probe/`` then plans the
epoch from every prompt's scouted length.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click

from aspc.choices import ON_BAD_LINE, PREDICTOR_KINDS
from aspc.cli.backend_options import build_real_components, real_backend_options
from aspc.cli.common import (
    CliError,
    RichProgress,
    emit_json,
    handle_errors,
    json_option,
    note,
    quiet_option,
    rerun_command,
    results_only_on_stdout,
    shell_word,
    skipped_json,
    skipped_note,
)
from aspc.cli.options import check_lengths_field
from aspc.cli.paths import PathArg
from aspc.cli.runtime_options import run_config_from_kwargs, runtime_options
from aspc.errors import AspcError, ConfigError

DEFAULT_PROBE_PROMPTS = 4000  # the preprint fine-tunes its predictor on 4,000 prompt-length pairs


def _subset(table: Any, k: int, seed: int) -> Any:
    """A seeded sample of ``k`` prompts of ``table``, kept in input order."""
    import numpy as np

    n = len(table)
    return table.take(np.sort(np.random.default_rng(seed).choice(n, size=min(k, n), replace=False)))


@click.command("probe")
@click.argument("prompts_path", metavar="PROMPTS", type=PathArg(dir_okay=False, path_type=Path))
@click.option(
    "--prompts",
    "n_prompts",
    type=int,
    default=DEFAULT_PROBE_PROMPTS,
    show_default=True,
    help="Prompts to probe (a seeded sample; all of them when the dataset is smaller).",
)
@click.option("--log", "log_dir", type=PathArg(file_okay=False, path_type=Path), required=True,
              help="Run log directory to write (new, or --overwrite).")  # fmt: skip
@click.option("-o", "--output", type=PathArg(file_okay=False, path_type=Path), required=True,
              help="Predictor directory to write (replaced atomically).")  # fmt: skip
@click.option("--kind", type=click.Choice(PREDICTOR_KINDS), default="lexical", show_default=True,
              help="Predictor kind to train on the probe's pairs.")  # fmt: skip
@click.option("--batch-size", type=int, default=None,
              help="Prompts per probe minibatch [default: 16]. A length scout (aspc.scout) uses wide ones, "
                   "e.g. 256: one response per prompt has no sibling to share its minibatch's longest one.")  # fmt: skip
@click.option("--init", type=PathArg(), default="default", show_default=True, metavar="DIR|default|none",
              help="Predictor to refit (and to schedule the probe with); 'none' trains from scratch.")  # fmt: skip
@runtime_options
@real_backend_options
@click.option("--actual-lengths", type=PathArg(path_type=Path), default=None,
              help="sim backend: dataset (or run log) of real lengths by prompt id; sample 0 replays the "
                   "first length. Without it the sim draws lengths from the predictions.")  # fmt: skip
@click.option("--length-field", default="length", show_default=True, help="Length field in --actual-lengths.")
@click.option("--prompt-field", default="prompt", show_default=True, help="Prompt field in PROMPTS.")
@click.option("--id-field", default="id", show_default=True, help="Prompt id field in PROMPTS and --actual-lengths.")
@click.option("--on-bad-line", type=click.Choice(ON_BAD_LINE), default="error", show_default=True,
              help="What to do with a malformed row of PROMPTS.")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the sample, the run and training.")
@click.option("--overwrite", is_flag=True, help="Replace an existing aspc run log at --log.")
@click.option("--resume", is_flag=True,
              help="Continue the probe's run log after an interruption or a failure (same options), then train.")  # fmt: skip
@json_option
@quiet_option
@handle_errors
@results_only_on_stdout()
def probe_cmd(
    prompts_path: Path,
    n_prompts: int,
    log_dir: Path,
    output: Path,
    kind: str,
    batch_size: int | None,
    init: str,
    actual_lengths: Path | None,
    length_field: str,
    prompt_field: str,
    id_field: str,
    on_bad_line: str,
    seed: int,
    overwrite: bool,
    resume: bool,
    as_json: bool,
    quiet: bool,
    **kwargs: Any,
) -> None:
    """Generate one response per sampled prompt, log the run, and train a predictor on it.

    \b
    aspc probe prompts.jsonl --backend hf --model DIR --prompts 4000 --log probe/ -o pred/
    aspc probe prompts.jsonl --backend sim --actual-lengths prompts.jsonl --length-field lengths \\
        --prompts 500 --seed 0 --log probe/ -o pred/
    aspc probe prompts.jsonl ...same options... --log probe/ -o pred/ --resume   # after a signal or a failure
    """
    from aspc.atomic import check_writable
    from aspc.cli.predict import train_from_pairs
    from aspc.compiler import CompileConfig, compile_plan
    from aspc.emit import write_plan
    from aspc.errors import Interrupted
    from aspc.interrupt import signal_name
    from aspc.io import read_prompts
    from aspc.predict import MIN_PAIRS, check_init_kind, default_predictor_path, load_predictor, predictor_path
    from aspc.predict.base import check_output_dir
    from aspc.predict.pairs import PLAN_IN_LOG, read_run_log_pairs
    from aspc.runtime import run
    from aspc.runtime.config import check_log_options

    check_log_options(log_dir, overwrite=overwrite, resume=resume)
    if n_prompts < MIN_PAIRS:
        raise ConfigError(f"--prompts {n_prompts}: a predictor needs at least {MIN_PAIRS} pairs; probe more prompts")
    from aspc.guards import check_compile_config, check_output, check_seed

    check_seed(seed)
    compile_config = CompileConfig(samples_per_prompt=1, seed=seed, batch_size=batch_size)
    check_compile_config(compile_config)
    init_arg = None if init.lower() == "none" else init
    # The shipped predictor is read either way: refit (--init default) or scheduling the probe (--init none).
    predictor_dir = default_predictor_path() if init_arg is None else predictor_path(init_arg)
    reads = [prompts_path, actual_lengths, predictor_dir]
    if kwargs.get("sim_cost_model"):  # a --cost-model inside -o or --log would be deleted with it
        reads.append(kwargs["sim_cost_model"])
    output = check_output(output, inputs=reads, kind="dir")
    check_output_dir(output)
    check_writable(output)  # found now, not after the generations
    check_output(log_dir, inputs=reads, kind="dir", option="--log", others={"-o": output}, resume=resume)
    if resume and not (log_dir / "meta.json").is_file():
        raise ConfigError(f"--log {log_dir}: no probe run log to resume there; probe without --resume")
    # Said here: the run log's own words for a log in use speak of a run, not a probe.
    if not overwrite and not resume and log_dir.is_dir() and any(log_dir.iterdir()):
        from aspc.runtime.record.lock import refuse_if_locked

        refuse_if_locked(log_dir)  # a log in use is refused as such, not as one to pass --overwrite for
        again = "pass --resume to finish the probe it holds, or --overwrite to probe again" if (
            log_dir / "meta.json").is_file() else "or pass --overwrite to probe again"
        raise ConfigError(f"--log {log_dir}: directory exists and is not empty; pick a new path, {again}")
    check_lengths_field(actual_lengths)
    config, cost = run_config_from_kwargs(kwargs, seed=seed, samples_per_prompt=1)
    table = read_prompts(prompts_path, prompt_field=prompt_field, id_field=id_field, on_bad_line=on_bad_line)
    if len(table) < MIN_PAIRS:
        raise ConfigError(
            f"{prompts_path.name}: {len(table)} prompts, a probe needs at least {MIN_PAIRS} to train a predictor"
        )
    scheduler = load_predictor(predictor_dir)
    if init_arg is not None:  # before any generation: the refit needs it to be of --kind's kind
        check_init_kind(scheduler, kind, init_arg)
    lengths = None
    if actual_lengths is not None:
        from aspc.io.history import read_history

        lengths = read_history(actual_lengths, id_field=id_field, length_field=length_field, option="--length-field")
    backend, trainer, backend_notes = build_real_components(
        kwargs, config, cost, lengths, actual_lengths.name if actual_lengths else ""
    )
    for msg in backend_notes:
        note(msg, quiet)
    skipped_note(table.skipped, quiet)
    sample = _subset(table, n_prompts, seed)
    if len(sample) < n_prompts:
        note(f"{prompts_path.name} has {len(table)} prompts: probing all of them", quiet)
    with RichProgress(quiet) as progress:
        progress.stage("predict", total=1)
        prediction = scheduler.predict(sample.texts, ids=sample.ids)
        progress.done()
        plan = compile_plan(
            sample,
            prediction,
            dataclasses.replace(compile_config, workers=config.workers),
            predictor_identity=scheduler.identity(),
            progress=progress,
        )
        before = _meta_bytes(log_dir)
        try:
            result = run(
                plan,
                config=config,
                sim_cost_model=cost,
                actual_lengths=lengths,
                lengths_name=actual_lengths.name if actual_lengths else "",
                backend=backend,
                trainer=trainer,
                log_dir=log_dir,
                overwrite=overwrite,
                resume=resume,
                progress=progress,
            )
        except BaseException as exc:
            # This run's log (it wrote one: no plan inside yet) keeps its committed samples: with the plan
            # beside them 'aspc predict train LOG' can use them. A log this run did not write (refused, or
            # another process's) never gets this plan: its samples may be another plan's.
            wrote = (now := _meta_bytes(log_dir)) is not None and now != before
            if wrote and not (log_dir / PLAN_IN_LOG).exists():
                write_plan(plan, log_dir / PLAN_IN_LOG)
            if isinstance(exc, Interrupted):
                raise CliError(_interrupted(exc, log_dir), exc.exit_code) from None
            raise
        # The plan goes inside the log: it holds the prompt texts 'aspc predict train RUN' needs.
        write_plan(plan, log_dir / PLAN_IN_LOG)
        # The generations are the costly part (a real backend): a failed or interrupted training keeps
        # them and names the command that trains from them, with this probe's options.
        again = " ".join(shell_word(a) for a in ["aspc", "predict", "train", str(log_dir), "--kind", kind,
                         *(["--init", init_arg] if init_arg else []), *(["--seed", str(seed)] if seed else []), "-o",
                         str(output)])  # fmt: skip
        try:
            pairs = read_run_log_pairs(log_dir)
            pred = train_from_pairs(pairs, kind, where=str(log_dir), init=init_arg, seed=seed, progress=progress)
            progress.stage("write")
            pred.save(output)
            progress.done()
        except Interrupted as exc:
            raise CliError(f"interrupted by {signal_name(exc.signum)} while training; the probe's run log {log_dir} "
                           f"is complete: train from it with '{again}'", exc.exit_code) from None  # fmt: skip
        except AspcError as exc:
            raise type(exc)(
                f"{exc}; the probe's run log {log_dir} is kept: once the cause is fixed, train from it with "
                f"'{again}' (or, if the generations are the cause, probe again with --overwrite)"
            ) from None
    for msg in result.notes:
        note(msg, quiet)
    summary = {
        "log": str(log_dir),
        "output": str(output),
        "prompts": len(sample),
        "samples": pairs.n_samples,
        "init": init_arg,
        "identity": pred.identity(),
        "validation": pred.metadata.get("validation"),
        "n_skipped": len(table.skipped),
        **skipped_json(table.skipped),
    }
    if as_json:
        emit_json(summary)
        return
    note(
        f"probed {len(sample)} prompts ({config.backend} backend), run log in {log_dir}; "
        f"wrote {kind} predictor to {output}" + (f" (refit from {init_arg})" if init_arg else ""),
        quiet,
    )


def _meta_bytes(log_dir: Path) -> bytes | None:
    """The log's ``meta.json`` as it is now (``None``: none), to tell whether a run wrote it."""
    try:
        return (log_dir / "meta.json").read_bytes()
    except OSError:
        return None


def _interrupted(exc: Any, log_dir: Path) -> str:
    """One line: what a signal during the probe's generations left, and the command that continues it."""
    from aspc.interrupt import signal_name

    name = signal_name(exc.signum)
    if not (log_dir / "meta.json").is_file():
        return f"interrupted by {name} before the probe's run log was started; nothing was written to {log_dir}"
    cmd = rerun_command("probe", "--resume") or "aspc probe <the same options> --resume"
    plan = log_dir / "plan.parquet"
    kept = f" (and the plan, {plan})" if plan.is_file() else ""
    return (f"interrupted by {name}; the probe's run log {log_dir} keeps every committed sample{kept}: "
            f"continue it, then train, with {cmd}")  # fmt: skip

