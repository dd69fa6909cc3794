"""The lexical predictor: hashed word n-grams and prompt length, ridge on log length.

Needs only NumPy, trains in seconds to a minute, and predicts tens of
thousands of prompts per second on one CPU core, which is why the predictor
shipped inside the package is of this kind.

Target models. Training data may carry a *target* per pair (the LLM that
produced the lengths, e.g. the 13 models of the CASTILLO data). The text
weights are shared by all targets; each target gets its own intercept
(a fixed effect, so a verbose model does not distort the text weights) and its
own quantile calibration. Per-target text weights did worse on the CASTILLO
validate split: separate predictors per model averaged Kendall tau 0.204 against
0.358 for shared weights (``benchmarks/predict_quality.py``), and shared plus
per-model correction weights 0.279 against 0.287 in an earlier trial. Most
models have code-only training prompts, and weights learnt from them do not
transfer to chat prompts. Without a selected target the predictor answers for
the *pooled* target: the mean intercept and a calibration over all residuals.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aspc.atomic import atomic_dir
from aspc.errors import ConfigError, PredictorError
from aspc.predict.base import (
    LengthPrediction,
    Predictor,
    check_training_pairs,
    hash_arrays,
    hash_training_data,
    read_metadata,
    write_metadata,
)
from aspc.predict.calibration import Calibration, estimate_history_prior
from aspc.predict.features import N_DENSE, FeatureConfig, Features, featurize
from aspc.predict.metrics import evaluate, marginal_summary
from aspc.predict.ridge import ridge_fit
from aspc.progress import NULL_PROGRESS, Progress

WEIGHTS_FILE = "weights.npz"
DEFAULT_KAPPA = 0.5  # history shrinkage when the data cannot estimate it (one length per prompt)
_CHUNK = 2048  # prompts featurised at once: bounds memory (<= 8 MiB of text), amortises NumPy overhead


@dataclass(frozen=True)
class LexicalConfig:
    """Training settings of the lexical predictor."""

    features: FeatureConfig = field(default_factory=FeatureConfig)
    lam: float = 1.0  # ridge penalty on hashed weights; 0.3-3 all gave tau within 0.01 on CASTILLO
    folds: int = 5  # out-of-fold fits that give honest residuals for the quantiles
    calibration_bins: int = 8  # bins of predicted length with their own residual quantiles
    max_iter: int = 200  # conjugate-gradient iterations per fit (converged to ~1e-4 by then)

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": self.features.to_dict(),
            "lam": self.lam,
            "folds": self.folds,
            "calibration_bins": self.calibration_bins,
            "max_iter": self.max_iter,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LexicalConfig:
        return cls(
            features=FeatureConfig.from_dict(d["features"]),
            lam=float(d["lam"]),
            folds=int(d["folds"]),
            calibration_bins=int(d["calibration_bins"]),
            max_iter=int(d["max_iter"]),
        )


class LexicalPredictor(Predictor):
    """Ridge regression of log mean length on hashed lexical features.

    Use :func:`train_lexical` to make one and :meth:`load` to read one back.
    """

    kind = "lexical"

    def __init__(
        self,
        config: LexicalConfig,
        beta: np.ndarray,
        alpha: np.ndarray,
        intercepts: np.ndarray,
        targets: list[str],
        calibrations: list[Calibration],
        metadata: dict[str, Any],
        target: str | None = None,
    ) -> None:
        self.config = config
        self.beta = np.asarray(beta, dtype=np.float32)  # (2**bits,) hashed weights
        self.alpha = np.asarray(alpha, dtype=np.float64)  # (N_DENSE-1,) length-feature weights
        self.intercepts = np.asarray(intercepts, dtype=np.float64)  # (T+1,) per target, last = pooled
        self.targets = list(targets)  # target names; empty when training had none
        self.calibrations = calibrations  # T+1 calibrations, last = pooled
        self.metadata = metadata
        self.metadata["target"] = target
        self._head = len(self.targets) if target is None else self.targets.index(target)
        self._hash: str | None = None

    # -- prediction -------------------------------------------------------
    def log_scores(self, texts: Sequence[str]) -> np.ndarray:
        """Predicted log mean length for the selected target."""
        out = np.empty(len(texts))
        beta = self.beta.astype(np.float64)
        for start in range(0, len(texts), _CHUNK):
            chunk = texts[start : start + _CHUNK]
            f = featurize(chunk, self.config.features)
            out[start : start + len(chunk)] = f.dense[:, 1:] @ self.alpha + f.hashed_matvec(beta)
        return out + self.intercepts[self._head]

    def predict(self, texts: Sequence[str], *, ids: Sequence[str] | None = None) -> LengthPrediction:
        return self.calibrations[self._head].apply(self.log_scores(list(texts)))

    def with_target(self, name: str | None) -> LexicalPredictor:
        """The same predictor answering for target ``name`` (``None``: pooled).

        ``name`` may be any case-insensitive substring that picks out exactly one
        target, e.g. ``"qwen2.5-7b"``.
        """
        chosen = None if name is None else resolve_target(name, self.targets)
        return LexicalPredictor(
            self.config,
            self.beta,
            self.alpha,
            self.intercepts,
            self.targets,
            self.calibrations,
            dict(self.metadata),
            chosen,
        )

    # -- persistence ------------------------------------------------------
    def _arrays(self) -> dict[str, np.ndarray]:
        arrays = {"beta": self.beta, "alpha": self.alpha, "intercepts": self.intercepts}
        for i, cal in enumerate(self.calibrations):
            arrays.update(cal.to_arrays(f"cal{i}_"))
        return arrays

    def content_hash(self) -> str:
        if self._hash is None:
            self._hash = hash_arrays(self._arrays())
        return self._hash

    def save(self, path: str | Path) -> None:
        with atomic_dir(path) as tmp:
            np.savez_compressed(tmp / WEIGHTS_FILE, **self._arrays())
            body = {k: v for k, v in self.metadata.items() if k != "target"}
            body.update(
                config=self.config.to_dict(), targets=self.targets, weights_sha256=self.content_hash()
            )
            write_metadata(tmp, self.kind, body)

    @classmethod
    def load(cls, path: str | Path, target: str | None = None) -> LexicalPredictor:
        """Read a lexical predictor directory; ``target`` selects a target model head."""
        meta = read_metadata(path, kind=cls.kind)
        try:
            with np.load(Path(path) / WEIGHTS_FILE, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            config = LexicalConfig.from_dict(meta["config"])
            targets = list(meta["targets"])
            cals = [Calibration.from_arrays(arrays, f"cal{i}_") for i in range(len(arrays["intercepts"]))]
            pred = cls(config, arrays["beta"], arrays["alpha"], arrays["intercepts"], targets, cals, meta)
        except (OSError, KeyError, ValueError) as exc:
            raise PredictorError(
                f"{path}: lexical predictor weights are missing or corrupt ({exc}); retrain it"
            ) from None
        if pred.beta.shape != (1 << config.features.bits,):
            raise PredictorError(f"{path}: weights do not match the feature configuration; retrain it")
        if meta.get("weights_sha256") not in (None, pred.content_hash()):
            raise PredictorError(
                f"{path}: weights do not match their recorded hash (modified or corrupt); retrain it"
            )
        return pred.with_target(target) if target is not None else pred


def resolve_target(name: str, targets: Sequence[str]) -> str:
    """The one target whose name equals or contains ``name`` (case-insensitive)."""
    if not targets:
        raise ConfigError(f"target {name!r} requested but this predictor was trained without target models")
    exact = [t for t in targets if t.lower() == name.lower()]
    if exact:
        return exact[0]
    hits = [t for t in targets if name.lower() in t.lower()]
    if len(hits) == 1:
        return hits[0]
    what = "matches several" if hits else "matches none"
    raise ConfigError(f"target {name!r} {what} of the predictor's targets: {', '.join(targets)}")


# -- training ---------------------------------------------------------------
def _design(
    f: Features, text_of_row: np.ndarray, target_of_row: np.ndarray | None, n_targets: int
) -> Features:
    """Rows ``(text, target)``: hashed text features, length features, one-hot target."""
    dense = f.dense[text_of_row]
    if target_of_row is not None:
        dense = np.hstack([dense[:, 1:], np.eye(n_targets)[target_of_row]])
    return f.take_rows(text_of_row, dense=dense).compact()


def _fit(f: Features, rows: np.ndarray, text_of_row, target_of_row, n_targets, y, weight, config, beta0=None):
    """Ridge fit on a subset of rows; returns (alpha over length features, intercepts, beta, solution)."""
    tgt = None if target_of_row is None else target_of_row[rows]
    x = _design(f, text_of_row[rows], tgt, n_targets)
    sol = ridge_fit(x, y[rows], config.lam, sample_weight=weight[rows], beta0=beta0, max_iter=config.max_iter)
    if target_of_row is None:
        return sol.alpha[1:], sol.alpha[:1], sol.beta, sol
    return sol.alpha[: N_DENSE - 1], sol.alpha[N_DENSE - 1 :], sol.beta, sol


def _score(f: Features, text_of_row, target_of_row, alpha, intercepts, beta) -> np.ndarray:
    base = f.dense[:, 1:] @ alpha + f.hashed_matvec(beta)
    icpt = intercepts[0] if target_of_row is None else intercepts[target_of_row]
    return base[text_of_row] + icpt


def train_lexical(
    texts: Sequence[str],
    lengths: Sequence[Any],
    *,
    targets: Sequence[str] | None = None,
    groups: Sequence[str] | None = None,
    config: LexicalConfig | None = None,
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
        Optional name of the LLM that produced each pair's lengths; see the
        module notes. ``None``: one target.
    groups
        Optional source of each prompt (e.g. the dataset it came from). When
        given with at least 3 distinct values, the out-of-fold residuals behind
        the quantiles leave one *source* out at a time, so the q10-q90 band
        reflects the error on prompts unlike the training ones rather than the
        smaller in-distribution error.
    config
        Training settings; defaults to :class:`LexicalConfig`.
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
    config = config or LexicalConfig()
    lengths = check_training_pairs(texts, lengths)
    if not 0 <= validation_split < 1:
        raise ConfigError(f"validation split {validation_split} must be in [0, 1)")
    for name, extra in (("target", targets), ("group", groups)):
        if extra is not None and len(extra) != len(texts):
            raise ConfigError(f"{len(extra)} {name} names for {len(texts)} prompts; give one per prompt")
    started = time.perf_counter()
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
    n_val = int(round(n_text * validation_split))
    n_val = n_val if n_val >= 10 and n_text - n_val >= 40 else 0
    fold_of_text = rng.permutation(n_text)
    is_val_text = fold_of_text < n_val
    train_rows = np.flatnonzero(~is_val_text[text_of_row])
    val_rows = np.flatnonzero(is_val_text[text_of_row])

    y = np.log(np.maximum([float(np.mean(a)) for a in lengths], 1.0))
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
    progress.stage("training lexical predictor", total=folds + 2)
    f = featurize([str(t) for t in uniq], config.features)
    progress.advance()

    # Out-of-fold predictions: residuals the model has not seen, for honest quantiles.
    oof = np.empty(len(y))
    beta0 = None
    for k in range(folds):
        fit_rows = train_rows[fold_of_row[train_rows] != k]
        held = train_rows[fold_of_row[train_rows] == k]
        if len(held) == 0 or len(fit_rows) == 0:
            continue
        alpha, icpt, beta, _ = _fit(
            f, fit_rows, text_of_row, target_of_row, n_targets, y, weight, config, beta0
        )
        beta0 = beta
        tor = None if target_of_row is None else target_of_row[held]
        oof[held] = _score(f, text_of_row[held], tor, alpha, icpt, beta)
        progress.advance()
    alpha, icpt, beta, sol = _fit(
        f, train_rows, text_of_row, target_of_row, n_targets, y, weight, config, beta0
    )
    progress.advance()
    progress.done()

    # Pooled intercept: the mean target level, weighted like the fit.
    if target_of_row is None:
        intercepts = np.array([icpt[0], icpt[0]])
    else:
        share = np.bincount(target_of_row[train_rows], weights=weight[train_rows], minlength=n_targets)
        intercepts = np.append(icpt, float(share @ icpt / share.sum()))
    groups = (
        [train_rows]
        if target_of_row is None
        else [train_rows[target_of_row[train_rows] == t] for t in range(n_targets)]
    )
    cals = [Calibration.fit(oof[g], [lengths[i] for i in g], config.calibration_bins) for g in groups]
    if target_of_row is None:
        cals.append(cals[0])
    else:
        # Pooled: residuals of every target around its own level, so the band is the spread
        # of one response, not the spread between models.
        shift = icpt[target_of_row[train_rows]] - intercepts[-1]
        pooled = Calibration.fit(
            oof[train_rows] - shift,
            [lengths[i] / np.exp(s) for i, s in zip(train_rows, shift, strict=True)],
            config.calibration_bins,
        )
        cals.append(pooled)

    all_lengths = [lengths[i] for i in train_rows]
    meta: dict[str, Any] = {
        "training": {
            "data_sha256": hash_training_data(texts, lengths, targets),
            "n_pairs": int(len(train_rows)),
            "n_prompts": int(n_text - n_val),
            "n_validation_pairs": int(len(val_rows)),
            "seed": int(seed),
            "validation_split": float(validation_split),
            "residual_folds": fold_mode,
            "cg_iterations": int(sol.iterations),
            "seconds": round(time.perf_counter() - started, 2),
        },
        "marginal": marginal_summary(all_lengths),
        **estimate_history_prior(oof[train_rows], all_lengths, DEFAULT_KAPPA),
    }
    pred = LexicalPredictor(config, beta, alpha, intercepts, target_names, cals, meta)
    if len(val_rows):
        meta["validation"] = validation_metrics(
            pred,
            [texts[i] for i in val_rows],
            [lengths[i] for i in val_rows],
            None if targets is None else [targets[i] for i in val_rows],
        )
    return pred


def validation_metrics(
    pred: Predictor, texts: Sequence[str], lengths: Sequence[np.ndarray], targets: Sequence[str] | None
) -> dict[str, Any]:
    """Metrics on held-out pairs: overall, or per target and their average when targets exist."""
    if targets is None or not hasattr(pred, "with_target"):
        return evaluate(pred.predict(texts), lengths)
    per: dict[str, Any] = {}
    for name in sorted(set(targets)):
        idx = [i for i, t in enumerate(targets) if t == name]
        if len(idx) >= 10:
            head = pred.with_target(name)
            per[name] = evaluate(head.predict([texts[i] for i in idx]), [lengths[i] for i in idx])
    keys = ("kendall_tau", "spearman", "mae", "bucket_accuracy", "coverage_q10_q90")
    avg = {k: float(np.mean([m[k] for m in per.values()])) for k in keys} if per else {}
    avg["n"] = int(sum(m["n"] for m in per.values()))
    return {**avg, "per_target": per}
