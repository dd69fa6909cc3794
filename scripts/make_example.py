"""Derive the bundled example ``examples/prompts.jsonl`` from the CASTILLO data.

Takes a seeded sample of prompts of one model from the ``validate`` split of
``../shared/data/castillo-dev.parquet`` (so the default predictor, trained on
``train``, never saw them) and writes one JSON line per prompt:
``{"id", "prompt", "lengths": [ten sampled response lengths], "dataset"}``.

Data: CASTILLO (Perez et al.), CC-BY-4.0; see examples/README.md.

    python scripts/make_example.py [--n 600] [--model Qwen--Qwen2.5-7B-Instruct-1M]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data" / "castillo-dev.parquet"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=600)
    ap.add_argument("--model", default="Qwen--Qwen2.5-7B-Instruct-1M")
    ap.add_argument("--max-prompt-chars", type=int, default=4000, help="skip very long prompts to keep the file small")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "examples" / "prompts.jsonl")
    args = ap.parse_args()
    if not DATA.exists():
        print("data not found at ../shared/data/castillo-dev.parquet; nothing to do", file=sys.stderr)
        return 1
    if args.output.is_dir() or not args.output.parent.is_dir():
        what = "is a directory" if args.output.is_dir() else f"no directory {args.output.parent}"
        print(f"make_example.py: error: -o {args.output}: {what}", file=sys.stderr)
        return 2
    t = pq.read_table(DATA)
    t = t.filter(pc.equal(t["split"], "validate"))
    if args.model not in set(t["model"].to_pylist()):
        known = ", ".join(sorted(set(t["model"].to_pylist())))
        print(f"make_example.py: error: --model {args.model!r} is not in the data; known models: {known}",
              file=sys.stderr)
        return 2
    t = t.filter(pc.equal(t["model"], args.model))
    t = t.filter(pc.less_equal(pc.utf8_length(t["prompt_text"]), args.max_prompt_chars))
    idx = np.sort(np.random.default_rng(args.seed).choice(t.num_rows, size=min(args.n, t.num_rows), replace=False))
    rows = t.take(idx).to_pylist()
    # Written beside the target and renamed over it: a failure midway leaves the old file, not half a new one.
    tmp = args.output.with_name(f".{args.output.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            for r in rows:
                rec = {"id": r["prompt_id"], "prompt": r["prompt_text"], "lengths": r["output_sizes"],
                       "dataset": r["dataset"]}
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        os.replace(tmp, args.output)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    print(f"wrote {len(rows)} prompts of {args.model} to {shown(args.output)}")
    return 0


def shown(path: Path) -> Path:
    """``path`` relative to the repository where it lies inside it (as before), else as given."""
    try:
        return path.resolve().relative_to(ROOT)
    except ValueError:
        return path


if __name__ == "__main__":
    sys.exit(main())
