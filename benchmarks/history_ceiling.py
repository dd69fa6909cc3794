"""How far history blending can go on CASTILLO: upper bounds for the history rows of predict_quality.

Per model on the ``validate`` split, the same setting as ``predict_quality.py
--kinds history,history-epochs`` (1 earlier sample, target = mean of the
other nine; samples 0 and 1 as two epochs, target = mean of the other
eight), Kendall tau of:

- ``obs only``: the observed lengths alone (log of their mean), no prior;
- ``best w``: ``(1 - w) log prior + w log observed`` with the ``w`` of a grid
  that is best *on validate itself* (per model and mean) — an upper bound for
  any blend of one prior and the observations with one weight, not a method;
- ``shipped``: what ``HistoryPredictor`` gives (empirical-Bayes weight).

The prior is the train-split lexical predictor (``--lexical-cache DIR`` as
saved by ``predict_quality.py``; trained here when absent).

    .venv/bin/python benchmarks/history_ceiling.py --lexical-cache DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GRID = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from predict_quality import DATA, bench_lexical, load, pick, rows_of

    from aspc.predict.history import HistoryPredictor
    from aspc.predict.metrics import kendall_tau

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--lexical-cache", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not args.data.is_file():
        print(f"skipped: {args.data} not found (see ../shared/data/README.md)")
        return 0
    d = load(args.data)
    models = sorted(set(d["model"]))
    _, base = bench_lexical(d, models, args)
    rows = []
    for m in models:
        idx = rows_of(d, "validate", m)
        ids = [str(i) for i in idx]
        texts = pick(d, "prompt_text", idx)
        samples = [np.maximum(s, 1.0) for s in pick(d, "output_sizes", idx)]
        head = base.with_target(m)
        prior = np.log(head.predict(texts).mean)
        row = []
        for k in (1, 2):
            obs = np.log([s[:k].mean() for s in samples])
            target = np.array([s[k:].mean() for s in samples])
            grid = [kendall_tau((1 - w) * prior + w * obs, target) for w in GRID]
            epochs = [{i: s[e : e + 1] for i, s in zip(ids, samples, strict=True)} for e in range(k)]
            hp = HistoryPredictor.from_epochs(head, epochs)
            row += [grid[-1], grid, kendall_tau(hp.predict(texts, ids=ids).mean, target)]
        rows.append(row)
    cols = ("obs only", "best w (on validate)", "shipped")
    print("| model | 1 sample: " + " | ".join(cols) + " | 2 epochs: " + " | ".join(cols) + " |")
    print("|---|---|---|---|---|---|---|")
    for m, r in zip(models, rows, strict=True):
        cells = [r[0], max(r[1]), r[2], r[3], max(r[4]), r[5]]
        print(f"| {m.split('--')[-1]} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    # Mean row: one w for all models (the best on validate), and each model's own best.
    mean_grid = [np.mean([r[j][i] for r in rows]) for j in (1, 4) for i in range(len(GRID))]
    one_w = (max(mean_grid[: len(GRID)]), max(mean_grid[len(GRID) :]))
    own_w = (np.mean([max(r[1]) for r in rows]), np.mean([max(r[4]) for r in rows]))
    means = [np.mean([r[j] for r in rows]) for j in (0, 2, 3, 5)]
    print(f"| **mean** | {means[0]:.3f} | {one_w[0]:.3f} (one w), {own_w[0]:.3f} (per model) | {means[1]:.3f} "
          f"| {means[2]:.3f} | {one_w[1]:.3f} (one w), {own_w[1]:.3f} (per model) | {means[3]:.3f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
