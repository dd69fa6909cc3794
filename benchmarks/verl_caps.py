"""What verl's length caps do to a plan: the issue-14 figures on the bundled example.

For ``examples/prompts.jsonl`` (600 real prompts), with the shipped predictor
and with the prompts' real recorded lengths:

- the share of predictions above verl's default ``max_response_length`` 512;
- a plan balanced *uncapped*, re-costed with responses capped at 512
  (what verl really generates): its max group load / the capped lower bound;
- the same plan compiled with ``--max-response-length 512``.

    .venv/bin/python benchmarks/verl_caps.py [--cap 512] [-b 15 --group-size 8 -n 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aspc.compiler import CompileConfig, InputOptions, compile_file  # noqa: E402
from aspc.emit import schema as S  # noqa: E402
from aspc.emit.metrics import load_lower_bound, minibatch_starts, table_costs  # noqa: E402


def capped_ratio(plan, cap: float) -> float:
    """Max group load / lower bound of ``plan``'s groups when every response stops at ``cap``."""
    t = plan.table
    costs = table_costs(t, plan.metrics["cost_model"], cap)
    starts = minibatch_starts(t.column(S.MINIBATCH).to_numpy())
    grp = t.column(S.GROUP).to_numpy()[starts[:-1]]
    loads = np.bincount(grp, weights=costs)
    return float(loads.max() / load_lower_bound(costs, np.bincount(grp)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cap", type=int, default=512)
    ap.add_argument("-b", type=int, default=15)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("-n", type=int, default=4)
    a = ap.parse_args()
    src = ROOT / "examples" / "prompts.jsonl"
    for label, inputs in (("predicted", InputOptions()), ("recorded lengths", InputOptions(length_field="lengths"))):
        base = CompileConfig(batch_size=a.b, slack=0, group_size=a.group_size, samples_per_prompt=a.n)
        plain = compile_file(src, inputs, base)
        capped = compile_file(src, inputs, CompileConfig(**{**base.__dict__, "max_response_length": a.cap}))
        pred = plain.table.column(S.PREDICTED_LEN).to_numpy()
        print(f"[{label}] predictions above {a.cap}: {np.mean(pred > a.cap):.1%} of {pred.size}")
        print(f"[{label}] balanced uncapped, costed capped at {a.cap}: max group load = {capped_ratio(plain, a.cap):.4f} x LB")
        print(f"[{label}] compiled with --max-response-length {a.cap}: {1 + capped.metrics['group_imbalance']:.4f} x LB "
              f"(check: {capped_ratio(capped, a.cap):.4f}); max prediction {capped.table.column(S.PREDICTED_LEN).to_numpy().max():.0f}")


if __name__ == "__main__":
    main()
