"""The preprint's mechanism on real response lengths (CASTILLO, one model).

Takes the held-out (``validate``) prompts of one model from
``../shared/data/castillo-dev.parquet``, uses ``n`` of each prompt's ten
sampled lengths as the actual lengths of a GRPO-style run (``n`` samples per
prompt), and compiles and simulates it with each strategy:

- ``random``: shuffled fixed-size minibatches (the unscheduled baseline);
- ``sorted``: sorted by predicted length, shortest first (the sorting bubble);
- ``asp``: the project's default text-only predictor + DP + annealed groups;
- ``asp+history``: ``asp`` with the next ``n`` lengths as one earlier epoch of
  observed history;
- ``oracle``: ``asp`` with the actual lengths as predictions.

"steady" columns use the trainer steps that end while minibatches remain to
dispatch (see :mod:`aspc.runtime.record.metrics`); the mean over all steps also
counts the end-of-pass drain, which a few degenerate 10k-token responses
dominate.

    .venv/bin/python benchmarks/simulate_castillo.py
    .venv/bin/python benchmarks/simulate_castillo.py --model Qwen--Qwen2.5-7B-Instruct-1M --samples 4

Skips with a message when the data file is absent.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "castillo-dev.parquet"


def write_inputs(
    tmp: Path, model: str, split: str, n: int, max_prompts: int | None
) -> tuple[Path, Path, int]:
    """The prompts with n actual lengths each, and a history file with the next n."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(DATA, columns=["model", "split", "prompt_id", "prompt_text", "output_sizes"])
    t = t.filter(pc.and_(pc.equal(t["model"], model), pc.equal(t["split"], split)))
    if t.num_rows == 0:
        sys.exit(f"no rows for model {model!r} split {split!r} in {DATA.name}")
    rows = t.to_pylist()[:max_prompts] if max_prompts else t.to_pylist()
    seen = set()
    inp, hist = tmp / "prompts.jsonl", tmp / "history.jsonl"
    with open(inp, "w", encoding="utf-8") as fi, open(hist, "w", encoding="utf-8") as fh:
        for r in rows:
            if r["prompt_id"] in seen:
                continue
            seen.add(r["prompt_id"])
            sizes = r["output_sizes"]
            fi.write(
                json.dumps({"id": r["prompt_id"], "prompt": r["prompt_text"], "lengths": sizes[:n]}) + "\n"
            )
            fh.write(json.dumps({"id": r["prompt_id"], "lengths": sizes[n : 2 * n]}) + "\n")
    return inp, hist, len(seen)


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="meta-llama--Llama-3.1-8B-Instruct")
    ap.add_argument("--split", default="validate", help="validate = prompts the default predictor never saw")
    ap.add_argument("--samples", type=int, default=4, help="samples per prompt (of the ten recorded)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=None, help="prompts per minibatch (compiler default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--return-mode", choices=["static", "continuous"], default="static")
    ap.add_argument("--minibatch-cost", choices=["padded", "expected-max"], default="expected-max")
    ap.add_argument("--predictor", default=None, help="predictor directory (default: the shipped one)")
    ap.add_argument("--max-prompts", type=int, default=None)
    ap.add_argument("--strategies", default="random,sorted,asp,asp+history,oracle")
    args = ap.parse_args()
    if not DATA.exists():
        print(f"skipped: {DATA.name} not found under ../shared/data (only on development machines)")
        return
    if not 1 <= args.samples <= 5:
        sys.exit("--samples must be in 1..5 (the next n of the ten lengths are the history)")

    from aspc.compiler import CompileConfig, InputOptions
    from aspc.runtime import RunConfig
    from aspc.simulate import comparison_table, simulate_strategies

    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        inp, hist, n_prompts = write_inputs(Path(tmp), args.model, args.split, args.samples, args.max_prompts)
        inputs = InputOptions(length_field="lengths")
        config = CompileConfig(
            samples_per_prompt=args.samples,
            seed=args.seed,
            batch_size=args.batch_size,
            predictor=args.predictor,
            workers=args.workers,  # as `aspc simulate` does: makespan-aware dispatch order
            minibatch_cost=args.minibatch_cost,
        )
        run_config = RunConfig(
            workers=args.workers, global_batch=args.global_batch, seed=args.seed, return_mode=args.return_mode
        )
        t0 = time.perf_counter()
        plain = [s for s in names if s != "asp+history"]
        results = simulate_strategies(inp, inputs, config, run_config, strategies=plain) if plain else {}
        if "asp+history" in names:
            cfg_h = dataclasses.replace(config, history=(str(hist),), history_length_field="lengths")
            results["asp+history"] = simulate_strategies(inp, inputs, cfg_h, run_config, strategies=["asp"])[
                "asp"
            ]
        elapsed = time.perf_counter() - t0
    table = comparison_table({k: results[k] for k in names if k in results})

    print(
        f"CASTILLO {args.model}, split {args.split}: {n_prompts} prompts x {args.samples} samples; "
        f"W={args.workers}, global batch {args.global_batch}, seed {args.seed}, {args.return_mode} returns, "
        f"predictor {args.predictor or 'default'} (sim, default cost model)"
    )
    head = (
        "strategy",
        "mean iter s",
        "vs random",
        "steady iter s",
        "vs random",
        "trend q4/q1",
        "trainer wait",
        "lag mean",
        "lag max",
        "makespan/LB",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for name, d in table.items():
        cells = [
            name,
            f"{d['mean_iteration_time']:.3f}",
            _r(d["mean_iteration_time_vs_random"]),
            f"{d['steady_iteration_time']:.3f}",
            _r(d["steady_iteration_time_vs_random"]),
            f"{d['iteration_time_trend']:.3f}",
            f"{d['trainer_wait_fraction']:.1%}",
            f"{d['policy_lag_mean']:.2f}",
            f"{d['policy_lag_max']}",
            f"{d['makespan_over_lower_bound']:.4f}",
        ]
        print("| " + " | ".join(cells) + " |")
    print(f"({elapsed:.1f} s for all strategies)")


if __name__ == "__main__":
    main()
