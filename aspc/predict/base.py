"""The predictor interface, the prediction record, and the on-disk metadata format.

Every predictor directory holds ``metadata.json`` (kind, format version,
training-data hash, validation metrics, configuration) next to its weights.
Readers check kind and version before touching the weights, so a directory
from another aspc version or of another kind fails with one clear line.
"""

from __future__ import annotations

import hashlib
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from aspc.errors import ConfigError, InputError, PredictorError

FORMAT_VERSION = 2
"""Version of the predictor directory layout; bump on any incompatible change."""

METADATA_FILE = "metadata.json"
# Every top-level name a predictor kind saves (lexical, static, transformer): what replacing one may delete.
PREDICTOR_ENTRIES = frozenset(
    {METADATA_FILE, "weights.npz", "table.npy", "head.npz", "tokenizer.json", "prior", "model.safetensors", "encoder"}
)

MIN_PAIRS = 50
"""Fewest (prompt, lengths) pairs a predictor may be trained on: below this a
held-out split and residual quantiles are meaningless."""


def finite_number(x: Any) -> bool:
    """Whether ``x`` (a value read from JSON metadata) is a finite number NumPy can hold.

    A float, or an int within int64; not a bool. JSON has integers of any size, and ``10**30`` made
    ``np.isfinite`` raise TypeError (it fits no NumPy integer) and ``float(10**400)`` OverflowError.
    """
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return -(2**63) <= x < 2**63
    return isinstance(x, float) and math.isfinite(x)


@dataclass(frozen=True)
class LengthPrediction:
    """Predicted response lengths, one entry per prompt, all in tokens.

    ``mean`` is the expected length of one sampled response (what a cost model
    sums); ``q10``, ``q50``, ``q90`` are quantiles of that one response's length
    (what a cost model needs for the expected maximum of a minibatch).
    Invariant: ``0 < q10 <= q50 <= q90`` and ``mean > 0`` elementwise.
    """

    mean: np.ndarray  # float64 (n,), expected tokens of one response
    q10: np.ndarray  # float64 (n,), 10% quantile of one response's tokens
    q50: np.ndarray  # float64 (n,), median
    q90: np.ndarray  # float64 (n,), 90% quantile

    def __post_init__(self) -> None:
        arrays = [
            np.ascontiguousarray(a, dtype=np.float64) for a in (self.mean, self.q10, self.q50, self.q90)
        ]
        n = arrays[0].shape
        if any(a.ndim != 1 or a.shape != n for a in arrays):
            raise ValueError("mean, q10, q50 and q90 must be 1-D arrays of the same length")
        for name, a in zip(("mean", "q10", "q50", "q90"), arrays, strict=True):
            object.__setattr__(self, name, a)

    def __len__(self) -> int:
        return len(self.mean)

    def take(self, index: np.ndarray | Sequence[int]) -> LengthPrediction:
        """The predictions for the given positions, in that order."""
        idx = np.asarray(index, dtype=np.int64)
        return LengthPrediction(self.mean[idx], self.q10[idx], self.q50[idx], self.q90[idx])

    @staticmethod
    def concat(parts: Sequence[LengthPrediction]) -> LengthPrediction:
        """Predictions of several batches, one after the other."""
        if not parts:
            return LengthPrediction(*(np.empty(0) for _ in range(4)))
        return LengthPrediction(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in ("mean", "q10", "q50", "q90"))
        )


def finite_lengths(p: LengthPrediction, kind: str) -> LengthPrediction:
    """``p``, refused unless every length is a finite positive number (``kind`` names the predictor).

    Trained weights never give anything else (lengths far out are eased); a hand-edited intercept of
    1e5 made every prediction inf, and ``predict eval --json`` printed ``"mae": Infinity``.
    """
    if not all(np.all(np.isfinite(a) & (a > 0)) for a in (p.mean, p.q10, p.q50, p.q90)):
        raise PredictorError(f"{kind} predictor weights are missing or corrupt (its predictions are not finite "
                             "positive lengths); retrain it")  # fmt: skip
    return p


def is_arrow(texts: Any) -> bool:
    """Whether ``texts`` is an Arrow column (pyarrow is not imported to find out)."""
    return type(texts).__module__.startswith("pyarrow")


def text_list(texts: Any) -> list[str]:
    """Prompts as a list of str, from a sequence or an Arrow string column."""
    if is_arrow(texts):
        return texts.to_pylist()
    return texts if isinstance(texts, list) else list(texts)


class Predictor(ABC):
    """A response-length predictor.

    Subclasses set ``kind`` and implement :meth:`predict`, :meth:`save` and
    :meth:`content_hash`. ``metadata`` holds what training recorded (data
    hash, validation metrics, configuration) and is written to
    ``metadata.json`` by :meth:`save`.
    """

    kind: ClassVar[str]
    metadata: dict[str, Any]

    @abstractmethod
    def predict(self, texts: Sequence[str], *, ids: Sequence[str] | None = None) -> LengthPrediction:
        """Predict the response length of each prompt.

        Parameters
        ----------
        texts
            Prompts as plain text (chat prompts flattened, as ``PromptTable.texts``).
        ids
            Stable prompt ids, same order; only predictors that use observed
            history need them, the others ignore them.

        Returns
        -------
        LengthPrediction
            One entry per prompt, in input order.
        """

    @abstractmethod
    def save(self, path: str | Path) -> None:
        """Write the predictor to directory ``path`` atomically (whole or not at all)."""

    @abstractmethod
    def content_hash(self) -> str:
        """sha256 of the weights (hex), stable across save and load."""

    def identity(self) -> dict[str, Any]:
        """What a plan records about the predictor that made its lengths."""
        ident = {"kind": self.kind, "format_version": FORMAT_VERSION, "hash": self.content_hash()}
        if self.metadata.get("target") is not None:
            ident["target"] = self.metadata["target"]
        return ident


def hash_arrays(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over named arrays (name, dtype, shape and bytes), in name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(name.encode())
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def hash_training_data(
    texts: Sequence[str], lengths: Sequence[np.ndarray], targets: Sequence[str] | None
) -> str:
    """sha256 of the training pairs, independent of the file format they came from."""
    h = hashlib.sha256()
    for i, (text, obs) in enumerate(zip(texts, lengths, strict=True)):
        h.update(text.encode("utf-8", "replace"))
        h.update(b"\x00")
        h.update(np.asarray(obs, dtype=np.float64).tobytes())
        if targets is not None:
            h.update(targets[i].encode())
        h.update(b"\x01")
    return h.hexdigest()


def write_metadata(directory: Path, kind: str, body: dict[str, Any]) -> None:
    """Write ``metadata.json`` with the header every predictor directory carries."""
    from aspc import __version__

    meta = {"aspc_predictor": kind, "format_version": FORMAT_VERSION, "aspc_version": __version__, **body}
    (directory / METADATA_FILE).write_text(
        json.dumps(meta, indent=2, sort_keys=True, default=_jsonable) + "\n", encoding="utf-8"
    )


def _jsonable(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def check_output_dir(directory: str | Path, option: str = "-o") -> None:
    """Refuse to replace a directory that is not an earlier aspc predictor (it would be deleted).

    Saving replaces the directory whole; a new, empty or predictor directory is
    fine, anything else (a user's folder, another tool's output) is never deleted.
    """
    directory = Path(directory)
    if directory.is_dir() and (why := replace_refusal(directory, directory, option)) is not None:
        raise PredictorError(why)


def replace_refusal(d: Path, directory: str | Path, option: str = "-o", *, at_swap: bool = False) -> str | None:
    """Why ``d`` (the predictor directory ``directory``, or its earlier content moved aside) must not be replaced.

    ``at_swap``: asked again as the save replaces it (``atomic_dir``'s ``refuse``), where a file that appeared
    while the predictor was trained is named first. None: it may be replaced.
    """
    try:
        if not any(d.iterdir()):
            return None
        extra = sorted(p.name for p in d.iterdir() if p.name not in PREDICTOR_ENTRIES)
    except OSError:  # not listable: what it holds is unknown, so it is never replaced
        extra = None
    if extra and at_swap:
        return (f"{option} {directory}: {extra[0]!r} was put there while the predictor was made, and saving "
                "would delete it; nothing was replaced: move it out, or pick a new directory")  # fmt: skip
    try:
        meta = json.loads((d / METADATA_FILE).read_text(encoding="utf-8"))
        ours = extra is not None and isinstance(meta, dict) and "aspc_predictor" in meta
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested ~100,000 deep
        ours = False
    if not ours:
        return (f"{option} {directory}: directory exists and is not an aspc predictor; pick a new or empty directory "
                "(an earlier predictor there would be replaced, anything else is never deleted)")  # fmt: skip
    # A predictor's directory with a user's files added to it: replaced whole, they went with it.
    if extra:
        return (f"{option} {directory}: holds {extra[0]!r}, which no aspc predictor writes and saving "
                "would delete; move it out, or pick a new directory")  # fmt: skip
    return None


def read_metadata(directory: str | Path, kind: str | None = None) -> dict[str, Any]:
    """Read and check ``metadata.json``; raise :class:`PredictorError` on any mismatch.

    Parameters
    ----------
    directory
        The predictor directory.
    kind
        When given, the directory must hold a predictor of this kind.
    """
    directory = Path(directory)
    if not directory.exists():
        raise PredictorError(f"{directory}: no such predictor directory; train one with 'aspc predict train'")
    if not directory.is_dir():
        raise PredictorError(
            f"{directory}: not a directory; give the directory 'aspc predict train -o' wrote"
        )
    path = directory / METADATA_FILE
    if not path.is_file():
        raise PredictorError(f"{directory}: no {METADATA_FILE}, so not an aspc predictor directory")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))  # not the locale's: the file is written as UTF-8
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested ~100,000 deep
        raise PredictorError(f"{path}: unreadable ({exc}); retrain the predictor") from None
    if not isinstance(meta, dict) or "aspc_predictor" not in meta or "format_version" not in meta:
        raise PredictorError(f"{path}: not aspc predictor metadata; retrain the predictor")
    if meta["format_version"] != FORMAT_VERSION:
        # repr: a string "2" printed bare read as "version 2, this aspc reads version 2"
        raise PredictorError(
            f"{directory}: predictor format version {meta['format_version']!r}, this aspc reads version "
            f"{FORMAT_VERSION}; retrain it with this aspc"
        )
    if kind is not None and meta["aspc_predictor"] != kind:
        raise PredictorError(f"{directory}: holds a {meta['aspc_predictor']} predictor, expected {kind}")
    return meta


def check_training_pairs(texts: Sequence[str], lengths: Sequence[Any]) -> list[np.ndarray]:
    """Validate training pairs; return each prompt's lengths as a float64 array.

    Raises
    ------
    InputError
        On an empty set, fewer than :data:`MIN_PAIRS` pairs, a count mismatch,
        or a length that is missing, non-numeric, non-finite or negative.
    """
    if len(texts) != len(lengths):
        raise InputError(f"{len(texts)} prompts but {len(lengths)} length entries; give one per prompt")
    if len(texts) == 0:
        raise InputError("the training set is empty; give a dataset with prompts and a length field")
    if len(texts) < MIN_PAIRS:
        raise InputError(f"only {len(texts)} (prompt, length) pairs; training needs at least {MIN_PAIRS}")
    out = []
    for i, obs in enumerate(lengths):
        try:
            a = np.atleast_1d(np.asarray(obs, dtype=np.float64))
        except (TypeError, ValueError):
            raise InputError(f"prompt {i}: length {obs!r} is not a number; give token counts") from None
        if a.ndim != 1 or a.size == 0:
            raise InputError(f"prompt {i}: no length given; give at least one token count per prompt")
        if not np.all(np.isfinite(a)) or np.any(a < 0):
            raise InputError(
                f"prompt {i}: length {a.tolist()} is negative or not finite; give token counts >= 0"
            )
        out.append(a)
    return out


# A validation set under this many distinct prompts says nothing, and one that
# leaves fewer than this many to train on starves the fit: below either, none.
MIN_VALIDATION_PROMPTS = 10
MIN_TRAINING_PROMPTS = 40


def validation_prompt_count(n_prompts: int, split: float) -> int:
    """How many of ``n_prompts`` distinct prompts to hold out for ``split`` (0: no validation).

    A split that holds out too few is dropped (small data with the default
    0.1); one that leaves too few to train on is what the caller asked for and
    cannot be honoured, so it is refused rather than silently dropped.

    Raises
    ------
    ConfigError
        ``split`` outside [0, 1), or leaving under :data:`MIN_TRAINING_PROMPTS`.
    """
    if not 0 <= split < 1:
        raise ConfigError(f"validation split {split} must be in [0, 1)")
    n_val = int(round(n_prompts * split))
    if n_val < MIN_VALIDATION_PROMPTS:
        return 0
    if n_prompts - n_val < MIN_TRAINING_PROMPTS:
        most = math.floor((n_prompts - MIN_TRAINING_PROMPTS) / n_prompts * 100) / 100
        fix = f"use {most:g} or less" if most * n_prompts >= MIN_VALIDATION_PROMPTS else "use 0"
        raise ConfigError(
            f"--validation-split {split:g} holds out {n_val} of {n_prompts} distinct prompts and leaves "
            f"{n_prompts - n_val} to train on, under the {MIN_TRAINING_PROMPTS} needed; {fix} (0: no validation)"
        )
    return n_val


def check_target_contrasts(text_of_row: np.ndarray, target_of_row: np.ndarray | None, rows: np.ndarray) -> None:
    """Refuse training targets that cannot be told apart from their prompts.

    Each target's level is its own unpenalised intercept, so the shared text
    weights learn only from prompts whose target measured other prompts too:
    with one prompt per target (a target field that names the prompt) each
    level fits its prompt exactly, the text and length weights are left
    undetermined, and the predictor came out predicting 0 or 1e13 tokens.

    Raises
    ------
    InputError
        Fewer such training prompts (``rows``) than :data:`MIN_TRAINING_PROMPTS`, or than all of them.
    """
    if target_of_row is None:
        return
    pairs = np.unique(np.stack([target_of_row[rows], text_of_row[rows]]), axis=1)  # distinct (target, text)
    prompts_of_target = np.bincount(pairs[0])
    shared = len(np.unique(pairs[1][prompts_of_target[pairs[0]] >= 2]))
    n_text = len(np.unique(text_of_row[rows]))
    need = min(MIN_TRAINING_PROMPTS, n_text)
    if shared < need:
        n_targets = np.count_nonzero(prompts_of_target)
        raise InputError(
            f"{n_targets} targets for {n_text} training prompts: only {shared} of the prompts share their target "
            "with another prompt, and the text weights learn from those alone (each target's level is fitted on "
            f"its own prompts); give each target several prompts (at least {need} such prompts), or drop --target-field"
        )


def check_trained_heads(pred: Any, texts: Sequence[str]) -> None:
    """Refuse a freshly trained predictor that predicts unusable lengths for its own training prompts.

    Its heads share the text score and differ by their level, and every calibrated output rises with the
    score, so the lowest- and highest-scored of ``texts`` bound every head's predictions on all of them.
    The bound is the one a plan's lengths must meet (finite, positive, at most
    :data:`aspc.guards.MAX_LENGTH`): a predictor beyond it would be refused by every command that used it.
    """
    from aspc.guards import MAX_LENGTH

    scores = pred.log_scores(texts)
    probe = [texts[int(np.argmin(scores))], texts[int(np.argmax(scores))]]
    for name in [None, *getattr(pred, "targets", [])]:
        try:
            p = pred.with_target(name).predict(probe)
            ok = all(np.all(np.isfinite(a) & (a > 0) & (a <= MAX_LENGTH)) for a in (p.mean, p.q10, p.q50, p.q90))
        except PredictorError:
            ok = False
        if not ok:
            head = "the pooled head" if name is None else f"the head of target {name!r}"
            targets = bool(getattr(pred, "targets", None))
            fix = "give each target more prompts, or drop --target-field" if targets else "give more varied prompts"
            raise InputError(
                f"training gave an unusable predictor: {head} predicts lengths outside (0, {MAX_LENGTH:.0e}] tokens "
                f"for training prompts (these pairs do not determine its weights); {fix}"
            )


def untrained_targets(names: Sequence[str], target_of_row: np.ndarray | None, rows: np.ndarray) -> dict[str, Any]:
    """``{"untrained_targets": [...]}``: targets with no training row (all their prompts held out for
    validation), whose heads answer at the pooled level; ``{}`` when there are none, as for most data."""
    if target_of_row is None:
        return {}
    absent = np.bincount(target_of_row[rows], minlength=len(names)) == 0
    return {"untrained_targets": [names[t] for t in np.flatnonzero(absent)]} if absent.any() else {}
