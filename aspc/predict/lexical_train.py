"""Training of the lexical predictor: ridge fits, out-of-fold residuals, calibration, refits.

See :mod:`aspc.predict.lexical` for the model. Two ways to train:

- from scratch, on (prompt, lengths) pairs, optionally with a *target* (the
  LLM that generated each pair) and a *group* (the prompt's source, for
  leave-one-source-out residuals);
- from an existing predictor (``init``): its text score becomes a fixed
  offset and the new fit learns a ridge-penalised *correction* of the hashed
  weights plus fresh length-feature weights, level and calibration. The
  penalty pulls the correction toward zero, so a few hundred pairs mostly
  re-level and re-calibrate the prior while a few thousand change its text
  weights: a maximum a posteriori fit with the old weights as the prior mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from aspc import portable_math as pm
from aspc.errors import ConfigError
from aspc.predict.base import (
    check_target_contrasts,
    check_trained_heads,
    check_training_pairs,
    hash_training_data,
    untrained_targets,
    validation_prompt_count,
)
from aspc.predict.calibration import estimate_history_prior, fit_calibrations
from aspc.predict.features import N_DENSE, Features, featurize
from aspc.predict.lexical import DEFAULT_KAPPA, LexicalConfig, LexicalPredictor, validation_metrics
from aspc.predict.metrics import marginal_summary
from aspc.predict.ridge import ridge_fit, target_levels
from aspc.progress import NULL_PROGRESS, Progress

INIT_LAM_GRID = (0.3, 1.0, 3.0, 10.0)
"""Penalties (times ``LexicalConfig.lam``) a refit tries on the correction of the prior's weights;
the one with the least out-of-fold error wins. Small: the new pairs dominate (a policy unlike
the prior); large: the prior's weights stay (few pairs, or a policy like the prior)."""


def _design(
    f: Features, text_of_row: np.ndarray, target_of_row: np.ndarray | None, n_targets: int
) -> Features:
    """Rows ``(text, target)``: hashed text features, length features, one-hot target."""
    dense = f.dense[text_of_row]
    if target_of_row is not None:
        dense = np.hstack([dense[:, 1:], np.eye(n_targets)[target_of_row]])
    return f.take_rows(text_of_row, dense=dense).compact()


def _fit(f: Features, rows, text_of_row, target_of_row, n_targets, y, weight, config, lam, beta0=None):
    """Ridge fit on a subset of rows; returns (alpha over length features, intercepts, beta, solution)."""
    tgt = None if target_of_row is None else target_of_row[rows]
    x = _design(f, text_of_row[rows], tgt, n_targets)
    sol = ridge_fit(x, y[rows], lam, sample_weight=weight[rows], beta0=beta0, max_iter=config.max_iter)
    if target_of_row is None:
        return sol.alpha[1:], sol.alpha[:1], sol.beta, sol
    return sol.alpha[: N_DENSE - 1], sol.alpha[N_DENSE - 1 :], sol.beta, sol


def _score(f: Features, text_of_row, target_of_row, alpha, intercepts, beta) -> np.ndarray:
    base = pm.matvec(f.dense[:, 1:], alpha) + f.hashed_matvec(beta)
    icpt = intercepts[0] if target_of_row is None else intercepts[target_of_row]
    return base[text_of_row] + icpt


def train_lexical(
    texts: Sequence[str],
    lengths: Sequence[Any],
    *,
    targets: Sequence[str] | None = None,
    groups: Sequence[str] | None = None,
    config: LexicalConfig | None = None,
    init: LexicalPredictor | None = None,
    seed: int = 0,
    validation_split: float = 0.1,
    progress: Progress = NULL_PROGRESS,
) -> LexicalPredictor:
    """Train a lexical predictor on (prompt, observed lengths) pairs.

    Parameters
    ----------
    texts
        Prompt texts, one per pair.
    lengths
        Observed response lengths of each pair (a number or an array of samples).
    targets
        Optional name of the LLM that produced each pair's lengths; see
        :mod:`aspc.predict.lexical`. ``None``: one target.
    groups
        Optional source of each prompt (e.g. the dataset it came from). When
        given with at least 3 distinct values, the out-of-fold residuals behind
        the calibration leave one *source* out at a time, so the q10-q90 band
        reflects the error on prompts unlike the training ones rather than the
        smaller in-distribution error.
    config
        Training settings; defaults to :class:`LexicalConfig` (with ``init``:
        the init's, whose feature hashing the refit must share).
    init
        A trained lexical predictor to refit from (see the module notes); its
        selected head's score is the prior.
    seed
        Seeds the validation split and the folds; same seed and data give the
        same weights.
    validation_split
        Fraction of distinct prompts held out for the metrics recorded in the
        metadata (``0`` disables validation).
    progress
        Receives one step per fit.

    Returns
    -------
    LexicalPredictor
        Trained on all pairs except the validation prompts.
    """
    if init is not None:
        if config is not None and config.features != init.config.features:
            raise ConfigError("a refit keeps the init predictor's feature configuration; do not pass another")
        config = init.config
    config = config or LexicalConfig()
    lengths = check_training_pairs(texts, lengths)
    validation_prompt_count(0, validation_split)  # a bad split fails before any work
    for name, extra in (("target", targets), ("group", groups)):
        if extra is not None and len(extra) != len(texts):
            raise ConfigError(f"{len(extra)} {name} names for {len(texts)} prompts; give one per prompt")
    texts = list(texts)
    uniq, text_of_row = np.unique(np.array(texts, dtype=object), return_inverse=True)
    text_of_row = text_of_row.reshape(-1).astype(np.int64)
    target_names: list[str] = []
    target_of_row = None
    if targets is not None:
        target_names, target_of_row = np.unique(np.array(targets, dtype=object), return_inverse=True)
        target_names = [str(t) for t in target_names]
        target_of_row = target_of_row.reshape(-1).astype(np.int64)
    n_targets = len(target_names)

    rng = np.random.default_rng(seed)
    n_text = len(uniq)
    n_val = validation_prompt_count(n_text, validation_split)
    fold_of_text = rng.permutation(n_text)
    is_val_text = fold_of_text < n_val
    train_rows = np.flatnonzero(~is_val_text[text_of_row])
    val_rows = np.flatnonzero(is_val_text[text_of_row])
    check_target_contrasts(text_of_row, target_of_row, train_rows)

    y = pm.log(np.maximum([float(np.mean(a)) for a in lengths], 1.0))
    # Each distinct prompt weighs 1 in total however many targets measured it, so prompts
    # measured on many models (code, in CASTILLO) do not drown the others.
    per_text = np.bincount(text_of_row, minlength=n_text)
    weight = 1.0 / per_text[text_of_row]

    folds = max(2, min(config.folds, len(train_rows) // 20))
    fold_of_row = (fold_of_text[text_of_row] - n_val) % folds
    fold_mode = "random prompts"
    if groups is not None and len(set(groups[i] for i in train_rows)) >= 3:
        group_names, group_of_row = np.unique(np.array(groups, dtype=object), return_inverse=True)
        fold_of_row = group_of_row.reshape(-1).astype(np.int64)
        folds = len(group_names)
        fold_mode = "leave one group out"
    progress.stage("training lexical predictor", total=(len(INIT_LAM_GRID) if init is not None else 1) + 2)
    f = featurize([str(t) for t in uniq], config.features)
    progress.advance()

    prior_text = np.zeros(n_text)
    lams = [config.lam]
    if init is not None:
        # The prior's text score without its level: the refit learns a new level (dense
        # intercept or per-target intercepts) and a correction of the hashed weights.
        prior_text = pm.matvec(f.dense[:, 1:], init.alpha) + f.hashed_matvec(init.beta.astype(np.float64))
        lams = [config.lam * g for g in INIT_LAM_GRID]
    y_fit = y - prior_text[text_of_row]

    def out_of_fold(lam: float, beta0: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
        """Predictions of each training row by a fit that did not see its fold."""
        oof = np.empty(len(y))
        for k in range(folds):
            fit_rows = train_rows[fold_of_row[train_rows] != k]
            held = train_rows[fold_of_row[train_rows] == k]
            if len(held) == 0 or len(fit_rows) == 0:
                continue
            alpha, icpt, beta, _ = _fit(
                f, fit_rows, text_of_row, target_of_row, n_targets, y_fit, weight, config, lam, beta0
            )
            beta0 = beta
            tor = None
            if target_of_row is not None:
                # A target whose rows are all held out (few prompts, or one source) is new to this fit.
                icpt, tor = target_levels(icpt, fit_rows, target_of_row, weight)[:-1], target_of_row[held]
            oof[held] = _score(f, text_of_row[held], tor, alpha, icpt, beta) + prior_text[text_of_row[held]]
        return oof, beta0

    # Out-of-fold predictions: residuals the model has not seen, for honest calibration. A refit
    # also picks its penalty by them: how far the new pairs may pull the prior is the data's call.
    best = None
    beta0 = None
    for lam in lams:
        oof_l, beta0 = out_of_fold(lam, beta0)
        err = pm.dot(weight[train_rows], (oof_l[train_rows] - y[train_rows]) ** 2)
        if best is None or err < best[0]:
            best = (err, lam, oof_l)
        progress.advance()
    assert best is not None
    _, lam, oof = best
    alpha, icpt, beta, sol = _fit(
        f, train_rows, text_of_row, target_of_row, n_targets, y_fit, weight, config, lam, beta0
    )
    if init is not None:
        alpha = alpha + init.alpha
        beta = beta + init.beta.astype(np.float64)
    progress.advance()
    progress.done()

    # Pooled intercept: the mean target level, weighted like the fit.
    if target_of_row is None:
        intercepts = np.array([icpt[0], icpt[0]])
    else:
        # A target whose prompts all fell in the validation split answers at the pooled level.
        intercepts = target_levels(icpt, train_rows, target_of_row, weight)
        icpt = intercepts[:-1]
    # Leave-one-source-out residuals: widen the band until sources count equally (see
    # calibration.fit_calibrations); random folds are in-distribution and plain conformal is right.
    by_group = fold_mode == "leave one group out"
    cals, scale, target_scales = fit_calibrations(
        oof, lengths, train_rows, target_of_row, target_names, icpt, intercepts, fold_of_row, by_group,
        config.calibration_bins,
    )

    all_lengths = [lengths[i] for i in train_rows]
    meta: dict[str, Any] = {
        "training": {
            "data_sha256": hash_training_data(texts, lengths, targets),
            "n_pairs": int(len(train_rows)),
            "n_samples": int(sum(len(a) for a in all_lengths)),
            "n_prompts": int(n_text - n_val),
            "n_validation_pairs": int(len(val_rows)),
            "seed": int(seed),
            "validation_split": float(validation_split),
            "residual_folds": fold_mode,
            "cg_iterations": int(sol.iterations),
        },
        "marginal": marginal_summary(all_lengths),
        "band_scale": float(scale),
        "shared_band": False,  # older predictors read the pooled band at predict time; now in cals
        "target_band_scales": target_scales,
        **estimate_history_prior(oof[train_rows], all_lengths, DEFAULT_KAPPA,
                                 None if target_of_row is None else [target_names[t] for t in target_of_row[train_rows]]),  # fmt: skip
    }
    if init is not None:
        meta["training"]["init"] = init.identity()
        meta["training"]["init_lam"] = lam  # the penalty the out-of-fold error chose
    meta["training"].update(untrained_targets(target_names, target_of_row, train_rows))
    pred = LexicalPredictor(config, beta, alpha, intercepts, target_names, cals, meta)
    check_trained_heads(pred, [str(t) for t in uniq[~is_val_text]])
    if len(val_rows):
        meta["validation"] = validation_metrics(
            pred,
            [texts[i] for i in val_rows],
            [lengths[i] for i in val_rows],
            None if targets is None else [targets[i] for i in val_rows],
        )
    return pred
