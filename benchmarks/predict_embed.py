"""Encoder-embedding heads per model for ``benchmarks/predict_quality.py`` (kinds minilm-heads, static-heads).

An affordable, honest measurement of what the MiniLM encoder adds on a
2-core CPU: embeddings are computed once for every distinct CASTILLO prompt
(frozen encoder, mean pooling, 128 tokens), then for each of the 13 models a
ridge head is fitted on that model's own train rows only (4,000 (prompt,
sample) pairs, and all rows), alone and on top of the lexical prior, and
calibrated with out-of-fold residuals. This is *not* a fine-tune of the
encoder: a fine-tune per model is 13 CPU-hours here.

``static``: the encoder distilled to static token vectors (each vocabulary
token encoded alone, the output at its position), a prompt being the mean of
its tokens' vectors: no transformer at inference, so thousands of prompts/s.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

MAX_TOKENS = 128
RIDGE = 30.0  # head penalty on standardised embeddings; 3-300 changed mean tau by < 0.01


def _encoder():
    import torch
    import transformers

    from aspc.predict.transformer import default_base_model

    path = default_base_model()
    tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    enc = transformers.AutoModel.from_pretrained(str(path), local_files_only=True).float().eval()
    return torch, tok, enc


def minilm_embeddings(texts: list[str], batch: int = 32) -> np.ndarray:
    torch, tok, enc = _encoder()
    order = np.argsort([len(t) for t in texts], kind="stable")
    out = np.zeros((len(texts), enc.config.hidden_size), np.float32)
    with torch.inference_mode():
        for s in range(0, len(texts), batch):
            idx = order[s : s + batch]
            e = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
            h = enc(**e).last_hidden_state
            m = e["attention_mask"].unsqueeze(-1).float()
            out[idx] = ((h * m).sum(1) / m.sum(1)).numpy()
    return out


def static_table(batch: int = 1024) -> np.ndarray:
    """One vector per vocabulary token: the encoder's output for ``[CLS] token [SEP]`` at the token."""
    torch, tok, enc = _encoder()
    n = tok.vocab_size
    table = np.zeros((n, enc.config.hidden_size), np.float32)
    with torch.inference_mode():
        for s in range(0, n, batch):
            ids = torch.arange(s, min(n, s + batch)).unsqueeze(1)
            cls = torch.full_like(ids, tok.cls_token_id)
            sep = torch.full_like(ids, tok.sep_token_id)
            h = enc(input_ids=torch.cat([cls, ids, sep], 1), attention_mask=torch.ones(len(ids), 3, dtype=torch.long))
            table[s : s + len(ids)] = h.last_hidden_state[:, 1].numpy()
    return table


class StaticEncoder:
    """Mean of static token vectors: tokenizer + a gather, no transformer."""

    def __init__(self, table: np.ndarray) -> None:
        _, self.tok, _ = _encoder()
        self.table = table

    def __call__(self, texts: list[str]) -> np.ndarray:
        ids = self.tok(texts, add_special_tokens=False, truncation=True, max_length=512)["input_ids"]
        counts = np.array([max(len(x), 1) for x in ids])
        flat = np.concatenate([x if x else [self.tok.unk_token_id] for x in ids]).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        return np.add.reduceat(self.table[flat], starts, axis=0) / counts[:, None]


def _features(emb: np.ndarray, texts: list[str], mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
    from aspc.predict.transformer import _length_features

    return np.hstack([(emb - mu) / sd, _length_features(texts), np.ones((len(texts), 1), np.float32)])


def _ridge(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    pen = np.full(x.shape[1], RIDGE)
    pen[-1] = 0.0  # intercept unpenalised
    return np.linalg.solve(x.T @ x + np.diag(pen), x.T @ y)


def fit_head(emb_of, texts, lengths, prior=None, seed: int = 0, folds: int = 5):
    """Ridge head (+ optional prior offset) with an out-of-fold calibration; returns predict(texts)."""
    from aspc.predict.calibration import Calibration

    e = emb_of(texts)
    mu, sd = e.mean(0), e.std(0) + 1e-6
    x = _features(e, texts, mu, sd)
    y = np.log(np.maximum([float(np.mean(a)) for a in lengths], 1.0))
    off = np.zeros(len(y)) if prior is None else prior.log_scores(texts)
    fold = np.random.default_rng(seed).permutation(len(y)) % folds
    oof = np.empty(len(y))
    for k in range(folds):
        w = _ridge(x[fold != k], (y - off)[fold != k])
        oof[fold == k] = x[fold == k] @ w + off[fold == k]
    w = _ridge(x, y - off)
    cal = Calibration.fit(oof, lengths)

    def predict(new_texts):
        z = _features(emb_of(new_texts), new_texts, mu, sd) @ w
        return cal.apply(z + (0 if prior is None else prior.log_scores(new_texts)))

    return predict


def bench_heads(d, models, lexical, args, static: bool) -> dict:
    from predict_quality import own_pairs, pick, rows_of

    from aspc.predict.metrics import evaluate

    texts = sorted(set(d["prompt_text"]))
    cache = args.embeddings
    key = "static" if static else "minilm"
    store = dict(np.load(cache, allow_pickle=False)) if cache is not None and Path(cache).is_file() else {}
    started = time.perf_counter()
    speed = {}
    if static:
        if "static_table" not in store:
            store["static_table"] = static_table()
        enc = StaticEncoder(store["static_table"])
        sample = texts[:2000]
        enc(sample[:64])
        t0 = time.perf_counter()
        enc(sample)
        speed["static_embed_prompts_per_s"] = len(sample) / (time.perf_counter() - t0)
        emb = enc(texts)
    else:
        if "minilm" not in store:
            store["minilm"] = minilm_embeddings(texts)
        emb = store["minilm"]
    if cache is not None:
        np.savez(cache, **store)
    row_of = {t: i for i, t in enumerate(texts)}

    def emb_of(ts):
        return emb[[row_of[t] for t in ts]]

    out: dict[str, dict] = {f"{key}-{args.own_pairs}": {}, f"{key}-all": {}}
    if lexical is not None:
        out |= {f"{key}+lexical-{args.own_pairs}": {}, f"{key}+lexical-all": {}}
    for m in models:
        tr, va = rows_of(d, "train", m), rows_of(d, "validate", m)
        vt, vl = pick(d, "prompt_text", va), pick(d, "output_sizes", va)
        few_t, few_l = own_pairs(d, tr, args.own_pairs, args.seed)
        all_t, all_l = pick(d, "prompt_text", tr), pick(d, "output_sizes", tr)
        for name, (t, lens) in ((str(args.own_pairs), (few_t, few_l)), ("all", (all_t, all_l))):
            out[f"{key}-{name}"][m] = evaluate(fit_head(emb_of, t, lens, seed=args.seed)(vt), vl)
            if lexical is not None:
                head = fit_head(emb_of, t, lens, prior=lexical.with_target(m), seed=args.seed)
                out[f"{key}+lexical-{name}"][m] = evaluate(head(vt), vl)
        print(f"  {key} {m}: {out[f'{key}-all'][m]['kendall_tau']:.3f}", flush=True)
    res: dict[str, dict] = {k: {"per_model": v} for k, v in out.items()}
    res[f"{key}-info"] = {"seconds": time.perf_counter() - started, **speed}
    return res
