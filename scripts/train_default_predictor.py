"""Train the lexical predictor shipped as ``aspc/predict/default/``.

Reproducible: the same data and seed give the same weights bit for bit.

    .venv/bin/python scripts/train_default_predictor.py

Data: all of ``../shared/data/castillo-dev.parquet`` (CASTILLO, Perez et al.,
CC-BY-4.0; see that folder's README), both splits: 13 instruction-tuned LLMs,
7 prompt sources, ten sampled response lengths per (prompt, model). Each
(prompt, model) pair is one training row with the model's name as its
*target* (the ``row`` target, chosen over a per-prompt geometric mean by
leave-one-dataset-out cross-validation, ``scripts/cv_default_target.py``;
figures in the README); the text weights are shared and each model gets its
own intercept and level calibration (see ``aspc/predict/lexical.py``).
``aspc compile`` uses the pooled head (no target); ``--target NAME`` picks a
model's head. The prompt's source dataset is the *group* for
leave-one-source-out residuals, so the q10-q90 band is measured on prompt
sources the model has not seen (and widened until every source counts
equally; see ``aspc/predict/calibration.py``).

``--splits train`` trains on the train split only and records the per-model
figures on ``validate`` in ``metadata.json`` under ``validation`` (what
``benchmarks/predict_quality.py`` reports as the default's recipe).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data" / "castillo-dev.parquet"
OUTPUT = ROOT / "aspc" / "predict" / "default"


def load_split(path: Path, splits: set[str]) -> dict[str, list]:
    cols = ["dataset", "model", "prompt_text", "output_sizes", "split"]
    d = pq.read_table(path, columns=cols).to_pydict()
    keep = [i for i, s in enumerate(d["split"]) if s in splits]
    return {k: [d[k][i] for i in keep] for k in cols}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="castillo-dev.parquet")
    ap.add_argument("--output", type=Path, default=OUTPUT, help="predictor directory to write")
    ap.add_argument("--splits", default="train,validate", help="comma-separated splits to train on")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not args.data.is_file():
        print(f"skipped: {args.data} not found (see ../shared/data/README.md)", file=sys.stderr)
        return 0

    sys.path.insert(0, str(ROOT))
    from aspc.predict.lexical import validation_metrics
    from aspc.predict.lexical_train import train_lexical

    splits = set(args.splits.split(","))
    tr = load_split(args.data, splits)
    started = time.perf_counter()
    pred = train_lexical(
        tr["prompt_text"],
        [np.asarray(o, dtype=np.float64) for o in tr["output_sizes"]],
        targets=tr["model"],
        groups=tr["dataset"],
        seed=args.seed,
        validation_split=0.0,
    )
    pred.metadata["training"].update(
        source="CASTILLO (Perez et al.), ../shared/data/castillo-dev.parquet, CC-BY-4.0",
        splits=sorted(splits),
        script="scripts/train_default_predictor.py",
    )
    if "validate" not in splits:
        va = load_split(args.data, {"validate"})
        pred.metadata["validation"] = validation_metrics(
            pred,
            va["prompt_text"],
            [np.asarray(o, dtype=np.float64) for o in va["output_sizes"]],
            va["model"],
        )
        pred.metadata["validation"]["data"] = "castillo-dev validate split, per target model"
    pred.save(args.output)
    size = sum(f.stat().st_size for f in args.output.iterdir())
    v = pred.metadata.get("validation")
    # Trained on the validate split too, there is no held-out figure to print (it said "tau nan").
    held_out = f"validate mean Kendall tau {v['kendall_tau']:.3f}" if v else "no held-out split (validate trained on)"
    print(
        f"wrote {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output} "
        f"({size / 1e6:.2f} MB) in {time.perf_counter() - started:.0f} s; {held_out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
