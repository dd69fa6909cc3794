"""``aspc compile --history ROLLOUT_DIR`` as a process: matching verl rollout dumps to prompts at scale.

Writes a GSM8K-style dataset in verl's layout (``examples/data_preprocess/gsm8k.py``'s columns) of N
prompts and a ``trainer.rollout_data_dir`` of S samples per prompt in step files of verl's format
(Qwen's chat template with its special tokens removed, as verl's dump decodes the input), then times

    aspc compile gsm8k.parquet --history ROLLOUT_DIR -o plan.parquet --quiet [--tokenizer qwen]

with ``/usr/bin/time -v`` (wall, peak RSS) and checks every prompt was matched (the plan's
``history_prompts_matched``). Without ``--tokenizer`` response tokens are
estimated from bytes; with ``qwen`` they are counted and special-token text is removed from prompts.

    .venv/bin/python benchmarks/verl_history_scale.py [--prompts 20000] [--samples 4] [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aspc.emit.plan import read_plan  # noqa: E402

ASPC = str(Path(sys.executable).with_name("aspc"))
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
CHATML = "system\nYou are a helpful assistant.\nuser\n{user}\nassistant\n"  # Qwen2.5's template, decoded


def write_data(root: Path, n: int, samples: int, per_step: int, seed: int = 0) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)
    users, rows = [], []
    for i in range(n):
        a, b = (int(x) for x in rng.integers(2, 90, size=2))
        q = f"Ann had {a} pens on day {i}. She bought {b} more. How many pens does she have now?"
        users.append(q + " " + INSTRUCTION)
        rows.append({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": users[-1]}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                     "extra_info": {"split": "train", "index": i}})  # fmt: skip
    src = root / "gsm8k.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    dump = root / "rollouts"
    dump.mkdir(exist_ok=True)
    order = rng.permutation(np.repeat(np.arange(n), samples))
    words = rng.lognormal(4.5, 0.8, order.size).astype(int) + 1
    for step, start in enumerate(range(0, order.size, per_step), 1):
        with open(dump / f"{step}.jsonl", "w") as f:
            for i, w in zip(order[start : start + per_step], words[start : start + per_step], strict=True):
                rec = {"input": CHATML.format(user=users[i]), "output": "step " * int(w) + f"#### {i}",
                       "gts": "0", "score": 1.0, "step": step}  # fmt: skip
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return src, dump


def timed(cmd: list[str]) -> tuple[float, int, int]:
    """Wall seconds, peak RSS in KiB and exit code of ``cmd`` under ``/usr/bin/time -v``."""
    res = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", res.stderr)
    h, m, s = wall.groups()
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", res.stderr).group(1))
    if res.returncode:
        print(res.stderr[-2000:], file=sys.stderr)
    return int(h or 0) * 3600 + int(m) * 60 + float(s), rss, res.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=20_000)
    ap.add_argument("--samples", type=int, default=4, help="samples per prompt in the dump")
    ap.add_argument("--per-step", type=int, default=1024 * 4, help="samples per step file")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--data", type=Path, help="keep the generated files here (default: a temporary dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        src, dump = write_data(root, args.prompts, args.samples, args.per_step)
        size = sum(f.stat().st_size for f in dump.iterdir()) / 2**20
        print(f"{args.prompts:,} prompts, {args.prompts * args.samples:,} samples, dump {size:.0f} MiB")
        print("| case | wall best / median s | peak RSS MiB | matched |")
        print("|---|---|---|---|")
        for name, extra in (("bytes", []), ("--tokenizer qwen", ["--tokenizer", "qwen"])):
            plan = root / "plan.parquet"
            cmd = [ASPC, "compile", str(src), "--history", str(dump), "-o", str(plan), "--quiet", *extra]
            runs = [timed(cmd) for _ in range(args.repeat)]
            if any(rc for *_, rc in runs):
                raise SystemExit(f"{name}: aspc compile failed")
            walls = sorted(w for w, _, _ in runs)
            matched = read_plan(plan).predictor.get("history_prompts_matched")
            if matched != args.prompts:  # every prompt has samples in the dump: all must be found
                raise SystemExit(f"{name}: {matched} of {args.prompts} prompts matched their samples")
            print(f"| {name} | {walls[0]:.2f} / {walls[len(walls) // 2]:.2f} | "
                  f"{max(r for _, r, _ in runs) / 1024:.0f} | {matched} |")  # fmt: skip


if __name__ == "__main__":
    main()
