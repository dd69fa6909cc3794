"""``aspc predict``: train, evaluate and apply response-length predictors.

    aspc predict train TRAIN.jsonl --length-field length --kind lexical -o pred/
    aspc predict eval pred/ TEST.jsonl --length-field length --json
    aspc predict pred/ TEST.jsonl -o preds.parquet

The last form has no subcommand name: :class:`_DefaultGroup` routes a first
argument that is not a subcommand to the hidden ``apply`` command.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from aspc.choices import PREDICTOR_KINDS
from aspc.cli.common import (
    RichProgress,
    emit_json,
    handle_errors,
    json_option,
    note,
    out_console,
    quiet_option,
    skipped_json,
    skipped_note,
)
from aspc.cli.options import check_history_field
from aspc.cli.paths import PathArg
from aspc.cli.predict_eval import eval_cmd
from aspc.cli.predict_options import (
    check_device,
    check_fields,
    check_run_log_options,
    data_options,
    device_option,
    metrics_table,
    plan_option,
    read_pairs,
    target_field_option,
    target_option,
)
from aspc.errors import ConfigError

F = Callable[..., Any]
_DEFAULT_CMD = "apply"


class _DefaultGroup(click.Group):
    """A group whose first argument, when it names no subcommand, goes to ``apply``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = [_DEFAULT_CMD, *args]
        return super().parse_args(ctx, args)


@click.group("predict", cls=_DefaultGroup, invoke_without_command=False)
def predict_group() -> None:
    """Train, evaluate and apply response-length predictors.

    \b
    aspc predict train TRAIN.jsonl --length-field length --kind lexical -o pred/
    aspc predict eval pred/ TEST.jsonl --length-field length
    aspc predict pred/ TEST.jsonl -o preds.parquet      (or: default TEST.jsonl)
    """


predict_group.add_command(eval_cmd)


def _init_option(fn: F) -> F:
    return click.option(
        "--init",
        type=PathArg(),
        default=None,
        metavar="DIR|default",
        help="Refit from an existing predictor (a directory, or 'default'): a few hundred pairs re-level and "
        "re-calibrate it, a few thousand make it policy-specific.",
    )(fn)


@predict_group.command("train")
@click.argument("data", type=PathArg(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=PathArg(file_okay=False, path_type=Path),
    required=True,
    help="Predictor directory to write (replaced atomically).",
)
@click.option(
    "--length-field",
    default="length",
    show_default=True,
    help="Field with observed lengths (a number or a list).",
)
@click.option(
    "--kind",
    type=click.Choice(PREDICTOR_KINDS),
    default="lexical",
    show_default=True,
    help="lexical: hashed n-grams + ridge (NumPy); transformer: fine-tuned encoder (torch); "
    "static: the encoder distilled into token vectors + ridge (fast on CPU; torch to train).",
)
@click.option(
    "--base-model",
    type=PathArg(),
    default=None,
    help="Transformer, static: local Hugging Face encoder dir (static distils it). [default: all-MiniLM-L6-v2]",
)
@device_option
@click.option(
    "--epochs", type=int, default=None, help="Transformer epochs. [default: 3, or 40 with --freeze-encoder]"
)
@click.option("--freeze-encoder", is_flag=True, help="Transformer: train only the head on fixed embeddings.")
@_init_option
@click.option(
    "--no-prior",
    is_flag=True,
    help="Static: the head alone, not on top of the shipped default's text score (the default offset); "
    "not with a lexical or static --init, which brings its own.",
)
@plan_option
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed for the split, folds and initialisation."
)
@click.option(
    "--validation-split",
    type=float,
    default=0.1,
    show_default=True,
    help="Fraction of prompts held out for the recorded validation metrics.",
)
@target_field_option
@click.option(
    "--group-field",
    default=None,
    metavar="NAME",
    help="Field naming each prompt's source (e.g. verl's data_source): lexical and static bands are "
    "calibrated on residuals of held-out sources (3 or more), so they hold on prompts of a new source.",
)
@data_options
@json_option
@quiet_option
@handle_errors
def train_cmd(
    data: Path,
    output: Path,
    length_field: str,
    kind: str,
    base_model: str | None,
    device: str,
    epochs: int | None,
    freeze_encoder: bool,
    init: str | None,
    no_prior: bool,
    plan: Path | None,
    seed: int,
    validation_split: float,
    target_field: str | None,
    group_field: str | None,
    prompt_field: str,
    id_field: str,
    on_bad_line: str,
    as_json: bool,
    quiet: bool,
) -> None:
    """Train a predictor on DATA's prompts and observed lengths; write it to -o DIR.

    DATA is a dataset (a length field holding a number, a list of sampled
    lengths, or one row per sample) or an aspc run log directory (every
    committed sample, prompt texts from the plan that was run).

    \b
    Several policies' lengths in one dataset, with their sources:
    aspc predict train all.parquet --length-field lengths --target-field model --group-field dataset -o pred/
    then pick a head: aspc compile P --predictor pred/ --target NAME
    """
    from aspc.atomic import check_writable
    from aspc.guards import check_output, check_seed
    from aspc.predict import check_kind_options, default_predictor_path, predictor_path
    from aspc.predict.base import check_output_dir

    check_seed(seed)
    # The shipped predictor is read as --init default, and as a static head's prior (unless --no-prior).
    prior = default_predictor_path() if kind == "static" and not no_prior else None
    reads = [data, plan, None if init is None else predictor_path(init), prior, base_model]
    output = check_output(output, inputs=reads, kind="dir")
    check_output_dir(output)
    check_writable(output)  # found now, not after the training
    if epochs is not None and epochs < 1:
        raise ConfigError(f"--epochs {epochs}: give at least 1")
    if group_field is not None and kind == "transformer":
        raise ConfigError("--group-field applies to --kind lexical and static (the transformer's bands are "
                          "calibrated on held-out prompts at random); drop it")  # fmt: skip
    check_fields(prompt_field, id_field, length_field, target_field, group_field)
    check_kind_options(kind, base_model=base_model, device=device, epochs=epochs, freeze_encoder=freeze_encoder)
    check_device(device)
    check_run_log_options(data)
    pairs = read_pairs(
        data,
        length_field=length_field,
        prompt_field=prompt_field,
        id_field=id_field,
        on_bad_line=on_bad_line,
        plan=plan,
        target_field=target_field,
        group_field=group_field,
    )
    with RichProgress(quiet) as progress:
        pred = train_from_pairs(
            pairs,
            kind,
            where=str(data),
            init=init,
            seed=seed,
            validation_split=validation_split,
            base_model=base_model,
            device=device,
            epochs=epochs,
            freeze_encoder=freeze_encoder,
            static_prior=not no_prior,
            progress=progress,
        )
        progress.stage("write")
        pred.save(output)
        progress.done()
    skipped_note(pairs.skipped, quiet)
    _group_note(group_field, pairs, pred, quiet)
    untrained = (pred.metadata.get("training") or {}).get("untrained_targets") or []
    if untrained:
        names = ", ".join(untrained[:5]) + (f" and {len(untrained) - 5} more" if len(untrained) > 5 else "")
        many = len(untrained) > 1
        note(f"target{'s' if many else ''} {names}: every prompt fell in the validation split, so "
             f"{'their heads answer' if many else 'its head answers'} at the pooled level; give "
             f"{'them' if many else 'it'} more prompts, or a smaller --validation-split", quiet)  # fmt: skip
    val = pred.metadata.get("validation")
    if as_json:
        emit_json(
            {
                "output": str(output),
                "identity": pred.identity(),
                "training": pred.metadata.get("training"),
                "validation": val,
                "targets": list(getattr(pred, "targets", [])),
                "n_skipped": len(pairs.skipped),
                **skipped_json(pairs.skipped),
            }
        )
        return
    src = f"{len(pairs)} prompts, {pairs.n_samples} lengths from the {pairs.source}"
    if pairs.targets is not None:
        src = f"{len(set(pairs.ids))} prompts, {len(set(pairs.targets))} targets, {pairs.n_samples} lengths"
    note(f"wrote {kind} predictor to {output} ({src}{', refit from ' + init if init else ''})", quiet)
    if val and not quiet:
        out_console.print(metrics_table({"validation": val}, f"held-out {validation_split:.0%} of prompts"))


def _group_note(group_field: str | None, pairs: Any, pred: Any, quiet: bool) -> None:
    """Say when --group-field was given but the bands were calibrated on random prompts after all.

    The trainers fall back (``residual_folds``) when the training prompts hold fewer than 3 groups:
    leaving one of 2 sources out is no test of a new source. Silently, the user believed the bands held
    on new sources.
    """
    folds = (pred.metadata.get("training") or {}).get("residual_folds")
    if group_field is None or folds in (None, "leave one group out"):
        return
    n = len(set(pairs.groups or ()))
    held = f"{n} group{'s' if n != 1 else ''}" if n < 3 else "fewer than 3 groups outside the validation prompts"
    note(f"--group-field {group_field!r} ignored: the training prompts hold {held}, and calibrating the bands on "
         "held-out sources needs 3 or more; the bands were calibrated on random prompts", quiet)  # fmt: skip


def train_from_pairs(pairs: Any, kind: str, *, where: str, init: str | None = None, **kwargs: Any) -> Any:
    """Check the pairs, train (from scratch or refit from ``init``); the shared body of train and probe."""
    from aspc.predict import MIN_PAIRS, train_predictor
    from aspc.predict.pairs import check_pair_count

    check_pair_count(pairs, MIN_PAIRS, where)
    pred = train_predictor(
        kind, pairs.texts, pairs.lengths, init=init, targets=pairs.targets, groups=pairs.groups, **kwargs
    )
    pred.metadata.setdefault("training", {}).update(input_sha256=pairs.input_hash, source=pairs.source)
    return pred


@predict_group.command(_DEFAULT_CMD, hidden=True)
@click.argument("predictor", type=PathArg())
@click.argument("data", type=PathArg(dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    # A str, not a Path: Path("x/") is "x", and check_output must see the slash to refuse a directory name.
    type=PathArg(dir_okay=False, path_type=str),
    required=True,
    help="Parquet file to write: prompt_id, predicted_len, predicted_q10/_q50/_q90.",
)
@target_option
@click.option(
    "--history",
    "history",
    multiple=True,
    type=PathArg(path_type=Path),
    help="Observed lengths by prompt id: an aspc run log or a dataset (repeatable: one per earlier "
    "epoch, oldest first; newer epochs weigh more).",
)
@click.option(
    "--history-length-field", default="length", show_default=True, help="Length field of --history datasets."
)
@device_option
@data_options
@json_option
@quiet_option
@handle_errors
def apply_cmd(
    predictor: str,
    data: Path,
    output: str,
    target: str | None,
    history: tuple[Path, ...],
    history_length_field: str,
    device: str,
    prompt_field: str,
    id_field: str,
    on_bad_line: str,
    as_json: bool,
    quiet: bool,
) -> None:
    """Predict response lengths of DATA's prompts with PREDICTOR (a directory or 'default')."""
    from aspc.guards import check_output, check_output_suffix
    from aspc.io import read_prompts
    from aspc.memory import small_pages_only
    from aspc.predict import HistoryPredictor, load_predictor, predictor_path

    small_pages_only()  # a million prompts' texts and features (a MiniLM, if any, is small)
    check_history_field(history or ())
    given = output
    output = check_output(output, inputs=[data, *history, predictor_path(predictor)], example="preds.parquet")
    check_output_suffix(given, "the predictions table", "Parquet", ".parquet")  # it wrote Parquet into x.jsonl
    check_device(device, predictor)
    pred = load_predictor(predictor, target=target, device=device)
    table = read_prompts(data, prompt_field=prompt_field, id_field=id_field, on_bad_line=on_bad_line)
    if history:
        pred = HistoryPredictor.from_epochs(pred, _read_epochs(history, id_field, history_length_field))
    with RichProgress(quiet) as progress:
        progress.stage("predict", total=1)
        result = pred.predict(table.texts, ids=table.ids)
        progress.done()
        _write_predictions(output, table.ids, result)
    skipped_note(table.skipped, quiet)
    summary: dict[str, Any] = {"output": str(output), "n": len(table), "predictor": pred.identity()}
    summary.update(n_skipped=len(table.skipped), **skipped_json(table.skipped))
    if history:
        summary["with_history"] = pred.coverage(table.ids)
    if as_json:
        emit_json(summary)
        return
    extra = f", {summary['with_history']} with history" if history else ""
    note(f"wrote {len(table)} predictions to {output} ({pred.kind} predictor{extra})", quiet)


def _read_epochs(paths: tuple[Path, ...], id_field: str, length_field: str) -> list[dict[str, Any]]:
    """One observation map per --history source: each source is an earlier epoch, oldest first."""
    from aspc.io.history import read_history

    return [read_history(p, id_field=id_field, length_field=length_field) for p in paths]


def _write_predictions(output: Path, ids: list[str], pred: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from aspc.arrow_files import arrow_file
    from aspc.atomic import atomic_path
    from aspc.emit import schema as S

    table = pa.table(
        {
            S.PROMPT_ID: pa.array(ids, pa.string()),
            S.PREDICTED_LEN: pa.array(pred.mean, pa.float64()),
            S.PREDICTED_Q10: pa.array(pred.q10, pa.float64()),
            S.PREDICTED_Q50: pa.array(pred.q50, pa.float64()),
            S.PREDICTED_Q90: pa.array(pred.q90, pa.float64()),
        }
    )
    with atomic_path(output) as tmp, arrow_file(tmp, "wb") as fh:  # tmp is not UTF-8 where no /proc reaches it
        pq.write_table(table, fh)
