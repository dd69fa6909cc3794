"""CPU speed of the static predictor: ``aspc predict`` as a process, and ``predict`` in process.

Trains a static predictor with ``aspc predict train --kind static`` (the shipped
MiniLM distilled; timed too) on 4,000 CASTILLO train rows, then times

    aspc predict pred/ X.jsonl -o preds.parquet

under ``/usr/bin/time -v`` on 10,000 and 100,000 CASTILLO prompts (the
6,764 distinct prompts of ``../shared/data/castillo-dev.parquet``, cycled
with fresh ids: the tokenizer caches nothing, so repeats cost as much as new
prompts) and on one prompt (the process start: imports, predictor load,
reading, writing). Prints prompts/s including and excluding that start, peak
RSS, and the in-process ``StaticPredictor.predict`` rate.

    .venv/bin/python benchmarks/predict_static_speed.py [--pred DIR] [--sizes 10000,100000]

Skips with a message when the data file is absent. Run it on an idle
machine: it prints the load average before timing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data" / "castillo-dev.parquet"


def timed(cmd: list[str]) -> dict:
    """Wall seconds and peak RSS (MB) of ``cmd`` under /usr/bin/time -v; fails loudly on error."""
    res = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stdout}\n{res.stderr}")
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", res.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", res.stderr)
    assert wall and rss, res.stderr
    h, m, s = wall.groups()
    return {"wall_s": int(h or 0) * 3600 + int(m) * 60 + float(s), "peak_rss_mb": int(rss.group(1)) / 1024}


def write_prompts(path: Path, texts: list[str], n: int) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"x{i}", "prompt": texts[i % len(texts)]}) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--pred", type=Path, default=None, help="an existing static predictor (skip training)")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)
    if not args.data.is_file():
        print(f"skipped: {args.data} not found (see ../shared/data/README.md)")
        return 0
    import numpy as np
    import pyarrow.parquet as pq

    aspc = str(Path(sys.executable).with_name("aspc"))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="static-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    d = pq.read_table(args.data, columns=["prompt_text", "output_sizes", "split"]).to_pydict()
    texts = list(dict.fromkeys(d["prompt_text"]))
    print(f"load average before timing: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs; {len(texts)} distinct prompts")
    pred = args.pred
    if pred is None:
        train = [i for i, s in enumerate(d["split"]) if s == "train"]
        rows = np.random.default_rng(0).choice(train, size=min(4000, len(train)), replace=False)
        with open(work / "train.jsonl", "w", encoding="utf-8") as fh:
            for i in sorted(rows):
                fh.write(json.dumps({"id": f"t{i}", "prompt": d["prompt_text"][i], "lengths": d["output_sizes"][i]}) + "\n")
        pred = work / "pred"
        t = timed([aspc, "predict", "train", str(work / "train.jsonl"), "--length-field", "lengths",
                   "--kind", "static", "-o", str(pred), "--quiet"])  # fmt: skip
        size = sum(f.stat().st_size for f in pred.rglob("*") if f.is_file()) / 2**20
        print(f"train (4,000 rows, distillation included): {t['wall_s']:.1f} s wall, peak RSS {t['peak_rss_mb']:.0f} MB; "
              f"directory {size:.1f} MB")  # fmt: skip
    start = timed([aspc, "predict", str(pred), str(write_prompts(work / "one.jsonl", texts, 1)), "-o",
                   str(work / "one.parquet"), "--quiet"])  # fmt: skip
    print(f"process start (1 prompt): {start['wall_s']:.2f} s wall, peak RSS {start['peak_rss_mb']:.0f} MB")
    for n in (int(x) for x in args.sizes.split(",")):
        src = write_prompts(work / f"x{n}.jsonl", texts, n)
        r = timed([aspc, "predict", str(pred), str(src), "-o", str(work / f"x{n}.parquet"), "--quiet"])
        net = max(r["wall_s"] - start["wall_s"], 1e-9)
        print(f"aspc predict, {n:,} prompts: {r['wall_s']:.2f} s wall -> {n / r['wall_s']:,.0f} prompts/s including "
              f"the start, {n / net:,.0f} excluding it; peak RSS {r['peak_rss_mb']:.0f} MB")  # fmt: skip
    sys.path.insert(0, str(ROOT))
    from aspc.predict import load_predictor

    t0 = time.perf_counter()
    p = load_predictor(pred)
    load_s = time.perf_counter() - t0
    big = (texts * (100_000 // len(texts) + 1))[:100_000]
    p.predict(big[:256])
    t0 = time.perf_counter()
    p.predict(big)
    secs = time.perf_counter() - t0
    print(f"in process: load {load_s:.2f} s; predict 100,000 prompts {secs:.2f} s -> {len(big) / secs:,.0f} prompts/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
