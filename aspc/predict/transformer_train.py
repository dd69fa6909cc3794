"""Fine-tuning of the transformer predictor (see :mod:`aspc.predict.transformer`).

Full fine-tuning, or a frozen encoder whose embeddings are computed once
(only the head trains: minutes on a CPU instead of hours). With ``init`` the
weights of an earlier transformer predictor are the starting point, so a
policy's own pairs refine a predictor that already knows other models.

The q10-q90 band is then widened or narrowed on the held-out validation
prompts so it covers 80% there (conformalised quantile regression), because
pinball heads fitted on training prompts are too narrow on new ones.

Notes
-----
Conformalised quantile regression: Romano, Patterson & Candès (2019),
"Conformalized Quantile Regression", NeurIPS, algorithm 1.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from aspc.errors import ConfigError
from aspc.predict.base import check_training_pairs, hash_training_data, validation_prompt_count
from aspc.predict.calibration import estimate_history_prior
from aspc.predict.lexical import DEFAULT_KAPPA, validation_metrics
from aspc.predict.metrics import marginal_summary
from aspc.predict.transformer import (
    TransformerConfig,
    TransformerPredictor,
    _build_net,
    _length_features,
    _load_base,
    _max_len,
    _require_torch,
    quiet_transformers,
)
from aspc.progress import NULL_PROGRESS, Progress


def _pinball(torch: Any, q: Any, samples: Any, mask: Any, tau: float) -> Any:
    diff = samples - q.unsqueeze(1)
    loss = torch.maximum(tau * diff, (tau - 1.0) * diff)
    return (loss * mask).sum() / mask.sum().clamp(min=1.0)


# Training prompts a refit runs through its starting net to find where its level stands.
LEVEL_SAMPLE = 256


def _start_at_their_level(
    net: Any,
    init: TransformerPredictor,
    texts: Sequence[str],
    y_norm: np.ndarray,
    rows: np.ndarray,
    target_of_row: np.ndarray | None,
    seed: int,
) -> None:
    """Shift a refit's starting mean and median outputs to the new pairs' mean level, per target.

    A predictor refit on another policy's pairs (the pooled MiniLM on a probe of
    the policy being trained) starts from its heads' level, which can be
    several-fold off the new policy's; at the head's small learning rate, a
    one-epoch refit moved it only a fifth of the way (1.24x of 3x, in
    ``tests/test_predict_transformer.py``). The gaps to q10/q90 (softplus
    inputs) keep their values. Every target of ``net`` starts as ``init``'s
    pooled head (the mean of its shifts), so that head's outputs are where
    each target starts.
    """
    rng = np.random.default_rng([seed, 1])  # its own stream: the batches' draws stay as they were
    sample = np.sort(rng.choice(rows, size=min(len(rows), LEVEL_SAMPLE), replace=False))
    if not len(sample):
        return
    m, s = init.norm
    mu = (init._raw_heads([texts[i] for i in sample], [None])[0][:, 0] - m) / s
    which = np.zeros(len(sample), dtype=np.int64) if target_of_row is None else target_of_row[sample]
    for t in np.unique(which):
        sel = which == t
        net.target_bias.weight.data[int(t), [0, 2]] += float(y_norm[sample][sel].mean() - mu[sel].mean())


@quiet_transformers
def train_transformer(
    texts: Sequence[str],
    lengths: Sequence[Any],
    *,
    targets: Sequence[str] | None = None,
    config: TransformerConfig | None = None,
    device: str = "auto",
    seed: int = 0,
    validation_split: float = 0.1,
    init: TransformerPredictor | None = None,
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
    init
        Start from this transformer predictor's encoder, tokenizer, head and
        output scale (its pooled level starts every new target) instead of
        the base model and a fresh head; ``config.base_model`` is then unused.

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
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    texts = [str(t) for t in texts]
    if init is None:
        encoder, tokenizer, base_name = _load_base(torch, transformers, config.base_model)
    else:
        encoder, tokenizer = copy.deepcopy(init.net.encoder).cpu(), init.tokenizer
        base_name = f"refit of {init.metadata.get('base_model', 'a transformer predictor')}"
    target_names = sorted(set(targets)) if targets is not None else []
    target_of_row = np.array([target_names.index(t) for t in targets]) if targets is not None else None
    net = _build_net(torch, encoder, len(target_names))
    if init is not None:
        net.head.load_state_dict({k: v.cpu() for k, v in init.net.head.state_dict().items()})
        with torch.no_grad():
            net.target_bias.weight[:] = init.net.target_bias.weight.detach().cpu().mean(0)

    # Validation split by distinct prompt text, as for the lexical predictor.
    uniq = sorted(set(texts))
    perm = rng.permutation(len(uniq))
    n_val = validation_prompt_count(len(uniq), validation_split)
    val_text = {uniq[i] for i in perm[:n_val]}
    train_rows = np.array([i for i, t in enumerate(texts) if t not in val_text])
    val_rows = np.array([i for i, t in enumerate(texts) if t in val_text], dtype=np.int64)

    logs = [np.log(np.maximum(a, 1.0)) for a in lengths]
    y_mu = np.log(np.maximum([float(np.mean(a)) for a in lengths], 1.0))
    m = float(np.mean(y_mu[train_rows]))
    s = float(np.std(y_mu[train_rows])) or 1.0
    if init is not None:
        m, s = init.norm  # the init head's output units
    k_max = max(len(a) for a in logs)
    samples = np.zeros((len(texts), k_max), dtype=np.float32)
    mask = np.zeros((len(texts), k_max), dtype=np.float32)
    for i, a in enumerate(logs):
        samples[i, : len(a)] = (a - m) / s
        mask[i, : len(a)] = 1.0
    y_norm = ((y_mu - m) / s).astype(np.float32)
    extra = _length_features(texts)
    if init is not None:
        _start_at_their_level(net, init, texts, y_norm, train_rows, target_of_row, seed)
    elif target_of_row is not None:
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
    # Rows of several targets share their prompt: a batch then takes bs distinct prompts with all
    # their rows, and the encoder runs once per prompt (13 models' rows of a prompt cost one pass).
    shared = _shared_texts(texts, train_rows) if target_of_row is not None and not config.freeze_encoder else None
    units = train_rows if shared is None else np.arange(len(shared[1]))
    steps_per_epoch = math.ceil(len(units) / bs)
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

    # Fine-tuning pads each batch to its longest prompt: batches of similar lengths
    # cost a fraction of random ones (a quarter of the prompts reach max_tokens).
    n_tokens = None
    if cached is None:
        n_tokens = np.array(
            [len(ids) for ids in tokenizer(texts, truncation=True, max_length=_max_len(config, encoder))["input_ids"]]
        )
    unit_tokens = n_tokens if shared is None or n_tokens is None else n_tokens[shared[1]]
    for epoch in range(epochs):
        progress.stage(f"epoch {epoch + 1}/{epochs}", total=steps_per_epoch)
        net.train()
        if config.freeze_encoder:
            net.encoder.eval()
        for batch in length_grouped_batches(rng, units, unit_tokens, bs):
            rows, at = (batch, None) if shared is None else _rows_of_texts(shared, batch)
            tgt = None if target_of_row is None else to_t(target_of_row[rows])
            if cached is not None:
                out = net.from_embedding(cached[to_t(rows)], to_t(extra[rows]), tgt)
            elif at is not None:
                enc = tokens(shared[1][batch])
                emb = net.embed(enc["input_ids"], enc["attention_mask"])
                out = net.from_embedding(emb[to_t(at)], to_t(extra[rows]), tgt)
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
        uniq, at = _distinct(texts, val_rows)
        raw = pred._raw(uniq)[at[val_rows]]
        meta.update(estimate_history_prior(raw[:, 0], [lengths[i] for i in val_rows], DEFAULT_KAPPA))
    pred._hash = None
    return pred


def _distinct(texts: Sequence[str], rows: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The distinct texts of ``rows`` (first-seen order), and per row index (all rows) its position among them."""
    pos: dict[str, int] = {}
    at = np.full(len(texts), -1, dtype=np.int64)
    for r in rows.tolist():
        at[r] = pos.setdefault(texts[r], len(pos))
    return list(pos), at


def _shared_texts(texts: Sequence[str], rows: np.ndarray) -> tuple[list[np.ndarray], np.ndarray] | None:
    """Per distinct text of ``rows``: its rows, and one representative row; None when no text repeats."""
    uniq, at = _distinct(texts, rows)
    if len(uniq) == len(rows):
        return None
    by_text = rows[np.argsort(at[rows], kind="stable")]  # rows grouped by text, each group in row order
    members = np.split(by_text, np.cumsum(np.bincount(at[rows], minlength=len(uniq)))[:-1])
    return members, np.array([m[0] for m in members], dtype=np.int64)


def _rows_of_texts(shared: tuple[list[np.ndarray], np.ndarray], batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the batch's texts, and for each row its text's position in the batch (its embedding)."""
    parts = [shared[0][u] for u in batch.tolist()]
    rows = np.concatenate(parts)
    at = np.repeat(np.arange(len(parts), dtype=np.int64), [len(p) for p in parts])
    return rows, at


def length_grouped_batches(
    rng: np.random.Generator, rows: np.ndarray, n_tokens: np.ndarray | None, batch_size: int, window: int = 50
) -> list[np.ndarray]:
    """``rows`` shuffled into batches of ``batch_size``, each of prompts of similar token counts.

    The rows are shuffled, cut into windows of ``window`` batches, sorted by
    length inside each window, cut into batches, and the batches shuffled: every
    epoch still sees new batch compositions and a random batch order, but a
    batch pads to little more than its own prompts (the sampler that Hugging
    Face's ``group_by_length`` uses). Without ``n_tokens`` (embeddings cached,
    nothing padded) it is a plain shuffle.
    """
    order = rng.permutation(rows)
    if n_tokens is None:
        return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    span = batch_size * window
    batches: list[np.ndarray] = []
    for s in range(0, len(order), span):
        chunk = order[s : s + span]
        chunk = chunk[np.argsort(-n_tokens[chunk], kind="stable")]
        batches.extend(chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def _conformal_adjust(
    pred: TransformerPredictor,
    texts: list[str],
    lengths: list[np.ndarray],
    rows: np.ndarray,
    targets: Sequence[str] | None,
) -> float:
    """Log-units shift of q10 down and q90 up so the band covers 80% of validation lengths."""
    names = [None] if targets is None else sorted(set(targets[i] for i in rows))
    heads = [None if n is None else pred.targets.index(n) for n in names]
    uniq, at = _distinct(texts, rows)
    raws = []
    for name, raw in zip(names, pred._raw_heads(uniq, heads), strict=True):  # one encoder pass per text
        sub = rows if name is None else np.array([i for i in rows if targets[i] == name])
        raws.append((sub, raw[at[sub]]))
    scores = []
    for sub, raw in raws:
        for j, i in enumerate(sub):
            a = np.log(np.maximum(lengths[i], 1.0))
            scores.append(np.maximum(raw[j, 1] - a, a - raw[j, 3]))
    e = np.concatenate(scores)
    level = min(1.0, 0.8 * (1 + 1 / len(e)))
    return float(np.quantile(e, level))
