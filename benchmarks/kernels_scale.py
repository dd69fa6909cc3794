"""Scale benchmark of the numerical stages: partition, balance, dispatch order.

Run from the repository root::

    .venv/bin/python benchmarks/kernels_scale.py [--n 1000000] [--seed 0]

Times each stage warm (one untimed call first compiles or loads the Numba
cache; the figure is the median of ``--repeat`` timed calls) and prints the
quality figures next to their targets: partition <= 100 ms for 1M prompts;
group imbalance <= 0.001 with >= 16 minibatches per group. Also runs on real
response lengths from ``../shared/data/castillo-dev.parquet`` when that file
exists (CASTILLO, Perez et al., CC-BY-4.0), per-prompt mean of its ten samples.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from aspc.anneal import balance, delivery_drift, dispatch_order
from aspc.partition import padded_cost, partition

BATCH_SIZE = 16
SLACK = 4
GROUP_SIZE = 16  # minibatches per group, as --group-size 16
CASTILLO = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "castillo-dev.parquet"


def timed(fn, repeat):
    fn()  # compile / load cache
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, statistics.median(times)


def run(label: str, lengths: np.ndarray, repeat: int) -> None:
    lengths = np.sort(lengths)
    print(f"\n== {label}: {lengths.size:,} prompts, B={BATCH_SIZE}, slack={SLACK}, group size {GROUP_SIZE}")

    bounds, t_part = timed(lambda: partition(lengths, BATCH_SIZE, SLACK), repeat)
    sizes = np.diff(bounds)
    costs = sizes * lengths[bounds[1:] - 1]
    padding = padded_cost(lengths, bounds) / lengths.sum() - 1
    print(
        f"partition      {t_part * 1e3:8.1f} ms  M={sizes.size:,} minibatches,"
        f" sizes {sizes.min()}..{sizes.max()} (mean {sizes.mean():.2f})"
    )
    print(f"               padding_ratio {padding:.4f}   (target: <= 100 ms)")
    _, t_rem = timed(lambda: partition(lengths[:-3], BATCH_SIZE, 0), repeat)
    print(f"partition δ=0  {t_rem * 1e3:8.1f} ms  (n-3 prompts: remainder table built)")

    n_groups = max(1, sizes.size // GROUP_SIZE)
    res, t_bal = timed(lambda: balance(costs, n_groups, seed=0), repeat)
    card_gap = res.loads.max() / res.cardinality_bound - 1
    lb_kind = "largest minibatch" if res.lower_bound > costs.sum() / n_groups else "mean load"
    print(f"balance        {t_bal * 1e3:8.1f} ms  G={n_groups:,} groups, {res.iterations_run:,} proposals")
    print(
        f"               imbalance {res.imbalance:.2e} vs LB ({lb_kind}); start ({res.init}) {res.init_imbalance:.2e}"
    )
    print(f"               vs cardinality bound {card_gap:.2e}   (target: imbalance <= 1e-3)")

    order, t_ord = timed(lambda: dispatch_order(costs, sizes, res.assignment, n_groups), repeat)
    floor = np.max(np.abs(costs / costs.sum() - sizes / sizes.sum())) / 2
    print(f"dispatch_order {t_ord * 1e3:8.1f} ms")
    print(
        f"               delivery_drift {delivery_drift(costs[order], sizes[order]):.2e}"
        f" (sorted order {delivery_drift(costs, sizes):.3f}; no order below {floor:.2e})"
    )


def castillo_lengths() -> np.ndarray | None:
    if not CASTILLO.exists():
        print(f"\n== castillo: skipped, {CASTILLO.name} not found under ../shared/data/")
        return None
    try:
        import pyarrow.parquet as pq
    except ImportError:
        print("\n== castillo: skipped, pyarrow is not installed")
        return None
    sizes = pq.read_table(CASTILLO, columns=["output_sizes"]).column("output_sizes").to_pylist()
    return np.array([np.mean(s) for s in sizes], dtype=np.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="synthetic prompts (default 1,000,000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic lengths")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per stage (median shown)")
    parser.add_argument(
        "--sigma",
        type=float,
        nargs="+",
        default=[1.0, 0.5],
        help="log-space sigmas of the synthetic lengths; 1.0 is heavy-tailed (default: 1.0 0.5)",
    )
    args = parser.parse_args()
    for sigma in args.sigma:
        lengths = np.random.default_rng(args.seed).lognormal(6.0, sigma, args.n)
        run(f"lognormal(6, {sigma}) seed {args.seed}", lengths, args.repeat)
    real = castillo_lengths()
    if real is not None:
        run("castillo-dev per-row mean output length", real, args.repeat)


if __name__ == "__main__":
    main()
