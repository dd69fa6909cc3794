"""The static predictor: a MiniLM encoder distilled into one vector per vocabulary token.

The transformer predictor runs a 6-layer encoder per prompt (~2.7 GFLOP at 128
tokens): 12-27 prompts/s on two CPU cores. Here the encoder runs once per
*vocabulary token* at training time (:mod:`aspc.predict.static_train`): its
output for ``[CLS] token [SEP]`` at the token is that token's static vector
(model2vec-style distillation). A prompt's embedding is the mean of its
tokens' vectors, and a linear (ridge) head maps it, with the transformer's
length features, to a log length, calibrated into q10/q50/q90 by
:mod:`aspc.predict.calibration` exactly as the lexical predictor is.

Inference needs NumPy, Numba and the Rust ``tokenizers`` package only (no
torch, no transformers import). Because the head is linear, the embedding
part of the score is the mean over a prompt's tokens of ``table @ v`` (``v``
the head's weights): that per-token score is computed once at load, and a
prompt costs its tokenization plus one segmented mean of scalars
(:mod:`aspc.predict.static_kernel`). The table itself stays in the directory
(float16) for refits (``--init DIR``).

Targets work as in :mod:`aspc.predict.lexical`: shared text weights, one
intercept and one calibration per target model, and a pooled head.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aspc import portable_math as pm
from aspc.atomic import atomic_dir
from aspc.errors import PredictorError
from aspc.predict.base import (
    LengthPrediction,
    Predictor,
    check_output_dir,
    finite_lengths,
    finite_number,
    hash_arrays,
    read_metadata,
    replace_refusal,
    text_list,
    write_metadata,
)
from aspc.predict.calibration import Calibration
from aspc.predict.ease import ease_lengths, seen_lengths
from aspc.predict.lexical import resolve_target
from aspc.predict.static_kernel import segmented_mean
from aspc.predict.targets_hash import check_targets, record_targets
from aspc.predict.transformer import _length_features

TABLE_FILE = "table.npy"
HEAD_FILE = "head.npz"
TOKENIZER_FILE = "tokenizer.json"
PRIOR_DIR = "prior"  # the lexical prior of a static head fitted on top of one
_CHUNK = 8192  # prompts tokenized at once: bounds the Encoding objects and id lists held in Python
_MAX_CUT = 1_000_000  # largest head_chars / tail_chars a predictor may hold (training writes 512 and 128)


@dataclass(frozen=True)
class StaticConfig:
    """Settings of the static predictor (inference and training)."""

    # Only a bounded head and tail of each prompt is tokenized: tokenizing costs time linear in
    # the text, and a 100 KB pasted log would cost as much as a thousand short prompts while
    # moving the mean of its first few hundred tokens' vectors very little. What the cut hides
    # (how long the prompt is) the length features still see, computed on the whole text; the
    # tail keeps a trailing instruction ("... explain the code above") that follows a long paste.
    # On CASTILLO validate 512 + 128 ranked as well as 1536 + 512 (mean tau 0.199 / 0.212 against
    # 0.194 / 0.205, own 4,000 / all rows) and tokenizes 2-3x fewer tokens.
    head_chars: int = 512
    tail_chars: int = 128
    folds: int = 5  # out-of-fold fits: honest residuals for the calibration and the penalty choice
    calibration_bins: int = 8
    lam_grid: tuple[float, ...] = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0)
    """Ridge penalties on the standardised embedding weights, as a share of the total row weight
    (each feature's own sum of squares); the one with the least out-of-fold error is kept. On
    CASTILLO's per-model train rows it picks 0.03-1: 384 correlated dimensions, a few thousand
    prompts."""
    table_dtype: str = "float16"  # storage of the distilled table: half the directory, tau unchanged

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lam_grid"] = list(self.lam_grid)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StaticConfig:
        # Checked, not cast: an edited -5 or 1e300 would change every prediction (an edit within
        # range the weights' hash catches, see content_hash).
        for key, low in (("head_chars", 1), ("tail_chars", 0)):
            v = d[key]
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= _MAX_CUT:
                raise ValueError(f"config.{key} {v!r} is not an integer in {low}..{_MAX_CUT}")
        # An empty grid failed a bare assert in a refit (--init), [-1.0] refit with a negative penalty.
        grid = d["lam_grid"]
        if not isinstance(grid, list) or not grid or not all(finite_number(x) and x > 0 for x in grid):
            raise ValueError(f"config.lam_grid {grid!r} is not a non-empty list of finite numbers > 0")
        return cls(
            head_chars=d["head_chars"],
            tail_chars=d["tail_chars"],
            folds=int(d["folds"]),
            calibration_bins=int(d["calibration_bins"]),
            lam_grid=tuple(float(x) for x in d["lam_grid"]),
            table_dtype=str(d["table_dtype"]),
        )


def _require_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise PredictorError(
            "the static predictor needs the 'tokenizers' package; pip install tokenizers, or use --kind lexical"
        ) from None
    return tokenizers


def load_tokenizer_json(text: str) -> Any:
    """A Rust tokenizer from its JSON, with truncation and padding off (the cut is ours)."""
    tok = _require_tokenizers().Tokenizer.from_str(text)
    tok.no_truncation()
    tok.no_padding()
    return tok


def _cut(text: str, head: int, tail: int) -> str:
    if len(text) <= head + tail:
        return text
    return text[:head] + " " + text[len(text) - tail :] if tail else text[:head]


def token_ids(tokenizer: Any, texts: Sequence[str], config: StaticConfig, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of every prompt's cut text, flat, with ``len(texts) + 1`` offsets.

    The tokenizer runs in batches (in Rust, on all cores), without special
    tokens: a prompt's embedding is the mean over its own tokens. Ids at or
    above ``rows`` (tokens added to a tokenizer after the encoder was made)
    have no vector and are dropped.
    """
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    parts, counts = [], []
    for lo in range(0, len(texts), _CHUNK):
        cut = [_cut(t, config.head_chars, config.tail_chars) for t in texts[lo : lo + _CHUNK]]
        ids = [e.ids for e in encode(cut, add_special_tokens=False)]
        c = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        parts.append(np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(c.sum())))
        counts.append(c)
    flat = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    count = np.concatenate(counts) if counts else np.empty(0, dtype=np.int64)
    if len(flat) and int(flat.max()) >= rows:
        keep = flat < rows
        row_of = np.repeat(np.arange(len(count)), count)
        count = np.bincount(row_of[keep], minlength=len(count)).astype(np.int64)
        flat = flat[keep]
    offsets = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    return flat, offsets


def embed(tokenizer: Any, table: np.ndarray, texts: Sequence[str], config: StaticConfig) -> np.ndarray:
    """``(n, dim)`` float32 mean token vector of each prompt (zeros for a prompt without tokens)."""
    flat, offsets = token_ids(tokenizer, texts, config, len(table))
    return segmented_mean(flat, offsets, table)


class StaticPredictor(Predictor):
    """Ridge head on the mean static token vector and length features. See :mod:`aspc.predict.static`.

    Use :func:`aspc.predict.static_train.train_static` to make one and :meth:`load` to read one back.
    """

    kind = "static"

    def __init__(
        self,
        config: StaticConfig,
        tokenizer_json: str,
        table: np.ndarray,
        head: dict[str, np.ndarray],
        targets: list[str],
        calibrations: list[Calibration],
        metadata: dict[str, Any],
        target: str | None = None,
        prior: Any = None,
    ) -> None:
        self.config = config
        # Optional lexical predictor whose text score (without its level) is a fixed offset of this
        # head: the static head then fits what the lexical score leaves (``--init`` a lexical dir).
        self.prior = prior
        self.tokenizer_json = tokenizer_json
        self.tokenizer = load_tokenizer_json(tokenizer_json)
        # The table as stored (float16 by default), widened once: every score, in training too,
        # comes from the stored values, so a loaded predictor answers exactly as the trained one.
        self.table = np.asarray(table)
        self.head = {k: np.asarray(v, dtype=np.float64) for k, v in head.items()}
        # head: w (dim,) on standardised embeddings, mu/sd (dim,), w_len (2,), intercepts (T+1,)
        self.targets = list(targets)
        self.calibrations = calibrations  # T+1, last = pooled
        self.metadata = metadata
        self.metadata["target"] = target
        self._head = len(self.targets) if target is None else self.targets.index(target)
        self._hash: str | None = None
        v = self.head["w"] / self.head["sd"]
        # Linear head: mean(table[ids]) @ v == mean(table[ids] @ v); one scalar per token.
        self._token_score = pm.matvec(self.table.astype(np.float32), v)[:, None]
        self._offset = -pm.dot(self.head["mu"], v)

    def with_target(self, name: str | None) -> StaticPredictor:
        """The same predictor answering for target ``name`` (``None``: pooled); substrings work."""
        chosen = None if name is None else resolve_target(name, self.targets)
        pred = StaticPredictor.__new__(StaticPredictor)
        pred.__dict__.update(self.__dict__)
        pred.metadata = dict(self.metadata)
        pred.metadata["target"] = chosen
        pred._head = len(self.targets) if chosen is None else self.targets.index(chosen)
        return pred

    # -- prediction -------------------------------------------------------
    def text_scores(self, texts: Sequence[str]) -> np.ndarray:
        """The head's score without any intercept (log tokens): embedding and length terms."""
        texts = text_list(texts)  # an Arrow column too: the Rust tokenizer takes Python strings
        if not texts:
            return np.empty(0)
        flat, offsets = token_ids(self.tokenizer, texts, self.config, len(self.table))
        emb = segmented_mean(flat, offsets, self._token_score)[:, 0]
        return emb + self._offset + pm.matvec(_length_features(texts), self.head["w_len"])

    def log_scores(self, texts: Sequence[str]) -> np.ndarray:
        """Predicted log mean length of the selected target (before calibration)."""
        return self.text_scores(texts) + self.head["intercepts"][self._head] + self._prior_scores(texts)

    def _prior_scores(self, texts: Sequence[str]) -> np.ndarray | float:
        if self.prior is None:
            return 0.0
        return prior_text_scores(self.prior, texts)

    def predict(self, texts: Sequence[str], *, ids: Sequence[str] | None = None) -> LengthPrediction:
        cal = self.calibrations[self._head]
        # Checked: a hand-edited head (weights_sha256 removed) wrote NaN in every predicted column.
        pred = ease_lengths(cal.apply(self.log_scores(texts)), seen_lengths(self.metadata, cal))
        return finite_lengths(pred, self.kind)

    # -- persistence ------------------------------------------------------
    def _arrays(self) -> dict[str, np.ndarray]:
        arrays = {f"head_{k}": v for k, v in self.head.items()}
        for i, cal in enumerate(self.calibrations):
            arrays.update(cal.to_arrays(f"cal{i}_"))
        return arrays

    def content_hash(self) -> str:
        if self._hash is None:
            arrays = self._arrays()
            arrays["table"] = self.table
            arrays["tokenizer"] = np.frombuffer(self.tokenizer_json.encode(), dtype=np.uint8)
            if self.prior is not None:
                arrays["prior"] = np.frombuffer(self.prior.content_hash().encode(), dtype=np.uint8)
            cut = (self.config.head_chars, self.config.tail_chars)
            if cut != (StaticConfig.head_chars, StaticConfig.tail_chars):
                # The cut changes every prediction, so it is part of the identity; only when it is not
                # training's own, so that the hashes (and plans) of every predictor trained so far stay.
                arrays["cut"] = np.asarray(cut, dtype=np.int64)
            self._hash = hash_arrays(arrays)
        return self._hash

    def save(self, path: str | Path) -> None:
        check_output_dir(path)
        with atomic_dir(path, refuse=lambda d: replace_refusal(d, path, at_swap=True)) as tmp:
            np.save(tmp / TABLE_FILE, self.table, allow_pickle=False)
            np.savez(tmp / HEAD_FILE, **self._arrays())  # uncompressed zip: fixed timestamps, same bytes
            (tmp / TOKENIZER_FILE).write_text(self.tokenizer_json, encoding="utf-8")
            if self.prior is not None:
                self.prior.save(tmp / PRIOR_DIR)
            body = {k: v for k, v in self.metadata.items() if k != "target"}
            body.update(config=self.config.to_dict(), targets=self.targets, weights_sha256=self.content_hash())
            record_targets(body, self.content_hash(), self.targets)
            write_metadata(tmp, self.kind, body)

    @classmethod
    def load(cls, path: str | Path, target: str | None = None) -> StaticPredictor:
        """Read a static predictor directory; ``target`` selects a target model head."""
        meta = read_metadata(path, kind=cls.kind)
        path = Path(path)
        try:
            table = np.load(path / TABLE_FILE, allow_pickle=False)
            with np.load(path / HEAD_FILE, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            head = {k[len("head_") :]: v for k, v in arrays.items() if k.startswith("head_")}
            targets = _check_arrays(table, head, meta["targets"])
            n_cal = len(head["intercepts"])
            cals = [Calibration.from_arrays(arrays, f"cal{i}_") for i in range(n_cal)]
            tok_json = (path / TOKENIZER_FILE).read_text(encoding="utf-8")
            config = StaticConfig.from_dict(meta["config"])
            prior = None
            if meta.get("prior") is not None:
                from aspc.predict.lexical import LexicalPredictor

                prior = LexicalPredictor.load(path / PRIOR_DIR)
            pred = cls(config, tok_json, table, head, targets, cals, meta, prior=prior)
        except PredictorError:
            raise
        except Exception as exc:  # numpy, zipfile and the Rust tokenizer each raise their own kinds
            msg = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise PredictorError(f"{path}: static predictor files are missing or corrupt ({msg}); retrain it") from None
        if meta.get("weights_sha256") not in (None, pred.content_hash()):
            raise PredictorError(f"{path}: weights do not match their recorded hash (modified or corrupt); retrain it")
        check_targets(path, meta, pred.content_hash(), targets)
        return pred.with_target(target) if target is not None else pred


def _check_arrays(table: np.ndarray, head: dict[str, np.ndarray], targets: Any) -> list[str]:
    """Raise ValueError unless the arrays and target names fit together; return the names.

    The weights' hash catches edits only while ``weights_sha256`` is there; without it an empty
    or 2-D intercepts array raised IndexError or a broadcasting error, a zero ``sd`` made every
    prediction NaN, and a complex table only warned.
    """
    if table.ndim != 2 or table.dtype.kind != "f" or not np.isfinite(table).all():
        raise ValueError(f"{TABLE_FILE} is not a 2-D array of finite real numbers")
    dim = table.shape[1]
    for key, shape in (("w", (dim,)), ("mu", (dim,)), ("sd", (dim,)), ("w_len", (2,)), ("intercepts", None)):
        v = head[key]
        if v.dtype.kind not in "fiu" or v.ndim != 1 or (shape is not None and v.shape != shape):
            raise ValueError(f"head {key} is not a real vector of length {shape[0] if shape else 'targets + 1'}")
        if not np.isfinite(v).all():
            raise ValueError(f"head {key} is not finite")
    if not (head["sd"] > 0).all():
        raise ValueError("head sd is not positive")
    # One head per target (one unnamed head when trained without targets), then the pooled one:
    # an edited name list that does not match indexed past the heads (IndexError).
    heads = len(head["intercepts"]) - 1
    if heads < 1:
        raise ValueError(f"head intercepts has {heads + 1} entries, not one per target plus a pooled one")
    names = isinstance(targets, list) and all(isinstance(t, str) and t for t in targets)
    if not names or len(set(targets)) != len(targets) or max(1, len(targets)) != heads:
        raise ValueError(f"targets {targets!r} are not distinct names of the weights' {heads} target head(s)")
    return list(targets)


def prior_text_scores(prior: Any, texts: Sequence[str]) -> np.ndarray:
    """A lexical predictor's log score without its level (the static head fits its own intercepts)."""
    return prior.log_scores(texts) - prior.intercepts[prior._head]
