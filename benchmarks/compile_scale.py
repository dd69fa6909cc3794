"""Compile-time scale benchmark: 1,000,000 prompts with known lengths.

Prints wall time per stage (warm: a first run fills the Numba cache), total
time and peak RSS; then the same on the real CASTILLO lengths when
``../shared/data/castillo-dev.parquet`` exists.

    .venv/bin/python benchmarks/compile_scale.py [--n 1000000] [--batch-size 16] [--slack 4] [--group-size 16]

Targets on a 2-core machine: whole compile <= 2 s warm, peak <= 1.5 GB,
DP <= 100 ms, group makespan <= 1.001 x LB with >= 16 minibatches per group.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aspc.compiler import CompileConfig, compile_plan  # noqa: E402
from aspc.emit import write_plan  # noqa: E402
from aspc.io import PromptTable  # noqa: E402
from aspc.predict.base import LengthPrediction  # noqa: E402

DATA = ROOT / ".." / "shared" / "data" / "castillo-dev.parquet"


class StageTimer:
    """A Progress sink that records wall time per stage."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self._name: str | None = None
        self._t0 = 0.0

    def stage(self, name: str, total: int | None = None) -> None:
        self._close()
        self._name, self._t0 = name, time.perf_counter()

    def advance(self, n: int = 1) -> None:
        pass

    def done(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._name is not None:
            self.times[self._name] = self.times.get(self._name, 0.0) + time.perf_counter() - self._t0
            self._name = None


def make_table(mean: np.ndarray, spread: np.ndarray) -> tuple[PromptTable, LengthPrediction]:
    n = mean.size
    ids = [f"p{i:07d}" for i in range(n)]
    table = PromptTable(
        ids=ids,
        prompts=ids,
        texts=ids,
        source_rows=np.arange(n, dtype=np.int64),
        prompt_tokens=np.full(n, 64, dtype=np.int64),
        lengths=None,
        input_hash="benchmark",
    )
    pred = LengthPrediction(mean=mean, q10=mean / spread, q50=mean, q90=mean * spread)
    return table, pred


def run(label: str, table, pred, cfg: CompileConfig) -> None:
    compile_plan(table, pred, cfg)  # warm-up: JIT + cache
    timer = StageTimer()
    t0 = time.perf_counter()
    plan = compile_plan(table, pred, cfg, progress=timer)
    t_compile = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        t1 = time.perf_counter()
        write_plan(plan, Path(d) / "plan.parquet")
        t_write = time.perf_counter() - t1
    m = plan.metrics
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    stages = "  ".join(f"{k}={v * 1e3:.0f}ms" for k, v in timer.times.items())
    print(f"[{label}] n={table.ids.__len__():,} M={m['n_minibatches']:,} G={m['n_groups']:,}")
    print(f"  stages: {stages}  (rest: metrics + plan table {(t_compile - sum(timer.times.values())) * 1e3:.0f}ms)")
    print(f"  compile total {t_compile:.3f}s warm; parquet write {t_write:.3f}s; peak RSS {peak_gb:.2f} GB")
    print(
        f"  padding_ratio={m['padding_ratio']:.4f} group_imbalance={m['group_imbalance']:.2e} "
        f"(KK start {m.get('init_imbalance', float('nan')):.2e}) delivery_drift={m['delivery_drift']:.4f}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--slack", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--minibatch-cost", choices=["padded", "expected-max"], default="expected-max")
    args = ap.parse_args()
    cfg = CompileConfig(
        batch_size=args.batch_size, slack=args.slack, group_size=args.group_size, minibatch_cost=args.minibatch_cost
    )
    print(f"minibatch cost model: {args.minibatch_cost}")
    rng = np.random.default_rng(0)
    mean = rng.lognormal(5.8, 0.8, size=args.n)
    run("lognormal", *make_table(mean, np.full(args.n, 1.3)), cfg)
    if DATA.exists():
        import pyarrow.parquet as pq

        sizes = pq.read_table(DATA, columns=["output_sizes"]).column("output_sizes").to_pylist()
        arr = np.array([np.mean(s) for s in sizes])
        spread = np.array([max(1.0, np.quantile(s, 0.9) / max(np.mean(s), 1.0)) for s in sizes])
        run("castillo (all rows)", *make_table(arr, spread), cfg)
    else:
        print("castillo data not found at ../shared/data/castillo-dev.parquet: skipped the real-length run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
