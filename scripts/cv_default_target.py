"""Leave-one-dataset-out cross-validation that chooses the shipped default's training target.

Two targets for the text weights of the default lexical predictor, trained on
all of ``../shared/data/castillo-dev.parquet`` (both splits, 13 models, 7
prompt sources):

- ``row``: one row per (prompt, model), target the log mean of its ten
  lengths, a per-model intercept (fixed effect), each prompt weighing 1;
- ``prompt``: one row per prompt, target the geometric mean over the models
  that measured it of the model's mean length, each model's level removed
  first (so which models measured a prompt does not move it).

Each dataset is held out in turn; the text weights are fitted on the other
six and score the held-out prompts. Reported: Kendall tau per model over all
its out-of-fold rows, their mean, and the mean tau within each held-out
dataset. The target with the higher mean per-model tau trains the default.

    .venv/bin/python scripts/cv_default_target.py [--data PATH] [--json-out cv.json]
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

    cols = ["dataset", "model", "prompt_text", "output_sizes"]
    d = pq.read_table(path, columns=cols).to_pydict()
    d["output_sizes"] = [np.asarray(o, dtype=np.float64) for o in d["output_sizes"]]
    return d


def cross_validate(d: dict[str, list], target: str, progress=print) -> dict:
    from aspc.predict.features import featurize
    from aspc.predict.lexical import LexicalConfig
    from aspc.predict.lexical_train import _fit
    from aspc.predict.metrics import kendall_tau

    config = LexicalConfig()
    texts = d["prompt_text"]
    uniq, text_of_row = np.unique(np.array(texts, dtype=object), return_inverse=True)
    text_of_row = text_of_row.reshape(-1).astype(np.int64)
    models, target_of_row = np.unique(np.array(d["model"], dtype=object), return_inverse=True)
    target_of_row = target_of_row.reshape(-1).astype(np.int64)
    y_row = np.log(np.maximum([float(np.mean(a)) for a in d["output_sizes"]], 1.0))
    ds_of_text = np.empty(len(uniq), dtype=object)
    ds_of_text[text_of_row] = np.array(d["dataset"], dtype=object)
    f = featurize([str(t) for t in uniq], config.features)
    if target == "row":
        rows_y, tor, n_t = y_row, target_of_row, len(models)
        tex = text_of_row
        weight = 1.0 / np.bincount(text_of_row)[text_of_row]
    else:
        level = np.bincount(target_of_row, weights=y_row) / np.bincount(target_of_row)
        centred = y_row - level[target_of_row]
        rows_y = np.bincount(text_of_row, weights=centred) / np.bincount(text_of_row)
        tor, n_t, tex = None, 0, np.arange(len(uniq), dtype=np.int64)
        weight = np.ones(len(uniq))
    ds_of_fit_row = ds_of_text[tex]
    oof_text = np.empty(len(uniq))
    for name in sorted(set(d["dataset"])):
        started = time.perf_counter()
        fit_rows = np.flatnonzero(ds_of_fit_row != name)
        alpha, _icpt, beta, _ = _fit(f, fit_rows, tex, tor, n_t, rows_y, weight, config, config.lam)
        held = ds_of_text == name
        oof_text[held] = (f.dense[:, 1:] @ alpha + f.hashed_matvec(beta))[held]
        progress(f"  {target}: held out {name} ({time.perf_counter() - started:.0f} s)")
    score = oof_text[text_of_row]
    per_model = {}
    for t, m in enumerate(models):
        rows = target_of_row == t
        per_model[str(m)] = kendall_tau(score[rows], y_row[rows])
    per_ds = {}
    for name in sorted(set(d["dataset"])):
        taus = []
        for t in range(len(models)):
            rows = (target_of_row == t) & (ds_of_text[text_of_row] == name)
            if rows.sum() >= 20:
                taus.append(kendall_tau(score[rows], y_row[rows]))
        per_ds[name] = float(np.mean(taus))
    return {
        "mean_tau_per_model": float(np.mean(list(per_model.values()))),
        "per_model": per_model,
        "mean_tau_within_dataset": per_ds,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not args.data.is_file():
        print(f"skipped: {args.data} not found (see ../shared/data/README.md)")
        return 0
    sys.path.insert(0, str(ROOT))
    d = load(args.data)
    res = {t: cross_validate(d, t) for t in ("row", "prompt")}
    models = sorted(res["row"]["per_model"])
    print(f"{'model':40s} {'row':>7s} {'prompt':>7s}")
    for m in models:
        print(f"{m[:40]:40s} {res['row']['per_model'][m]:7.3f} {res['prompt']['per_model'][m]:7.3f}")
    print(f"{'mean':40s} {res['row']['mean_tau_per_model']:7.3f} {res['prompt']['mean_tau_per_model']:7.3f}")
    for name in res["row"]["mean_tau_within_dataset"]:
        a, b = res["row"]["mean_tau_within_dataset"][name], res["prompt"]["mean_tau_within_dataset"][name]
        print(f"  within {name:30s} {a:7.3f} {b:7.3f}")
    best = max(res, key=lambda t: res[t]["mean_tau_per_model"])
    print(f"chosen target: {best}")
    if args.json_out:
        args.json_out.write_text(json.dumps({**res, "chosen": best}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
