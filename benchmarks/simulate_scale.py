"""Simulate a 1,000,000-prompt plan; target <= 30 s on a development machine.

The plan is synthetic (log-normal predicted lengths, random order, fixed-size
minibatches), so the figure measures the runtime alone, not the compiler.
Lengths are drawn from the plan's predictions, as ``aspc run PLAN`` does.

A fresh sim run is played in one compiled call
(:mod:`aspc.runtime.engines.virtual_batch`); ``--event-loop`` also times the
event-by-event loop it mirrors on the same plan, in the same process, and
checks that both give the same summary. The machine's load average is
printed beside the figures: on a shared machine wall time is only comparable
at a similar load.

    .venv/bin/python benchmarks/simulate_scale.py
    .venv/bin/python benchmarks/simulate_scale.py --prompts 1000000 --samples 4 --log --event-loop
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from aspc.runtime import RunConfig, run
from aspc.runtime.config import ReturnMode
from aspc.runtime.engines.virtual import VirtualClockEngine
from aspc.testing.plans import synthetic_plan


def _timed_run(table, cfg, log: bool):
    with tempfile.TemporaryDirectory() as tmp:
        t0, c0 = time.perf_counter(), time.process_time()
        res = run(table, config=cfg, log_dir=Path(tmp) / "RUN" if log else None)
        return res, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=1_000_000)
    ap.add_argument(
        "--batch-size", type=int, default=16, help="prompts per minibatch (the compiler's default)"
    )
    ap.add_argument("--samples", type=int, default=1, help="samples per prompt")
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=1024)
    ap.add_argument("--return-mode", choices=["static", "continuous"], default="static")
    ap.add_argument("--log", action="store_true", help="also write the run log (to a temp dir)")
    ap.add_argument("--event-loop", action="store_true", help="also time the event-by-event loop (the oracle)")
    args = ap.parse_args()

    # Warm the Numba cache on a tiny plan so the figure is steady-state.
    run(synthetic_plan(64, 16), config=RunConfig(workers=2, global_batch=16))

    t0 = time.perf_counter()
    table = synthetic_plan(args.prompts, args.batch_size, n_samples=args.samples, seed=0)
    t_plan = time.perf_counter() - t0
    cfg = RunConfig(
        workers=args.workers, global_batch=args.global_batch, return_mode=ReturnMode(args.return_mode)
    )
    res, t_run, c_run = _timed_run(table, cfg, args.log)
    load = os.getloadavg()[0]
    s = res.summary
    print(
        f"prompts {args.prompts:,}  samples {s.samples_planned:,}  minibatches {s.n_minibatches:,}  "
        f"trainer steps {s.n_trainer_steps:,}  workers {args.workers}  mode {args.return_mode}"
        f"{'  +log' if args.log else ''}"
    )
    print(f"build synthetic plan: {t_plan:6.2f} s (not counted)")
    print(
        f"simulate:             {t_run:6.2f} s wall, {c_run:6.2f} s CPU   target <= 30 s   "
        f"{'OK' if t_run <= 30 else 'MISSED'}   (load {load:.1f})"
    )
    if args.event_loop:
        VirtualClockEngine.one_call = False
        slow, t_slow, c_slow = _timed_run(table, cfg, args.log)
        VirtualClockEngine.one_call = True
        same = slow.summary.to_dict() == s.to_dict()
        print(
            f"event loop:           {t_slow:6.2f} s wall, {c_slow:6.2f} s CPU   "
            f"{t_slow / t_run:.1f}x the one-call run   same summary: {same}   (load {os.getloadavg()[0]:.1f})"
        )
    print(
        f"simulated makespan {s.makespan:,.0f} s, mean iteration {s.mean_iteration_time:.3f} s, "
        f"makespan/LB {s.makespan_over_lower_bound:.4f}"
    )


if __name__ == "__main__":
    main()
