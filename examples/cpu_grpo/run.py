"""End-to-end GRPO on a CPU: compile a plan, generate, train, reload — through ``aspc`` itself.

    python examples/cpu_grpo/run.py [--out examples/out/cpu_grpo] [--prompts 768] [--workers 2]

Steps: (1) write a tiny random LlamaForCausalLM with a character tokenizer
and a JSONL of toy prompts; (2) ``aspc compile`` them into a plan (4 samples
per prompt); (3) ``aspc run --backend hf --trainer
examples.cpu_grpo.trainer:make_trainer``: two generation workers sample, the
GRPO trainer updates the weights after every global batch, and each worker
reloads the newest weights between its minibatches (staggered); (4) print the
reward curve and the per-sample policy lag from the run log.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def write_prompts(path: Path, n: int, length: int, seed: int = 0) -> None:
    """Toy prompts ``"<i> repeat <c>:"``, the letters in rotation, each expecting ``length`` tokens."""
    sys.path.insert(0, str(ROOT))
    from examples.cpu_grpo.trainer import LETTERS

    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            c = LETTERS[(i * 7 + seed) % len(LETTERS)]
            fh.write(json.dumps({"id": f"t{i:04d}", "prompt": f"{i:03d} repeat {c}:", "length": length}) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "examples" / "out" / "cpu_grpo")
    ap.add_argument("--prompts", type=int, default=768)
    ap.add_argument("--samples", type=int, default=4, help="samples per prompt (the GRPO group)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--engine", default="local", choices=["local", "ray"])
    args = ap.parse_args(argv)

    from aspc.testing.tiny_model import save_tiny_causal_lm

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    model = save_tiny_causal_lm(out / "model", seed=0)
    prompts = out / "prompts.jsonl"
    write_prompts(prompts, args.prompts, args.max_new_tokens)
    aspc = [sys.executable, "-m", "aspc.cli"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # Toy responses all run to about --max-new-tokens, so the prompts carry that
    # as their known length; a real workload would use a predictor or --history.
    compiled = subprocess.run([*aspc, "compile", str(prompts), "-o", str(out / "plan.parquet"), "--length-field",
                               "length", "--samples-per-prompt", str(args.samples), "--batch-size", "8", "--quiet"],
                              cwd=ROOT, env=env)  # fmt: skip
    if compiled.returncode != 0:  # aspc said why on stderr, in one line
        return compiled.returncode
    stats = out / "stats.jsonl"
    run = out / "run"
    # --overwrite starts over: a run that stops before its first step must not leave the last run's figures.
    stats.unlink(missing_ok=True)
    done = subprocess.run(
        [*aspc, "run", str(out / "plan.parquet"), "--backend", "hf", "--engine", args.engine, "--model", str(model),
         "--device", "cpu", "--trainer", "examples.cpu_grpo.trainer:make_trainer",
         "--trainer-arg", f"lr={args.lr}", "--trainer-arg", f"stats={stats}",
         "--workers", str(args.workers), "--global-batch", str(args.global_batch),
         "--max-new-tokens", str(args.max_new_tokens), "--temperature", "1.0",
         "--log", str(run), "--overwrite", "--quiet", "--json"],
        cwd=ROOT, env=env, stdout=open(out / "summary.json", "w"),
    )
    if done.returncode != 0:  # aspc said why on stderr, in one line
        return done.returncode
    report(stats, run, out / "summary.json")
    return 0


def report(stats: Path, run: Path, summary: Path) -> None:
    """Print the reward curve (first vs last quarter) and policy lag per sample."""
    import numpy as np
    import pyarrow.dataset as ds

    rows = [json.loads(line) for line in stats.read_text().splitlines() if line.strip()]
    rewards = np.array([r["reward_mean"] for r in rows])
    q = max(1, len(rows) // 4)
    print(f"trainer steps: {len(rows)}")
    for r in rows[:: max(1, len(rows) // 8)]:
        print(f"  step {r['step']:3d}  reward {r['reward_mean']:.3f}  loss {r['loss']:+.4f}  lag {r['lag_mean']:.2f}")
    print(f"mean reward, first quarter of steps: {rewards[:q].mean():.3f}; last quarter: {rewards[-q:].mean():.3f}")
    samples = ds.dataset(str(run / "samples")).to_table(columns=["weights_version", "consumed_step", "policy_lag"])
    lag = samples.column("policy_lag").drop_null().to_numpy()
    print(f"samples: {samples.num_rows}; policy lag per consumed sample: mean {lag.mean():.2f}, max {lag.max()}, "
          f"histogram {dict(zip(*(v.tolist() for v in np.unique(lag, return_counts=True)), strict=True))}")
    mbs = ds.dataset(str(run / "minibatches")).to_table(columns=["worker", "reload", "dispatch_time"])
    print(f"weight reloads: {int(np.sum(mbs.column('reload').to_numpy()))} across "
          f"{len(set(mbs.column('worker').to_pylist()))} workers, each between two of its minibatches")
    s = json.loads(summary.read_text())
    print(f"run: makespan {s['makespan']:.1f} s, mean iteration {s['mean_iteration_time']:.3f} s, "
          f"trainer wait {s['trainer_wait_fraction']:.1%}")


if __name__ == "__main__":
    sys.exit(main())
