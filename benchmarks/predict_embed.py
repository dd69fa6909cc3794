"""Encoder-embedding heads per model for ``benchmarks/predict_quality.py`` (kinds minilm-heads, static).

An affordable, honest measurement of what the MiniLM encoder adds on a
2-core CPU: embeddings are computed once for every distinct CASTILLO prompt
(frozen encoder, mean pooling, 128 tokens), then for each of the 13 models a
ridge head is fitted on that model's own train rows only (4,000 (prompt,
sample) pairs, and all rows), alone and on top of the lexical prior, and
calibrated with out-of-fold residuals. This is *not* a fine-tune of the
encoder: a fine-tune per model is 13 CPU-hours here.

``static``: the library's static predictor (:mod:`aspc.predict.static`,
what ``aspc predict train --kind static`` trains): the encoder distilled once
into one vector per vocabulary token, then per model
:func:`~aspc.predict.static_train.train_static` on that model's own train
rows (its ridge penalty chosen by out-of-fold error, its bands calibrated as
the lexical predictor's), alone and on top of the lexical prior; also with
the table kept in float32 (the directory stores float16) to measure what
the storage costs.

The measurement is ``predict_quality.py``'s (its data, splits, metrics and
table); run it from there, or from here, which runs predict_quality.py with
these kinds (lexical first: its predictor is the prior of the ``+lexical``
rows) and passes every other option on:

    .venv/bin/python benchmarks/predict_embed.py --embeddings emb.npz
    .venv/bin/python benchmarks/predict_embed.py --kinds static --models Phi-4 --static-f32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from aspc.progress import NULL_PROGRESS

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

    if static:
        return bench_static(d, models, lexical, args)
    texts = sorted(set(d["prompt_text"]))
    cache = args.embeddings
    key = "minilm"
    store = dict(np.load(cache, allow_pickle=False)) if cache is not None and Path(cache).is_file() else {}
    started = time.perf_counter()
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
    res[f"{key}-info"] = {"seconds": time.perf_counter() - started}
    return res


def distilled(args) -> tuple[str, np.ndarray, dict]:
    """(tokenizer JSON, float32 table, description) of the base encoder, cached in ``--embeddings``."""
    from aspc.predict.static import StaticConfig
    from aspc.predict.static_train import _distil

    cache = args.embeddings
    store = dict(np.load(cache, allow_pickle=False)) if cache is not None and Path(cache).is_file() else {}
    if "static_table32" not in store:
        tok, table, info = _distil(args.base_model, None, StaticConfig(table_dtype="float32"), NULL_PROGRESS)
        store["static_table32"] = table
        store["static_tokenizer"] = np.frombuffer(tok.encode(), dtype=np.uint8)
        store["static_info"] = np.frombuffer(json.dumps(info).encode(), dtype=np.uint8)
        if cache is not None:
            np.savez(cache, **store)
    info = json.loads(store["static_info"].tobytes().decode())
    return store["static_tokenizer"].tobytes().decode(), store["static_table32"], info


def bench_static(d, models, lexical, args) -> dict:
    from predict_quality import own_pairs, pick, rows_of

    from aspc.predict.metrics import evaluate
    from aspc.predict.static_train import train_static

    started = time.perf_counter()
    tok, t32, info = distilled(args)
    distil_s = time.perf_counter() - started
    t16 = t32.astype(np.float16)
    from aspc.predict.static import StaticConfig

    head, tail = (int(x) for x in args.static_cut.split(","))
    config = StaticConfig(head_chars=head, tail_chars=tail)
    out: dict[str, dict] = {}
    lams: dict[str, list] = {}
    for m in models:
        tr, va = rows_of(d, "train", m), rows_of(d, "validate", m)
        vt, vl = pick(d, "prompt_text", va), pick(d, "output_sizes", va)
        few = own_pairs(d, tr, args.own_pairs, args.seed)
        full = (pick(d, "prompt_text", tr), pick(d, "output_sizes", tr))
        for name, (t, lens) in ((str(args.own_pairs), few), ("all", full)):
            runs = [("static", t16, None)]
            if args.static_f32:
                runs.append(("static-f32", t32, None))
            if args.static_sif:
                runs.append(("static-sif", sif_table(tok, t32, t), None))
            if lexical is not None:
                runs.append(("static+lexical", t16, lexical.with_target(m)))
            for key, table, init in runs:
                p = train_static(t, lens, init=init, table=(tok, table, info), config=config, seed=args.seed,
                                 validation_split=0.0)  # fmt: skip
                out.setdefault(f"{key}-{name}", {})[m] = evaluate(p.predict(vt), vl)
                lams.setdefault(f"{key}-{name}", []).append(p.metadata["training"]["ridge_lam"])
        print(f"  static {m}: own {args.own_pairs} {out[f'static-{args.own_pairs}'][m]['kendall_tau']:.3f}, "
              f"all {out['static-all'][m]['kendall_tau']:.3f}", flush=True)  # fmt: skip
    res: dict[str, dict] = {k: {"per_model": v, "ridge_lam": lams[k]} for k, v in out.items()}
    res["static-info"] = {"distil_s": distil_s, "seconds": time.perf_counter() - started, **info}
    return res


def sif_table(tok: str, table: np.ndarray, texts: list[str], a: float = 1e-3) -> np.ndarray:
    """Rows scaled by smooth inverse frequency ``a / (a + p(token))``, ``p`` from ``texts`` (exploratory)."""
    from aspc.predict.static import StaticConfig, load_tokenizer_json, token_ids

    flat, _ = token_ids(load_tokenizer_json(tok), texts, StaticConfig(), len(table))
    p = np.bincount(flat, minlength=len(table)) / max(len(flat), 1)
    return (table * (a / (a + p))[:, None]).astype(np.float16)


KINDS = ("lexical", "minilm-heads", "static", "static-heads")  # predict_quality's kinds this module measures


def main(argv: list[str] | None = None) -> int:
    """predict_quality.py with this module's kinds: this file alone defines functions and measured nothing."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Every other option is predict_quality.py's (see its --help), e.g. --embeddings FILE.npz (cache the "
               "MiniLM embeddings and the distilled table), --models, --own-pairs, --seed, --lexical-cache DIR, "
               "--static-f32, --static-sif, --static-cut, --json-out; skips with a message when the data is absent.",
    )  # fmt: skip
    ap.add_argument("--kinds", default="lexical,minilm-heads,static",
                    help=f"comma list of {', '.join(KINDS)} (default: %(default)s)")
    args, rest = ap.parse_known_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds):
        ap.error(f"--kinds: each one of {', '.join(KINDS)} (got {args.kinds!r})")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from predict_quality import main as quality

    return quality(["--kinds", ",".join(kinds), *rest])


if __name__ == "__main__":
    raise SystemExit(main())
