"""How good must predictions be? asp/random in the RL reference scenario against the predictions' Kendall tau.

The scenario of ``benchmarks/rl_reference.py`` (8 samples per prompt, cap
4,096, W = 8, global batch 256, static returns, the simulator's defaults), on
every model of the CASTILLO ``validate`` split. The predictions are
synthetic: each prompt's true mean length (of its ten recorded lengths,
capped) times ``exp(sigma * z)``, z standard normal (seeded), so that one
knob sets how well they rank; the q10/q50/q90 band around a prediction is the
model's median within-prompt shape (the same ratios for every prompt: no
per-prompt tail is known). sigma = 0 is the true mean itself (the ``oracle``
row of ``rl_reference.py`` up to its per-prompt bands). Prints, per sigma,
the Kendall tau of the predictions against the true means and the mean
iteration time of asp vs random (mean over seeds, then over models; worst
model).

    .venv/bin/python benchmarks/tau_sensitivity.py [--repeats 2] [--sigmas 0,0.3,0.5,0.8,1.2,2]

Skips with a message when the data file is absent.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rl_reference as R  # noqa: E402 - the scenario's constants and inputs

ROLL = "asp+scout+roll"
ROWS = ("asp", ROLL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None,
                    help="comma list of model names or substrings (default: every model of the validate split)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--sigmas", type=R.comma_list(float), default=[0, 0.3, 0.5, 0.65, 0.8, 1.2, 2])
    ap.add_argument("--rows", type=R.comma_list(str), default=["asp"],
                    help=f"strategies to price: a comma list of {', '.join(ROWS)} (default: asp)")
    R.data_option(ap)
    args = ap.parse_args()
    if unknown := [r for r in args.rows if r not in ROWS]:
        R.refuse(f"--rows: unknown row {unknown[0]!r}; use a comma list of {', '.join(ROWS)}")
    args.rows = [r for r in ROWS if r in args.rows]  # the order each repeat computes them in
    if not R.use_data(args.data):
        return
    sys.path.insert(0, str(R.ROOT))
    from aspc.compiler import CompileConfig, compile_plan
    from aspc.io.options import InputOptions
    from aspc.predict import load_predictor
    from aspc.predict.base import LengthPrediction
    from aspc.predict.metrics import kendall_tau
    from aspc.progress import NULL_PROGRESS
    from aspc.rolling_scout import simulate_rolling
    from aspc.runtime import RunConfig, run
    from aspc.scout import scout_tokens, spare_lengths
    from aspc.simulate_inputs import known_lengths

    def rolling(table, pred, actual, cfg, rc) -> float:
        """The rolling scout's mean iteration time with ``pred`` as its text prior."""
        known = known_lengths(actual, table)
        spare = spare_lengths(known, R.N, table.ids)
        return simulate_rolling(table, pred, known, spare, "synthetic", cfg, rc, None, NULL_PROGRESS,
                                scout_tokens(R.CAP), None, meta).summary.mean_iteration_time  # fmt: skip

    meta = getattr(load_predictor("default"), "metadata", {}) or {}

    rows = R.load_rows()
    models = R.pick_models(args.models, rows)
    sigmas = args.sigmas
    taus: dict[float, list[float]] = {s: [] for s in sigmas}
    ratios: dict[tuple[str, float], list[float]] = {(r, s): [] for r in args.rows for s in sigmas}
    print(f"asp/random with synthetic predictions (true mean x lognormal noise), {args.repeats} seeds per model")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for model in models:
            per: dict[float, list[list[float]]] = {s: [] for s in sigmas}
            for seed in range(args.repeats):
                inp, _ = R.inputs_for(model, rows, tmp, seed)
                recs = [json.loads(line) for line in open(inp)]
                table = InputOptions().read(inp)
                byid = {r["id"]: np.asarray(r["lengths"], dtype=float) for r in recs}
                actual = {pid: byid[pid] for pid in table.ids}
                capped = [np.minimum(byid[pid], R.CAP) for pid in table.ids]
                true_mean = np.array([x.mean() for x in capped])
                shape = {q: float(np.median([np.quantile(x, q) / x.mean() for x in capped])) for q in (0.1, 0.5, 0.9)}
                cfg = CompileConfig(samples_per_prompt=R.N, seed=seed, workers=R.W, max_response_length=R.CAP)
                rc = RunConfig(workers=R.W, global_batch=R.GB, seed=seed, max_new_tokens=R.CAP)
                flat = LengthPrediction(*(np.full(len(table), 1.0) for _ in range(4)))
                base = run(compile_plan(table, flat, dataclasses.replace(cfg, strategy="random")),
                           config=rc, actual_lengths=actual).summary.mean_iteration_time
                rng = np.random.default_rng([seed, 11])
                z = rng.standard_normal(len(table))
                for s in sigmas:
                    m = true_mean * np.exp(s * z)
                    pred = LengthPrediction(m, m * shape[0.1], m * shape[0.5], m * shape[0.9])
                    got = [float(kendall_tau(m, true_mean))]
                    if "asp" in args.rows:
                        got.append(run(compile_plan(table, pred, cfg), config=rc,
                                       actual_lengths=actual).summary.mean_iteration_time / base)  # fmt: skip
                    if ROLL in args.rows:
                        got.append(rolling(table, pred, actual, cfg, rc) / base)
                    per[s].append(got)
            cells = []
            for s in sigmas:
                tau, *got = np.mean(per[s], axis=0)
                taus[s].append(float(tau))
                for r, ratio in zip(args.rows, got, strict=True):
                    ratios[(r, s)].append(float(ratio))
                cells.append(f"σ {s:g}: τ {tau:.2f} → " + " / ".join(f"{x:.3f}" for x in got))
            print(f"{model}: " + " | ".join(cells), flush=True)
    print("\n| σ | Kendall τ (mean over models) | " + " | ".join(f"{r} / random (mean) | worst model" for r in args.rows) + " |")
    print("|---|---|" + "---|---|" * len(args.rows))
    for s in sigmas:
        cells = " | ".join(f"{np.mean(ratios[(r, s)]):.3f} | {np.max(ratios[(r, s)]):.3f}" for r in args.rows)
        print(f"| {s:g} | {np.mean(taus[s]):.3f} | {cells} |")


if __name__ == "__main__":
    main()
