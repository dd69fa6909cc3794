"""Length-predictor quality per target model on CASTILLO, and prediction speed.

Trains on the ``train`` split of ``../shared/data/castillo-dev.parquet`` and
reports, per model on the ``validate`` split (target = mean of the ten
sampled lengths): Kendall tau, Spearman rho, MAE (tokens), q10-q90 coverage of
the individual samples, and the average over models; plus prompts/s.

Predictors:

- ``lexical``: one lexical predictor over all models' pairs (shared text
  weights, per-model intercept and calibration), evaluated with each model's
  head. This is how the shipped default is trained.
- ``lexical-per-model``: a separate lexical predictor per model, trained on
  that model's pairs only.
- ``history``: ``lexical`` plus one observed sample per prompt as history;
  target = mean of the other nine samples, coverage over those nine.
- ``transformer``: all-MiniLM-L6-v2 fine-tuned on ``--transformer-pairs``
  pairs sampled from train (4,000, the preprint's size; 0 = all), one model
  with per-model heads. Needs torch; slow on CPU, use ``--device cuda``.
  With ``--distil-static`` also ``transformer-static``: the fine-tuned
  encoder distilled into a static predictor (one vector per vocabulary
  token, heads on the same rows), the CPU-speed form of it.
- ``transformer-own``: all-MiniLM-L6-v2 fine-tuned per model on that model's
  own train pairs only (``--own-pairs``, 4,000, drawn as for ``refit``; with
  ``--refit-all`` also all its rows): the issue's "MiniLM fine-tuned on the
  policy's own pairs". One fine-tune per model, an accelerator job
  (``--device cuda``; ``--models`` picks some).
- ``transformer-speed``: CPU prompts/s of the transformer architecture
  (base encoder, untrained head: speed does not depend on the weights).
- ``refit``: the policy workflow. The ``lexical`` predictor (train split,
  13 models) is the prior; for each model it is refitted (``--init``) on that
  model's own train rows only: ``--own-pairs`` (4,000) (prompt, one sampled
  length) pairs drawn at random, and all its rows with all ten samples.
- ``refit-in-domain``: the ``refit`` workflow without the split's shift of
  sources (``train`` is code and a little Alpaca, ``validate`` half chat),
  i.e. the probe workflow: the policy's pairs come from the same prompts
  it will be planned on. Per model a seeded half of its ``validate``
  prompts is held out and every figure is measured on that half only; the
  other half is the probe. Rows: ``prior`` (the ``lexical`` predictor with
  the model's head, never trained on validate); ``probe-refit-1`` (refit on
  one sampled length per probe prompt); ``probe-refit-K`` and
  ``probe-scratch-K`` (``--own-pairs`` K pairs drawn from the probe
  prompts' samples, refit and from scratch: the probe half holds ~730
  prompts per model, so K = 4,000 is ~5.5 samples of each); ``mixed-refit-K``
  (K pairs from train and the probe half together); ``train-only-refit-K``
  (the ``refit`` row's pairs).
- ``default-in-domain``: the shipped default's recipe (13 models, sources
  as groups) trained on ``train`` plus a seeded half of the ``validate``
  prompts (the same prompts held out for every model), evaluated per model
  on the other half: new prompts from sources it has seen, beside the
  ``lexical`` row's new prompts from two sources it has not (Dolly,
  ShareGPT) and the leave-one-source-out figures of
  ``scripts/cv_default_target.py``.
- ``history-epochs``: ``lexical`` plus samples 0 and 1 as two earlier epochs
  (``HistoryPredictor.from_epochs``); target = mean of the other eight.
- ``minilm-heads``: frozen all-MiniLM-L6-v2 embeddings (128 tokens, computed
  once for all prompts, cached with ``--embeddings``), then per model a ridge
  head on that model's own train rows, alone and on top of the lexical prior
  (offset = prior score).
- ``static`` (alias ``static-heads``): the static predictor
  (``aspc predict train --kind static``: the encoder distilled into one vector
  per vocabulary token, a ridge head on their mean) trained per model on the
  same own rows, alone, on top of the lexical prior (after kind ``lexical``)
  and, with ``--static-f32``, with a float32 table (the directory stores
  float16). The distilled table is cached in ``--embeddings``.
- ``speed``: prompts/s of the shipped default's ``predict`` on 200,000 prompts.

    .venv/bin/python benchmarks/predict_quality.py
    python benchmarks/predict_quality.py --kinds transformer --device cuda --transformer-pairs 4000
    python benchmarks/predict_quality.py --kinds transformer --device cuda --transformer-pairs 0 --distil-static
    python benchmarks/predict_quality.py --kinds transformer-own --device cuda --own-pairs 4000 --refit-all
    .venv/bin/python benchmarks/predict_quality.py --kinds lexical,refit,history-epochs,speed
    .venv/bin/python benchmarks/predict_quality.py --kinds refit-in-domain,default-in-domain --lexical-cache DIR
    .venv/bin/python benchmarks/predict_quality.py --kinds minilm-heads --embeddings emb.npz
    .venv/bin/python benchmarks/predict_quality.py --kinds lexical,static --static-f32 --lexical-cache DIR --embeddings emb.npz

(``--base-model DIR`` for a local copy of the encoder where the wheel is not
installed; ``--data PATH`` for the parquet file elsewhere.)

Skips with a message when the data file is absent.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data" / "castillo-dev.parquet"


def load(path: Path) -> dict[str, list]:
    import pyarrow.parquet as pq

    cols = ["dataset", "model", "prompt_id", "prompt_text", "output_sizes", "split"]
    d = pq.read_table(path, columns=cols).to_pydict()
    d["output_sizes"] = [np.asarray(o, dtype=np.float64) for o in d["output_sizes"]]
    return d


def rows_of(d: dict[str, list], split: str, model: str | None = None) -> list[int]:
    return [
        i
        for i, (s, m) in enumerate(zip(d["split"], d["model"], strict=True))
        if s == split and (model is None or m == model)
    ]


def pick(d: dict[str, list], key: str, idx: list[int]) -> list:
    return [d[key][i] for i in idx]


def speed(pred, texts: list[str], repeat: int = 1) -> float:
    """Prompts per second of ``pred.predict`` (after one warm-up call)."""
    pred.predict(texts[: min(len(texts), 64)])
    started = time.perf_counter()
    for _ in range(repeat):
        pred.predict(texts)
    return repeat * len(texts) / (time.perf_counter() - started)


def per_model(pred_for, d: dict[str, list], models: list[str]) -> dict[str, dict]:
    from aspc.predict.metrics import evaluate

    out = {}
    for m in models:
        idx = rows_of(d, "validate", m)
        out[m] = evaluate(pred_for(m).predict(pick(d, "prompt_text", idx)), pick(d, "output_sizes", idx))
    return out


def per_model_heads(pred, d: dict[str, list], models: list[str]) -> dict[str, dict]:
    """:func:`per_model` of each model's head, every validate prompt encoded once (a transformer's heads)."""
    from aspc.predict.lexical import predict_by_target
    from aspc.predict.metrics import evaluate

    idx = [i for m in models for i in rows_of(d, "validate", m)]
    targets = pick(d, "model", idx)
    got = predict_by_target(pred, pick(d, "prompt_text", idx), targets, models)
    return {m: evaluate(got[m], [d["output_sizes"][i] for i, t in zip(idx, targets, strict=True) if t == m])
            for m in models}  # fmt: skip


def bench_lexical(d, models, args):
    from aspc.predict import load_predictor
    from aspc.predict.lexical_train import train_lexical

    tr = rows_of(d, "train")
    started = time.perf_counter()
    if args.lexical_cache is not None and args.lexical_cache.is_dir():
        pred = load_predictor(args.lexical_cache)
    else:
        pred = train_lexical(
            pick(d, "prompt_text", tr),
            pick(d, "output_sizes", tr),
            targets=pick(d, "model", tr),
            groups=pick(d, "dataset", tr),
            seed=args.seed,
            validation_split=0.0,
        )
        if args.lexical_cache is not None:
            pred.save(args.lexical_cache)
    secs = time.perf_counter() - started
    res = per_model(lambda m: pred.with_target(m), d, models)
    pooled = per_model(lambda m: pred, d, models)
    texts = list(dict.fromkeys(pick(d, "prompt_text", rows_of(d, "validate"))))
    out = {"per_model": res, "train_s": secs, "prompts_per_s": speed(pred, texts, repeat=5)}
    return out | {"pooled_head": pooled}, pred


def bench_lexical_per_model(d, models, args):
    from aspc.predict.lexical_train import train_lexical

    res, started = {}, time.perf_counter()
    from aspc.predict.metrics import evaluate

    for m in models:
        tr = rows_of(d, "train", m)
        pred = train_lexical(
            pick(d, "prompt_text", tr),
            pick(d, "output_sizes", tr),
            groups=pick(d, "dataset", tr),
            seed=args.seed,
            validation_split=0.0,
        )
        va = rows_of(d, "validate", m)
        res[m] = evaluate(pred.predict(pick(d, "prompt_text", va)), pick(d, "output_sizes", va))
    return {"per_model": res, "train_s": time.perf_counter() - started}


def bench_history(d, models, base):
    """One earlier sample per prompt, through ``HistoryPredictor`` (what ``--history`` runs)."""
    from aspc.predict.history import HistoryPredictor
    from aspc.predict.metrics import evaluate

    res, kappas = {}, {}
    for m in models:
        idx = rows_of(d, "validate", m)
        ids = [str(i) for i in idx]
        samples = pick(d, "output_sizes", idx)
        hp = HistoryPredictor(base.with_target(m), {k: s[:1] for k, s in zip(ids, samples, strict=True)})
        res[m] = evaluate(hp.predict(pick(d, "prompt_text", idx), ids=ids), [s[1:] for s in samples])
        kappas[m.split("--")[-1]] = round(hp.metadata["kappa_used"], 3)
    return {"per_model": res, "trained_kappa": round(base.metadata["history_kappa"], 3), "kappa": kappas}


def bench_transformer(d, models, args):
    from aspc.predict.transformer import TransformerConfig
    from aspc.predict.transformer_train import train_transformer

    tr = rows_of(d, "train")
    if args.transformer_pairs:
        tr = sorted(
            np.random.default_rng(args.seed).choice(
                tr, size=min(args.transformer_pairs, len(tr)), replace=False
            )
        )
    config = TransformerConfig(
        base_model=args.base_model, epochs=args.epochs, freeze_encoder=args.freeze_encoder
    )
    started = time.perf_counter()
    pred = train_transformer(
        pick(d, "prompt_text", tr),
        pick(d, "output_sizes", tr),
        targets=pick(d, "model", tr),
        config=config,
        device=args.device,
        seed=args.seed,
        validation_split=0.1,
    )
    secs = time.perf_counter() - started
    if args.save is not None:
        pred.save(args.save)
    res = per_model_heads(pred, d, models)
    texts = list(dict.fromkeys(pick(d, "prompt_text", rows_of(d, "validate"))))
    out = {
        "transformer": {
            "per_model": res,
            "train_s": secs,
            "n_pairs": len(tr),
            "device": str(pred.device),
            "prompts_per_s": speed(pred, texts[:2000]),
            "epochs": config.n_epochs(),
            "freeze_encoder": config.freeze_encoder,
        }
    }
    if args.distil_static:
        # The fine-tuned encoder distilled into one vector per vocabulary token (CPU speed), heads on the same rows.
        from aspc.predict.static_train import train_static

        started = time.perf_counter()
        static = train_static(
            pick(d, "prompt_text", tr),
            pick(d, "output_sizes", tr),
            targets=pick(d, "model", tr),
            init=pred,
            seed=args.seed,
            validation_split=0.1,
        )
        out["transformer-static"] = {
            "per_model": per_model(lambda m: static.with_target(m), d, models),
            "train_s": time.perf_counter() - started,
        }
    return out


def bench_transformer_own(d, models, args):
    """Per model: MiniLM fine-tuned on that model's own train pairs only (the issue's "policy's own pairs").

    ``--own-pairs`` (prompt, one sampled length) pairs drawn as for ``refit``,
    and with ``--refit-all`` every train row of the model with its ten
    lengths; evaluated on the model's validate rows. One fine-tune per model
    and setting: an accelerator job (on the 2-core development CPU, 320 pairs
    x 1 epoch took 194 s on one torch thread with random batches; 136 s on two,
    92 s with length-grouped batches: still ~1 h per model at 4,000 pairs
    x 3 epochs), so ``--models`` can take a few.
    """
    from aspc.predict.metrics import evaluate
    from aspc.predict.transformer import TransformerConfig
    from aspc.predict.transformer_train import train_transformer

    config = TransformerConfig(base_model=args.base_model, epochs=args.epochs, freeze_encoder=args.freeze_encoder)
    init = None
    if args.init is not None:
        from aspc.predict import load_predictor

        # The product's refit (`aspc predict train PAIRS --kind transformer --init DIR`), e.g. from the
        # MiniLM fine-tuned on all 13 models' train rows (--kinds transformer --save DIR).
        init = load_predictor(args.init, device=args.device)
    sets = {f"transformer-own-{args.own_pairs}": args.own_pairs} | ({"transformer-own-all": 0} if args.refit_all else {})
    out: dict[str, dict] = {name: {} for name in sets}
    secs: dict[str, list[float]] = {name: [] for name in sets}
    device = None
    for m in models:
        tr = rows_of(d, "train", m)
        va = rows_of(d, "validate", m)
        vt, vl = pick(d, "prompt_text", va), pick(d, "output_sizes", va)
        for name, k in sets.items():
            texts, lens = own_pairs(d, tr, k, args.seed) if k else (pick(d, "prompt_text", tr), pick(d, "output_sizes", tr))
            started = time.perf_counter()
            pred = train_transformer(texts, lens, config=config, device=args.device, seed=args.seed,
                                     validation_split=0.1, init=init)
            secs[name].append(time.perf_counter() - started)
            device = str(pred.device)
            out[name][m] = evaluate(pred.predict(vt), vl)
            if args.save is not None:
                pred.save(Path(args.save) / (m if len(sets) == 1 else f"{m}--{name}"))
            print(f"  {m}: {name} tau {out[name][m]['kendall_tau']:.3f} ({secs[name][-1]:.0f} s)", flush=True)
            if args.json_out is not None:
                partial = args.json_out.with_suffix(".transformer-own-partial.json")
                partial.write_text(json.dumps({n: {"per_model": v} for n, v in out.items()}, indent=1, default=float))
    return {name: {"per_model": out[name], "train_s_mean": float(np.mean(secs[name])) if secs[name] else None,
                   "device": device, "epochs": config.n_epochs()} for name in sets}


def bench_transformer_speed(d, args):
    import torch

    from aspc.predict.transformer import (
        TransformerConfig,
        TransformerPredictor,
        _build_net,
        _load_base,
        _require_torch,
    )

    torch_, transformers = _require_torch()
    encoder, tokenizer, _ = _load_base(torch_, transformers, args.base_model)
    net = _build_net(torch_, encoder, 0)
    pred = TransformerPredictor(
        net, tokenizer, TransformerConfig(), [], (5.5, 1.0), 0.0, {}, torch.device("cpu")
    )
    texts = list(dict.fromkeys(pick(d, "prompt_text", rows_of(d, "validate"))))
    sample = [texts[i] for i in np.random.default_rng(0).choice(len(texts), size=args.speed_n, replace=False)]
    return {"cpu_prompts_per_s": speed(pred, sample), "threads": torch.get_num_threads(), "n": len(sample)}


def bench_refit(d, models, base, args):
    """Per model: the prior refitted on the model's own pairs (a probe's 4,000, and all its train rows)."""
    from aspc.predict.lexical_train import train_lexical
    from aspc.predict.metrics import evaluate

    out: dict[str, dict] = {f"refit-{args.own_pairs}": {}}
    if args.refit_all:
        out["refit-all"] = {}
    if args.scratch:
        out[f"scratch-{args.own_pairs}"] = {}
    secs = {}
    for m in models:
        tr = rows_of(d, "train", m)
        va = rows_of(d, "validate", m)
        vt, vl = pick(d, "prompt_text", va), pick(d, "output_sizes", va)
        texts, lens = own_pairs(d, tr, args.own_pairs, args.seed)
        started = time.perf_counter()
        refit = train_lexical(texts, lens, init=base, seed=args.seed, validation_split=0.0)
        secs[m] = time.perf_counter() - started
        out[f"refit-{args.own_pairs}"][m] = evaluate(refit.predict(vt), vl)
        if args.refit_all:
            full = train_lexical(pick(d, "prompt_text", tr), pick(d, "output_sizes", tr), init=base,
                                 seed=args.seed, validation_split=0.0)  # fmt: skip
            out["refit-all"][m] = evaluate(full.predict(vt), vl)
        if args.scratch:
            scratch = train_lexical(texts, lens, seed=args.seed, validation_split=0.0)
            out[f"scratch-{args.own_pairs}"][m] = evaluate(scratch.predict(vt), vl)
        print(f"  {m}: refit {out[f'refit-{args.own_pairs}'][m]['kendall_tau']:.3f}", flush=True)
        if args.json_out is not None:
            partial = args.json_out.with_suffix(".refit-partial.json")
            partial.write_text(json.dumps({k: {"per_model": v} for k, v in out.items()}, indent=1, default=float))
    return {k: {"per_model": v} for k, v in out.items()} | {"refit-seconds": {"mean_s": float(np.mean(list(secs.values())))}}


def bench_refit_in_domain(d, models, base, args):
    """Per model, on a held-out half of validate: own pairs with and without the shift of sources."""
    from aspc.predict.lexical_train import train_lexical
    from aspc.predict.metrics import evaluate

    k = args.own_pairs
    names = ("prior", "probe-refit-1", f"probe-refit-{k}", f"probe-scratch-{k}", f"mixed-refit-{k}",
             f"train-only-refit-{k}")  # fmt: skip
    out: dict[str, dict] = {n: {} for n in names}
    for m in models:
        tr = rows_of(d, "train", m)
        va = rows_of(d, "validate", m)
        perm = np.random.default_rng(args.seed).permutation(len(va))
        held = sorted(va[i] for i in perm[: len(va) // 2])
        probe = sorted(va[i] for i in perm[len(va) // 2 :])
        ht, hl = pick(d, "prompt_text", held), pick(d, "output_sizes", held)
        out["prior"][m] = evaluate(base.with_target(m).predict(ht), hl)
        probe_k = own_pairs(d, probe, k, args.seed)
        fits = {
            "probe-refit-1": (one_per_prompt(d, probe, args.seed), base),
            f"probe-refit-{k}": (probe_k, base),
            f"probe-scratch-{k}": (probe_k, None),
            f"mixed-refit-{k}": (own_pairs(d, sorted(tr + probe), k, args.seed), base),
            f"train-only-refit-{k}": (own_pairs(d, tr, k, args.seed), base),
        }
        for name, ((texts, lens), init) in fits.items():
            fit = train_lexical(texts, lens, init=init, seed=args.seed, validation_split=0.0)
            out[name][m] = evaluate(fit.predict(ht), hl)
        print("  " + m + ": " + ", ".join(f"{n} {out[n][m]['kendall_tau']:.3f}" for n in names), flush=True)
    return {n: {"per_model": v} for n, v in out.items()}


def bench_default_in_domain(d, models, args):
    """The default's recipe on train + half of validate's prompts, per model on the other half."""
    from aspc.predict.lexical_train import train_lexical
    from aspc.predict.metrics import evaluate

    val_ids = sorted({p for p, s in zip(d["prompt_id"], d["split"], strict=True) if s == "validate"})
    perm = np.random.default_rng(args.seed).permutation(len(val_ids))
    held = {val_ids[i] for i in perm[: len(val_ids) // 2]}
    fit = [i for i, p in enumerate(d["prompt_id"]) if p not in held]
    started = time.perf_counter()
    pred = train_lexical(pick(d, "prompt_text", fit), pick(d, "output_sizes", fit), targets=pick(d, "model", fit),
                         groups=pick(d, "dataset", fit), seed=args.seed, validation_split=0.0)  # fmt: skip
    secs = time.perf_counter() - started
    heads: dict[str, dict] = {"default-in-domain": {}, "default-in-domain-pooled-head": {}}
    for m in models:
        idx = [i for i, (p, mm) in enumerate(zip(d["prompt_id"], d["model"], strict=True)) if p in held and mm == m]
        texts, lens = pick(d, "prompt_text", idx), pick(d, "output_sizes", idx)
        heads["default-in-domain"][m] = evaluate(pred.with_target(m).predict(texts), lens)
        heads["default-in-domain-pooled-head"][m] = evaluate(pred.predict(texts), lens)
    return {k: {"per_model": v} for k, v in heads.items()} | {"default-in-domain-train": {"train_s": secs}}


def one_per_prompt(d, rows: list[int], seed: int) -> tuple[list[str], list[np.ndarray]]:
    """One (prompt, sampled length) pair per row, the sample drawn at random: what a probe gives."""
    rng = np.random.default_rng(seed)
    picks = [d["output_sizes"][i][rng.integers(len(d["output_sizes"][i]))] for i in rows]
    return pick(d, "prompt_text", rows), [np.asarray([float(x)]) for x in picks]


def own_pairs(d, rows: list[int], k: int, seed: int) -> tuple[list[str], list[np.ndarray]]:
    """``k`` (prompt, one sampled length) pairs drawn without replacement from ``rows``' samples."""
    sizes = [len(d["output_sizes"][i]) for i in rows]
    flat = np.repeat(np.arange(len(rows)), sizes)
    within = np.concatenate([np.arange(n) for n in sizes])
    chosen = np.sort(np.random.default_rng(seed).choice(len(flat), size=min(k, len(flat)), replace=False))
    by_row: dict[int, list[float]] = {}
    for c in chosen:
        by_row.setdefault(int(flat[c]), []).append(float(d["output_sizes"][rows[flat[c]]][within[c]]))
    keys = sorted(by_row)
    return [d["prompt_text"][rows[r]] for r in keys], [np.asarray(by_row[r]) for r in keys]


def bench_history_epochs(d, models, base):
    from aspc.predict.history import HistoryPredictor
    from aspc.predict.metrics import evaluate

    res, info = {}, {}
    for m in models:
        idx = rows_of(d, "validate", m)
        ids = [str(i) for i in idx]
        samples = pick(d, "output_sizes", idx)
        epochs = [{k: s[e : e + 1] for k, s in zip(ids, samples, strict=True)} for e in (0, 1)]
        hp = HistoryPredictor.from_epochs(base.with_target(m), epochs)
        res[m] = evaluate(hp.predict(pick(d, "prompt_text", idx), ids=ids), [s[2:] for s in samples])
        info[m.split("--")[-1]] = {"kappa": round(hp.metadata["kappa_used"], 3), **hp.metadata["epochs"]}
    return {"per_model": res, "epochs": info}


def bench_speed(base, d) -> dict:
    texts = list(dict.fromkeys(d["prompt_text"]))
    big = (texts * (200_000 // len(texts) + 1))[:200_000]
    base.predict(big[:1000])
    started = time.perf_counter()
    base.predict(big)
    return {"default_prompts_per_s": len(big) / (time.perf_counter() - started), "n": len(big)}


def table(results: dict, models: list[str]) -> str:
    from aspc.predict.metrics import mean_over

    names = [k for k in results if "per_model" in results[k]]
    lines = []
    head = f"{'model':38s}" + "".join(f" | {n[:22]:^28s}" for n in names)
    sub = f"{'':38s}" + "".join(" |    tau   rho    MAE   cov" for _ in names)
    lines += [head, sub, "-" * len(sub)]
    for m in models + ["mean"]:
        cells = []
        for n in names:
            pm = results[n]["per_model"]
            r = mean_over(pm) if m == "mean" else pm.get(m)  # a figure a model's prompts cannot define is None
            cells.append(
                " |      n/a"
                if r is None
                else f" | {_num(r['kendall_tau'], 6, 3)} {_num(r['spearman'], 5, 3)} {_num(r['mae'], 6, 0)} "
                f"{_num(r['coverage_q10_q90'], 5, 3)}"
            )
        lines.append(f"{m[:38]:38s}" + "".join(cells))
    return "\n".join(lines)


def _num(v: float | None, width: int, digits: int) -> str:
    return f"{'n/a':>{width}s}" if v is None else f"{v:{width}.{digits}f}"


def markdown(results: dict, models: list[str], key: str = "kendall_tau") -> str:
    """A README table: one row per model, one column per predictor, ``key`` in each cell."""
    from aspc.predict.metrics import mean_over

    names = [k for k in results if "per_model" in results[k]]
    lines = ["| model | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for m in models + ["mean"]:
        cells = []
        for n in names:
            pm = results[n]["per_model"]
            v = mean_over(pm)[key] if m == "mean" else pm.get(m, {}).get(key)
            cells.append("n/a" if v is None else f"{v:.3f}")
        label = "**mean**" if m == "mean" else m.split("--")[-1]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--kinds", default="lexical,lexical-per-model,history,transformer-speed")
    ap.add_argument("--transformer-pairs", type=int, default=4000, help="0 = all train pairs")
    ap.add_argument("--base-model", default=None)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--freeze-encoder", action="store_true")
    ap.add_argument("--distil-static", action="store_true", help="transformer: also distil the fine-tuned encoder (kind static)")
    ap.add_argument("--speed-n", type=int, default=200, help="prompts for the CPU transformer speed run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--own-pairs", type=int, default=4000, help="refit: (prompt, sample) pairs per model")
    ap.add_argument("--markdown", action="store_true", help="also print README tables (tau, coverage)")
    ap.add_argument("--from-json", type=Path, nargs="*", default=None, help="print tables of saved --json-out runs")
    ap.add_argument("--lexical-cache", type=Path, default=None, help="save/reuse the train-split lexical predictor")
    ap.add_argument("--refit-all", action="store_true", help="refit: also on all the model's train rows")
    ap.add_argument("--init", default=None,
                    help="transformer-own: refit from this transformer predictor instead of the base encoder")
    ap.add_argument("--scratch", action="store_true", help="refit: also train from scratch on the own pairs")
    ap.add_argument("--embeddings", type=Path, default=None, help="minilm/static heads: embedding cache (.npz)")
    ap.add_argument("--static-f32", action="store_true", help="static: also with a float32 table")
    ap.add_argument("--static-cut", default="512,128", help="static: head,tail characters tokenized")
    ap.add_argument("--static-sif", action="store_true", help="static: also with rows weighted by inverse token frequency")
    ap.add_argument("--save", type=Path, default=None, help="transformer: also save the fine-tuned predictor here (transformer-own: one per model, DIR/MODEL)")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--models", default=None, help="comma-separated substrings: only the models matching one")
    args = ap.parse_args(argv)
    if not args.data.is_file():
        print(f"skipped: {args.data} not found (see ../shared/data/README.md)")
        return 0
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    if args.from_json:
        merged: dict = {}
        for f in args.from_json:
            merged.update(json.loads(f.read_text()))
        models = sorted({m for r in merged.values() if "per_model" in r for m in r["per_model"]})
        print(markdown(merged, models))
        print(markdown(merged, models, "coverage_q10_q90"))
        return 0
    d = load(args.data)
    models = sorted(set(d["model"]))
    if args.models:
        want = [w.strip() for w in args.models.split(",") if w.strip()]
        models = [m for m in models if any(w in m for w in want)]
        if not models:
            ap.error(f"--models {args.models!r} matches none of the data's models")
    kinds = args.kinds.split(",")
    results: dict = {}
    lexical = None
    for kind in kinds:
        started = time.perf_counter()
        if kind == "lexical":
            results[kind], lexical = bench_lexical(d, models, args)
            results["lexical-pooled-head"] = {"per_model": results[kind].pop("pooled_head")}
        elif kind == "default-in-domain":
            results.update(bench_default_in_domain(d, models, args))
        elif kind == "lexical-per-model":
            results[kind] = bench_lexical_per_model(d, models, args)
        elif kind == "history":
            if lexical is None:
                _, lexical = bench_lexical(d, models, args)
            results[kind] = bench_history(d, models, lexical)
        elif kind == "transformer":
            results.update(bench_transformer(d, models, args))
        elif kind == "transformer-speed":
            results[kind] = bench_transformer_speed(d, args)
        elif kind == "transformer-own":
            results.update(bench_transformer_own(d, models, args))
        elif kind in ("refit", "refit-in-domain", "history-epochs", "speed"):
            if lexical is None:
                _, lexical = bench_lexical(d, models, args)
            if kind == "refit":
                results.update(bench_refit(d, models, lexical, args))
            elif kind == "refit-in-domain":
                results.update(bench_refit_in_domain(d, models, lexical, args))
            elif kind == "history-epochs":
                results[kind] = bench_history_epochs(d, models, lexical)
            else:
                from aspc.predict import load_predictor

                results[kind] = bench_speed(load_predictor("default"), d)
        elif kind in ("minilm-heads", "static", "static-heads"):
            from predict_embed import bench_heads

            # Heads on top of the lexical prior only when this run trains it (kind lexical first).
            results.update(bench_heads(d, models, lexical, args, static=kind != "minilm-heads"))
        else:
            ap.error(f"unknown kind {kind}")
        print(f"[{kind}: {time.perf_counter() - started:.0f} s]", flush=True)
        if args.json_out:  # after every kind: a long run that is stopped keeps what it measured
            args.json_out.write_text(json.dumps(results, indent=1, default=float))
    print(table(results, models))
    for kind, r in results.items():
        extra = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k != "per_model"}
        print(f"{kind}: {extra}")
    if args.markdown:
        print(markdown(results, models))
        print(markdown(results, models, "coverage_q10_q90"))
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
