"""``aspc predict eval PREDICTOR DATA``: a predictor's figures against observed lengths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

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
from aspc.cli.paths import PathArg
from aspc.cli.predict_options import (
    check_device,
    check_fields,
    check_run_log_options,
    data_options,
    device_option,
    metrics_table,
    per_target_table,
    plan_option,
    read_pairs,
    target_field_option,
    target_option,
)
from aspc.errors import ConfigError, PredictorError


@click.command("eval")
@click.argument("predictor", type=PathArg())
@click.argument("data", type=PathArg(path_type=Path))
@click.option(
    "--length-field",
    default="length",
    show_default=True,
    help="Field with observed lengths (a number or a list).",
)
@target_option
@target_field_option
@plan_option
@device_option
@data_options
@json_option
@quiet_option
@handle_errors
def eval_cmd(
    predictor: str,
    data: Path,
    length_field: str,
    target: str | None,
    target_field: str | None,
    plan: Path | None,
    device: str,
    prompt_field: str,
    id_field: str,
    on_bad_line: str,
    as_json: bool,
    quiet: bool,
) -> None:
    """Score PREDICTOR (a directory or 'default') against DATA's observed lengths.

    Kendall tau, Spearman rho, MAE (tokens), 10-bucket accuracy and q10-q90
    coverage, with the same figures for a no-information baseline that
    predicts the training set's marginal length for every prompt. With
    --target-field, every row is scored by its model's head and the figures
    are given per model (``per_target``) beside the pooled ones.
    """
    from aspc.predict import load_predictor, predictor_path
    from aspc.predict.metrics import baseline_prediction, evaluate, marginal_summary

    if target is not None and target_field is not None:
        raise ConfigError("give --target (one head for every row) or --target-field (each row's own), not both")
    predictor_path(predictor)  # refuses 'default' while ./default is a directory
    check_fields(prompt_field, id_field, length_field, target_field, None)
    check_device(device, predictor)
    check_run_log_options(data)
    pred = load_predictor(predictor, target=target, device=device)
    pairs = read_pairs(
        data,
        length_field=length_field,
        prompt_field=prompt_field,
        id_field=id_field,
        on_bad_line=on_bad_line,
        for_training=False,
        target_field=target_field,
        plan=plan,
    )
    with RichProgress(quiet) as progress:
        progress.stage("predict", total=1)
        if pairs.targets is None:
            predicted = pred.predict(pairs.texts, ids=pairs.ids)
            result = evaluate(predicted, pairs.lengths)
        else:
            result = _eval_per_target(pred, pairs)
        progress.done()
    if any(len(a) > 1 for a in pairs.lengths):
        # Several sampled lengths per prompt: the band is judged on single samples, the
        # quantity a worker generates (coverage_q10_q90 counts the same samples).
        result["coverage_q10_q90_samples"] = result["coverage_q10_q90"]
    marginal = pred.metadata.get("marginal")
    source = "training marginal"
    if marginal and not _finite_marginal(marginal):  # hand-edited metadata: NaN would print as invalid JSON
        raise PredictorError(f"{predictor}: its metadata 'marginal' is not four finite lengths >= 0 (mean, q10, "
                             "q50, q90); retrain the predictor")  # fmt: skip
    if not marginal:
        marginal, source = marginal_summary(pairs.lengths), "evaluation-data marginal"
    result["baseline"] = {
        **evaluate(baseline_prediction(len(pairs), marginal), pairs.lengths),
        "source": source,
    }
    result["predictor"] = pred.identity()
    result.update(n_skipped=len(pairs.skipped), **skipped_json(pairs.skipped))
    skipped_note(pairs.skipped, quiet)
    if as_json:
        emit_json(result)
    else:  # the table is the result (no file is written): --quiet drops diagnostics and bars, not it
        out_console.print(
            metrics_table(
                {"predictor": result, "baseline": result["baseline"]}, f"{data.name}: n={result['n']}"
            )
        )
        if "per_target" in result:
            out_console.print(per_target_table(result["per_target"], result["mean_over_targets"]))
    if any(result.get(k) is None for k in ("kendall_tau", "bucket_accuracy")):
        note(f"n={result['n']}: Kendall τ and Spearman ρ need 2 prompts whose observed lengths differ, the "
             "10-bucket accuracy 10 such prompts; a figure these prompts cannot define is shown as – (null with "
             "--json)", quiet)  # fmt: skip


def _eval_per_target(pred: Any, pairs: Any) -> dict[str, Any]:
    """Each entry predicted by its target's head: pooled figures, per-target ones and their mean.

    A target the predictor has no head for is an error (``resolve_target``'s
    one line), not a silent fall-back to the pooled head.
    """
    import numpy as np

    from aspc.predict.base import LengthPrediction
    from aspc.predict.lexical import predict_by_target
    from aspc.predict.metrics import evaluate, mean_over

    if not getattr(pred, "targets", None):
        raise ConfigError("--target-field: this predictor has no per-model heads (it was trained without "
                          "--target-field); drop --target-field")  # fmt: skip
    names = sorted(set(pairs.targets))
    by_head = predict_by_target(pred, pairs.texts, pairs.targets, names)
    n = len(pairs)
    cols = {k: np.empty(n) for k in ("mean", "q10", "q50", "q90")}
    per: dict[str, Any] = {}
    for name in names:
        idx = [i for i, t in enumerate(pairs.targets) if t == name]
        got = by_head[name]
        for k, col in cols.items():
            col[idx] = getattr(got, k)
        per[name] = evaluate(got, [pairs.lengths[i] for i in idx])
    result = evaluate(LengthPrediction(cols["mean"], cols["q10"], cols["q50"], cols["q90"]), pairs.lengths)
    result["per_target"] = per
    result["mean_over_targets"] = mean_over(per)
    return result


def _finite_marginal(m: object) -> bool:
    keys = ("mean", "q10", "q50", "q90")
    return isinstance(m, dict) and all(
        isinstance(m.get(k), (int, float)) and not isinstance(m.get(k), bool) and 0 <= m[k] < float("inf")
        for k in keys
    )
