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

import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aspc import portable_math as pm
from aspc.atomic import atomic_dir
from aspc.errors import ConfigError, PredictorError
from aspc.predict.base import (
    LengthPrediction,
    Predictor,
    check_output_dir,
    finite_lengths,
    finite_number,
    hash_arrays,
    is_arrow,
    read_metadata,
    replace_refusal,
    text_list,
    write_metadata,
)
from aspc.predict.calibration import Calibration
from aspc.predict.ease import ease_lengths, seen_lengths
from aspc.predict.features import N_DENSE, FeatureConfig, featurize
from aspc.predict.metrics import evaluate, mean_over
from aspc.predict.targets_hash import check_targets, record_targets

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
        # Checked, not cast (none is in the weights' hash): a hand-edited lam of 0 or -1 raised a ValueError
        # traceback in a refit (--init), Infinity a ZeroDivisionError; a max_iter of -1 refit with no iterations.
        lam = d["lam"]
        if not finite_number(lam) or lam <= 0:
            raise ValueError(f"config.lam {lam!r} is not a finite number > 0")
        # folds 1: what the API's LexicalConfig(folds=1) saves (training takes at least 2).
        for key, low in (("folds", 1), ("calibration_bins", 1), ("max_iter", 1)):
            v = d[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"config.{key} {v!r} is not an integer >= {low}")
        return cls(
            features=FeatureConfig.from_dict(d["features"]),
            lam=float(lam),
            folds=d["folds"],
            calibration_bins=d["calibration_bins"],
            max_iter=d["max_iter"],
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
        self._beta_f64: np.ndarray | None = None

    # -- prediction -------------------------------------------------------
    def log_scores(self, texts: Sequence[str]) -> np.ndarray:
        """Predicted log mean length for the selected target (before calibration).

        ``texts`` may also be an Arrow string column (``PromptTable.text_array``):
        the bulk kernel reads its UTF-8 buffers as they are.
        """
        if not self.config.features.char_ngrams:
            from aspc.predict.lexical_kernel import hashed_scores

            if not is_arrow(texts):
                texts = texts if isinstance(texts, list) else list(texts)
            # The float32 weights as stored: the kernel widens each exactly, as _beta64 would.
            hashed, dense = hashed_scores(texts, self.config.features, self.beta)
            return pm.matvec(dense[:, 1:], self.alpha) + hashed + self.intercepts[self._head]
        texts = text_list(texts)
        out = np.empty(len(texts))
        beta = self._beta64()
        for start in range(0, len(texts), _CHUNK):
            chunk = texts[start : start + _CHUNK]
            f = featurize(chunk, self.config.features)
            out[start : start + len(chunk)] = pm.matvec(f.dense[:, 1:], self.alpha) + f.hashed_matvec(beta)
        return out + self.intercepts[self._head]

    def _beta64(self) -> np.ndarray:
        if self._beta_f64 is None:
            self._beta_f64 = self.beta.astype(np.float64)
        return self._beta_f64

    def predict(self, texts: Sequence[str], *, ids: Sequence[str] | None = None) -> LengthPrediction:
        y = self.log_scores(texts)
        own = self.calibrations[self._head].apply(y)
        if not self.metadata.get("shared_band") or self._head == len(self.targets):
            own = ease_lengths(own, seen_lengths(self.metadata, self.calibrations[self._head]))
            return finite_lengths(own, self.kind)
        # The target's level, the pooled band: the pooled residuals left whole prompt sources out
        # for every target, so they know how far off a model's level is on a source it never saw.
        band = self.calibrations[-1].apply(y - self.intercepts[self._head] + self.intercepts[-1])
        return finite_lengths(ease_lengths(
            LengthPrediction(own.mean, own.q50 * band.q10 / band.q50, own.q50, own.q50 * band.q90 / band.q50),
            seen_lengths(self.metadata, self.calibrations[self._head], self.calibrations[-1]),
        ), self.kind)  # fmt: skip

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
        check_output_dir(path)
        with atomic_dir(path, refuse=lambda d: replace_refusal(d, path, at_swap=True)) as tmp:
            np.savez_compressed(tmp / WEIGHTS_FILE, **self._arrays())
            body = {k: v for k, v in self.metadata.items() if k != "target"}
            body.update(
                config=self.config.to_dict(), targets=self.targets, weights_sha256=self.content_hash()
            )
            record_targets(body, self.content_hash(), self.targets)
            write_metadata(tmp, self.kind, body)

    @classmethod
    def load(cls, path: str | Path, target: str | None = None) -> LexicalPredictor:
        """Read a lexical predictor directory; ``target`` selects a target model head."""
        meta = read_metadata(path, kind=cls.kind)
        try:
            with np.load(Path(path) / WEIGHTS_FILE, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            config = LexicalConfig.from_dict(meta["config"])
            # Shapes and values checked here, not where they are used: a 3-long alpha raised a matvec
            # traceback, a NaN one predicted NaN for every prompt (and eval printed "mae": NaN).
            _check_weights(arrays)
            targets = list(meta["targets"])
            # A bool, not read by truthiness: "false" (a true string) silently swapped every target head's band.
            if not isinstance(meta.get("shared_band", False), bool):
                raise ValueError(f"shared_band {meta['shared_band']!r} is not true or false")
            cals = [Calibration.from_arrays(arrays, f"cal{i}_") for i in range(len(arrays["intercepts"]))]
            # Checked before use: a hand-edited bits of -1 raised "negative shift count", targets "abc" an IndexError.
            bits = config.features.bits
            if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 30:
                raise ValueError(f"features.bits {bits!r} is not an integer in 1..30")
            heads = len(arrays["intercepts"])  # one per target, the pooled one after them
            names = isinstance(meta["targets"], list) and all(isinstance(t, str) for t in targets)
            # T targets give T + 1 heads; none gives 2 (the pooled intercept twice). Fewer names
            # than heads shifted every target onto another's head, silently.
            fits = len(targets) == heads - 1 or (not targets and heads == 2)
            if not names or not fits or len(set(targets)) != len(targets):
                raise ValueError(f"targets {meta['targets']!r} are not names of the weights' {heads - 1} target heads")
            pred = cls(config, arrays["beta"], arrays["alpha"], arrays["intercepts"], targets, cals, meta)
        except (OSError, KeyError, ValueError, TypeError, OverflowError, EOFError, zipfile.BadZipFile,
                zlib.error, MemoryError) as exc:  # OverflowError: float() of a JSON integer such as 10**400
            # MemoryError: a member whose header claims a huge shape (a 190-byte beta.npy of 2**40 floats)
            raise PredictorError(
                f"{path}: lexical predictor weights are missing or corrupt ({exc}); retrain it"
            ) from None
        if pred.beta.shape != (1 << config.features.bits,):
            raise PredictorError(f"{path}: weights do not match the feature configuration; retrain it")
        if meta.get("weights_sha256") not in (None, pred.content_hash()):
            raise PredictorError(
                f"{path}: weights do not match their recorded hash (modified or corrupt); retrain it"
            )
        check_targets(path, meta, pred.content_hash(), targets)
        return pred.with_target(target) if target is not None else pred


def _check_weights(arrays: dict[str, np.ndarray]) -> None:
    """Raise ValueError unless alpha and intercepts have their shapes and beta, alpha, intercepts are finite.

    (beta's length is checked against the feature configuration after loading, with its own message.)
    """
    if arrays["alpha"].shape != (N_DENSE - 1,):
        raise ValueError(f"alpha has shape {arrays['alpha'].shape}, not ({N_DENSE - 1},)")
    if arrays["intercepts"].ndim != 1 or len(arrays["intercepts"]) < 2:
        raise ValueError(f"intercepts has shape {arrays['intercepts'].shape}, not (targets + 1,)")
    for name in ("beta", "alpha", "intercepts"):
        if arrays[name].dtype.kind != "f" or not np.all(np.isfinite(arrays[name])):
            raise ValueError(f"{name} is not all finite numbers")


def resolve_target(name: str, targets: Sequence[str]) -> str:
    """The one target named ``name``: exactly, else the one that equals or contains it ignoring case.

    An exact name wins over names that differ from it only by case (targets
    ``A`` and ``a`` are two heads); several matches are refused, naming them.
    """
    if not targets:
        raise ConfigError(f"target {name!r} requested but this predictor was trained without target models; drop --target")
    if name in targets:
        return name
    hits = [t for t in targets if t.lower() == name.lower()] or [t for t in targets if name.lower() in t.lower()]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise ConfigError(f"target {name!r} matches several of the predictor's targets: {', '.join(hits)}; "
                          "give one of them in full")  # fmt: skip
    raise ConfigError(f"target {name!r} matches none of the predictor's targets: {', '.join(targets)}")


def validation_metrics(
    pred: Predictor, texts: Sequence[str], lengths: Sequence[np.ndarray], targets: Sequence[str] | None
) -> dict[str, Any]:
    """Metrics on held-out pairs: overall, or per target and their average when targets exist."""
    if targets is None or not hasattr(pred, "with_target"):
        return evaluate(pred.predict(texts), lengths)
    names = [n for n in sorted(set(targets)) if sum(t == n for t in targets) >= 10]
    by_head = predict_by_target(pred, texts, targets, names)
    per: dict[str, Any] = {}
    for name in names:
        idx = [i for i, t in enumerate(targets) if t == name]
        per[name] = evaluate(by_head[name], [lengths[i] for i in idx])
    avg: dict[str, Any] = mean_over(per) if per else {}
    avg["n"] = int(sum(m["n"] for m in per.values()))
    return {**avg, "per_target": per}


def predict_by_target(
    pred: Predictor, texts: Sequence[str], targets: Sequence[str], names: Sequence[str]
) -> dict[str, LengthPrediction]:
    """For each name, its head's predictions of the rows whose target it is (in row order).

    A predictor with ``predict_heads`` (the transformer: one encoder pass for
    every head) predicts each distinct text once; others run each head on its
    own rows.
    """
    rows = {n: [i for i, t in enumerate(targets) if t == n] for n in names}
    if not hasattr(pred, "predict_heads"):
        return {n: pred.with_target(n).predict([texts[i] for i in idx]) for n, idx in rows.items()}
    needed = sorted({i for idx in rows.values() for i in idx})
    uniq = list(dict.fromkeys(texts[i] for i in needed))
    pos = {t: k for k, t in enumerate(uniq)}
    heads = pred.predict_heads(uniq, list(names))
    return {n: heads[n].take(np.array([pos[texts[i]] for i in idx], dtype=np.int64)) for n, idx in rows.items()}
