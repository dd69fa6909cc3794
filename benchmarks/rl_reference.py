"""The RL reference scenario on prompts never seen: every validate-split model of CASTILLO.

What a GRPO run looks like: 8 samples per prompt, responses capped at 4,096
tokens (verl's ``max_response_length``), W = 8 generation workers, a global
batch of 256 samples, static returns, and the simulator's default cost model
(its trainer is busy 30-50% of the run: see
``aspc/runtime/backends/sim_cost.py``). For each of the 13 models:

- a lexical predictor trained on that model's ``train`` rows (the policy's
  own (prompt, length) pairs; ``--predictors DIR`` reuses DIR/<model>/);
- the model's ``validate`` prompts (never seen by the predictor), each with
  its ten recorded lengths; repeat r draws (seed r) which 8 of the ten the
  samples replay, the other 2 are the ``asp+history`` history;
- strategies: random, sorted, asp, asp+replan, asp+scout (a length scout
  first: one response per prompt cut at 1,024 tokens, replaying the first
  held-out length, :mod:`aspc.scout`; its time is counted), asp+history (2 held-out
  earlier samples per prompt), oracle (asp knowing each prompt's ten recorded
  lengths: the realistic ceiling), oracle-exact (the 8 replayed lengths);
  ``asp e2`` is the second epoch of ``aspc run --epochs`` (planned from the
  first epoch's run log; it replays recorded lengths 9, 10 and 1-6, so 6 of
  its 8 were seen in epoch 1) against random's second epoch on the same
  lengths; ``asp K=k`` is asp under ``--max-staleness k``;
- ``asp+probe``: the product's workflow on a user's own unseen prompts
  (``aspc probe``, then ``aspc predict train --init default``): a seeded
  K = min(4000, 25%) of the model's validate prompts, each with ONE recorded
  length that the repeat does not replay (the first of its 2 held-out ones),
  trains a lexical predictor refit from the shipped default; asp is compiled
  with it for every validate prompt. Its Kendall τ against each prompt's mean
  recorded length is printed beside the table. The shipped default was
  trained on all of the data file, validate split included, so this row's
  predictor has seen these prompts' lengths (of all 13 models);
  ``asp+probe-scratch`` is the same probe trained from scratch (no
  ``--init``): what a user's truly unseen prompts get; ``asp+default`` is
  asp with the shipped default predictor and no probe; ``asp+probe+replan``
  is asp+probe re-planned during the run. ``--default DIR`` replaces the
  shipped default in these rows by the same recipe trained on the ``train``
  split only (``scripts/train_default_predictor.py --splits train --output
  DIR``): then nothing of these prompts was seen, the honest figure.
  ``asp+probe2`` (both held-out lengths of the same K probed prompts: twice
  the probe's generation) and ``asp+probe2-half`` (both lengths of K/2
  prompts: the same generation as asp+probe) run only when named in
  ``--rows``.

``--rows`` limits the run to some rows (random is always run: every ratio
is to it), e.g. ``--rows asp,asp+probe`` for an affordable probe check.

Prints one table per model (mean ± std over the repeats of each ratio to
random) and a summary over the models.

    nice .venv/bin/python benchmarks/rl_reference.py --repeats 3
    nice .venv/bin/python benchmarks/rl_reference.py --models Qwen--Qwen2.5-7B-Instruct-1M --repeats 1
    nice .venv/bin/python benchmarks/rl_reference.py --rows asp,asp+probe --repeats 1
    nice .venv/bin/python benchmarks/rl_reference.py --default DIR --rows asp+default,asp+probe,asp+probe+replan

Skips with a message when the data file is absent.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# One BLAS thread: the per-window ridge refits are small, and a threaded BLAS
# spinning on a loaded machine made them 4x slower.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data" / "castillo-dev.parquet"
N, W, GB, CAP = 8, 8, 256, 4096
STRATS = ["random", "sorted", "asp", "asp+replan", "asp+scout", "oracle", "oracle-exact"]
PROBE_MAX = 4000  # aspc probe's default --prompts
PROBE_SHARE = 0.25  # of the user's prompt set


def load_rows():
    import pyarrow.parquet as pq

    cols = ["model", "split", "prompt_id", "prompt_text", "output_sizes"]
    return pq.read_table(DATA, columns=cols).to_pylist()


def predictor_for(model: str, rows, cache: Path, init: str | None = None) -> Path:
    """The model's own predictor: lexical on its ``train`` rows, from scratch or refit from ``init``."""
    from aspc.predict import train_predictor

    d = cache / (model if init is None else f"{model}--init-{Path(init).name}")
    if (d / "metadata.json").exists():
        return d
    tr = [r for r in rows if r["model"] == model and r["split"] == "train"]
    p = train_predictor(
        "lexical",
        [r["prompt_text"] for r in tr],
        [np.asarray(r["output_sizes"], float) for r in tr],
        seed=0,
        init=init,
    )
    p.save(d)
    return d


def own_tau(pred_dir: Path, model: str, rows) -> float:
    """Kendall tau of the predictor's means against each validate prompt's mean recorded length."""
    from aspc.predict import load_predictor
    from aspc.predict.metrics import kendall_tau

    va = list({r["prompt_id"]: r for r in rows if r["model"] == model and r["split"] == "validate"}.values())
    got = load_predictor(pred_dir).predict([r["prompt_text"] for r in va])
    return float(kendall_tau(got.mean, np.array([np.mean(r["output_sizes"]) for r in va])))


def inputs_for(model: str, rows, tmp: Path, seed: int) -> tuple[Path, Path]:
    """Prompts with their ten lengths in a seeded order (the first 8 are replayed), and the other 2 as history."""
    rng = np.random.default_rng(seed)
    inp, hist = tmp / f"{model}-{seed}.jsonl", tmp / f"{model}-{seed}-hist.jsonl"
    seen = set()
    with open(inp, "w") as fi, open(hist, "w") as fh:
        for r in rows:
            if r["model"] != model or r["split"] != "validate" or r["prompt_id"] in seen:
                continue
            seen.add(r["prompt_id"])
            L = np.asarray(r["output_sizes"])[rng.permutation(len(r["output_sizes"]))].tolist()
            fi.write(json.dumps({"id": r["prompt_id"], "prompt": r["prompt_text"], "lengths": L}) + "\n")
            fh.write(json.dumps({"id": r["prompt_id"], "lengths": L[N:]}) + "\n")
    return inp, hist


def probe_predictor(
    inp: Path,
    tmp: Path,
    model: str,
    seed: int,
    init: str | None = "default",
    default: str = "default",
    samples: int = 1,
    share: float = PROBE_SHARE,
) -> tuple[Path | str, float, float, int]:
    """Train lexical (``--init init``) on one held-out recorded length of a seeded K of the prompts.

    Returns the predictor's directory, its Kendall tau against the mean
    recorded length over every prompt and over the prompts not probed, and K.
    """
    from aspc.predict import load_predictor, train_predictor
    from aspc.predict.metrics import kendall_tau

    recs = [json.loads(line) for line in open(inp)]
    k = min(PROBE_MAX, int(share * len(recs)))
    pick = np.sort(np.random.default_rng([seed, 7]).choice(len(recs), size=k, replace=False))
    if init == "":  # no probe: the default as it is ("not probed" = the same prompts as above)
        d = default
        got = load_predictor(d).predict([r["prompt"] for r in recs])
        means = np.array([np.mean(r["lengths"]) for r in recs])
        rest = np.setdiff1d(np.arange(len(recs)), pick)
        return d, float(kendall_tau(got.mean, means)), float(kendall_tau(got.mean[rest], means[rest])), 0
    # lengths[N] is never replayed by this repeat (inputs_for replays lengths[:N]).
    pred = train_predictor(
        "lexical",
        [recs[i]["prompt"] for i in pick],
        [np.asarray(recs[i]["lengths"][N : N + samples], dtype=float) for i in pick],
        init=init,
        seed=seed,
    )
    d = tmp / f"probe-{model}-{seed}-{'init' if init else 'scratch'}-{samples}-{k}"
    pred.save(d)
    got = load_predictor(d).predict([r["prompt"] for r in recs])
    means = np.array([np.mean(r["lengths"]) for r in recs])
    rest = np.setdiff1d(np.arange(len(recs)), pick)
    return d, float(kendall_tau(got.mean, means)), float(kendall_tau(got.mean[rest], means[rest])), k


def one_repeat(model, rows, pred_dir, tmp, seed, staleness, order="lpt", only=None, default="default", scout_tokens=None):
    from aspc.compiler import CompileConfig, InputOptions, compile_file
    from aspc.epochs import run_epochs
    from aspc.io.history import read_history
    from aspc.runtime import RunConfig, run
    from aspc.simulate import simulate_strategies

    want = (lambda name: True) if only is None else (lambda name: name == "random" or name in only)  # noqa: E731
    inp, hist = inputs_for(model, rows, tmp, seed)
    inputs = InputOptions(length_field="lengths")
    cfg = CompileConfig(
        samples_per_prompt=N, seed=seed, predictor=str(pred_dir), workers=W, max_response_length=CAP, order=order
    )
    rc = RunConfig(workers=W, global_batch=GB, seed=seed, max_new_tokens=CAP)
    strats = [s for s in STRATS if want(s)]
    res = simulate_strategies(
        inp, inputs, cfg, rc, strategies=strats, scout_tokens=scout_tokens if "asp+scout" in strats else None
    )
    out = {k: v.summary.to_dict() for k, v in res.items()}
    for name, init in (("asp+probe", default), ("asp+probe-scratch", None), ("asp+default", "")):
        if want(name) or (name == "asp+probe" and want("asp+probe+replan")):
            pdir, tau, tau_rest, k = probe_predictor(inp, tmp, model, seed, init, default)
            cfg_p = dataclasses.replace(cfg, predictor=str(pdir))
            strategies = ["asp", "asp+replan"] if name == "asp+probe" and want("asp+probe+replan") else ["asp"]
            got = simulate_strategies(inp, inputs, cfg_p, rc, strategies=strategies)
            if want(name):
                out[name] = got["asp"].summary.to_dict()
                out[name].update(_tau=tau, _tau_rest=tau_rest, _k=k)
            if "asp+replan" in got:
                out["asp+probe+replan"] = got["asp+replan"].summary.to_dict()
    # The same probe with both held-out lengths per probed prompt: on the same K prompts (twice the
    # generation), and on K/2 prompts (the same generation as asp+probe).
    for name, share in (("asp+probe2", PROBE_SHARE), ("asp+probe2-half", PROBE_SHARE / 2)):
        if only is not None and want(name):
            pdir, tau, tau_rest, k = probe_predictor(inp, tmp, model, seed, default, default, 2, share)
            cfg_p = dataclasses.replace(cfg, predictor=str(pdir))
            out[name] = simulate_strategies(inp, inputs, cfg_p, rc, strategies=["asp"])["asp"].summary.to_dict()
            out[name].update(_tau=tau, _tau_rest=tau_rest, _k=k)
    if want("asp+history"):
        cfg_h = dataclasses.replace(cfg, history=(str(hist),), history_length_field="lengths")
        out["asp+history"] = simulate_strategies(inp, inputs, cfg_h, rc, strategies=["asp"])["asp"].summary.to_dict()
    if not any(want(x) for x in ("asp e2", *(f"asp K={k}" for k in staleness))):
        return out
    actual = read_history(inp, length_field="lengths")
    plan = compile_file(inp, InputOptions(), cfg)
    for k in staleness:
        if want(f"asp K={k}"):
            out[f"asp K={k}"] = run(
                plan, config=dataclasses.replace(rc, max_staleness=k), actual_lengths=actual
            ).summary.to_dict()
    if want("asp e2"):
        # Second epoch: asp planned from epoch 1's log vs random on the same replayed lengths.
        e = run_epochs(plan, 2, tmp / f"ep-{model}-{seed}", config=rc, actual_lengths=actual, overwrite=True)
        rnd_plan = compile_file(inp, InputOptions(), dataclasses.replace(cfg, strategy="random", seed=seed + 1))
        from aspc.epochs import epoch_lengths

        rnd2 = run(rnd_plan, config=dataclasses.replace(rc, seed=seed + 1), actual_lengths=epoch_lengths(actual, 2, N))
        out["asp e2"] = e.runs[1].summary.to_dict()
        out["asp e2"]["_base"] = rnd2.summary.mean_iteration_time
    return out


def ratio(d, base, key="mean_iteration_time"):
    b = d.get("_base", base[key]) if key == "mean_iteration_time" else base[key]
    return d[key] / b if d.get(key) is not None and b else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None, help="comma list (default: every model of the validate split)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--predictors", default=None, help="directory of per-model predictors (trained here if absent)")
    ap.add_argument("--staleness", default="1,2,4")
    ap.add_argument("--order", choices=["lpt", "interleave"], default="lpt", help="asp's dispatch order")
    ap.add_argument("--scout-tokens", type=int, default=None, help="asp+scout's cut T (default: the cap / 4)")
    ap.add_argument("--rows", default=None, help="comma list of rows to run (default: all; random always runs)")
    ap.add_argument(
        "--default",
        default="default",
        help="predictor for asp+default and the probe's --init: 'default' (shipped, trained on both splits: "
        "in-sample here) or the same recipe on the train split only (scripts/train_default_predictor.py "
        "--splits train --output DIR), the honest figure",
    )
    ap.add_argument(
        "--own-init",
        default=None,
        help="refit each model's own predictor from this predictor (aspc predict train --init DIR: the "
        "product's workflow; use the train-split default above for an honest prior) instead of training "
        "it from scratch on the model's rows alone",
    )
    args = ap.parse_args()
    if not DATA.exists():
        print(f"skipped: {DATA.name} not found under ../shared/data (only on development machines)")
        return
    rows = load_rows()
    models = args.models.split(",") if args.models else sorted({r["model"] for r in rows if r["split"] == "validate"})
    staleness = [int(k) for k in args.staleness.split(",") if k]
    only = set(args.rows.split(",")) if args.rows else None
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        cache = Path(args.predictors) if args.predictors else tmp / "pred"
        summary: dict[str, dict[str, list[float]]] = {}
        own_taus: list[float] = []
        print(
            f"RL reference scenario: n={N} samples/prompt, cap {CAP}, W={W}, global batch {GB}, static returns, "
            f"sim defaults; {args.repeats} repeats (seeds 0..{args.repeats - 1}); ratios = mean ± std vs random"
        )
        for model in models:
            t0 = time.perf_counter()
            pdir = predictor_for(model, rows, cache, args.own_init)
            reps = [
                one_repeat(model, rows, pdir, tmp, s, staleness, args.order, only, args.default, args.scout_tokens)
                for s in range(args.repeats)
            ]
            names = list(reps[0])
            tau = own_tau(pdir, model, rows)
            own_taus.append(tau)
            print(
                f"\n{model} ({reps[0]['random']['samples_planned'] // N} prompts, {time.perf_counter() - t0:.0f} s; "
                f"own predictor Kendall tau {tau:.3f} vs mean length)"
            )
            head = (
                "strategy",
                "mean iter s",
                "vs random",
                "steady vs random",
                "trend q4/q1",
                "trainer busy",
                "lag max",
                "makespan/LB",
            )
            print("| " + " | ".join(head) + " |\n|" + "|".join("---" for _ in head) + "|")
            for name in names:
                ds = [r[name] for r in reps]
                mr = np.array([ratio(d, r["random"]) for d, r in zip(ds, reps, strict=True)])
                sr = np.array([ratio(d, r["random"], "steady_iteration_time") for d, r in zip(ds, reps, strict=True)])
                f = lambda k, ds=ds: np.mean([d[k] for d in ds if d.get(k) is not None])  # noqa: E731
                pm = lambda a: f"{np.nanmean(a):.3f} ± {np.nanstd(a, ddof=1) if a.size > 1 else 0:.3f}"  # noqa: E731
                cells = [
                    name,
                    f"{f('mean_iteration_time'):.3f}",
                    pm(mr),
                    pm(sr),
                    f"{f('iteration_time_trend'):.2f}",
                    f"{1 - f('trainer_wait_fraction'):.0%}",
                    f"{max(d['policy_lag_max'] for d in ds)}",
                    f"{f('makespan_over_lower_bound'):.3f}",
                ]
                print("| " + " | ".join(cells) + " |")
                if "_tau" in ds[0]:
                    s = summary.setdefault(f"_tau {name}", {"ratio": [], "rest": []})
                    s["ratio"].append(float(np.mean([d["_tau"] for d in ds])))
                    s["rest"].append(float(np.mean([d["_tau_rest"] for d in ds])))
                s = summary.setdefault(name, {"ratio": [], "mslb": [], "lag": [], "gap": []})
                s["ratio"].append(float(np.nanmean(mr)))
                s["mslb"].append(float(f("makespan_over_lower_bound")))
                s["lag"].append(max(d["policy_lag_max"] for d in ds))
            for name in (n for n in names if "_tau" in reps[0][n]):
                taus = ", ".join(f"{r[name]['_tau']:.3f}" for r in reps)
                rest = ", ".join(f"{r[name]['_tau_rest']:.3f}" for r in reps)
                print(
                    f"{name}: K={reps[0][name]['_k']} probe pairs, Kendall tau vs mean length {taus} "
                    f"(all prompts), {rest} (prompts not probed)"
                )
            sys.stdout.flush()
        print("\nSummary over models (mean of per-model mean ratios; worst model; makespan/LB mean):")
        print(f"own predictors (asp, asp+replan): mean Kendall tau {np.mean(own_taus):.3f} on the validate prompts")
        taus = {k.split(" ", 1)[1]: summary.pop(k) for k in [k for k in summary if k.startswith("_tau ")]}
        orc = np.array(summary["oracle"]["ratio"]) if "oracle" in summary else np.full(len(models), np.nan)
        print("| strategy | mean vs random | worst model | (random − x)/(random − oracle) | makespan/LB | lag max |")
        print("|---|---|---|---|---|---|")
        for name, s in summary.items():
            r = np.array(s["ratio"])
            gap = np.mean((1 - r) / (1 - orc))
            print(
                f"| {name} | {r.mean():.3f} | {r.max():.3f} | {gap:.2f} | {np.mean(s['mslb']):.3f} | {max(s['lag'])} |"
            )
        for name, t in taus.items():
            print(
                f"{name} predictor: mean Kendall tau {np.mean(t['ratio']):.3f} (all prompts), "
                f"{np.mean(t['rest']):.3f} (not probed) over {len(t['ratio'])} models"
            )


if __name__ == "__main__":
    main()
