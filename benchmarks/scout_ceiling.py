"""A scout pass in the first epoch: one sample of every prompt first, the other n-1 planned from it.

The question behind issue 16's first-epoch targets: text predictions rank a
new policy's lengths at Kendall tau 0.2-0.45, while ONE observed sample of a
prompt ranks its mean at ~0.8 (the history column of the README). GRPO draws
n samples per prompt, so a run could generate one sample of every prompt
first (the scout pass, like ``aspc probe --prompts`` over the whole epoch),
then plan the other n - 1 with the scouts as history (``aspc compile
--history``). This benchmark prices that before anything is built for it.

The scenario is ``benchmarks/rl_reference.py``'s (n = 8, cap 4,096, W = 8,
global batch 256, static returns, the simulator's default cost model), on
every model of the CASTILLO validate split, with the same per-model lexical
predictors (``--predictors DIR`` shares their cache). Per model and seed:

- ``random``, ``asp``, ``oracle`` as in ``rl_reference.py`` (8 samples);
- the scout pass: every prompt once (its first replayed length), asp on the
  text predictor, minibatches of ``min(256, ceil(prompts / W))`` sequences
  (a worker's share, at most vLLM's default ``max_num_seqs``: one sample
  per prompt has no sibling to share a long tail with, so scout minibatches
  must be wide to amortise the per-step cost), simulated alone: makespan T1;
- the rest pass: the other 7 replayed lengths, asp on the text predictor
  blended with the scout's length (``HistoryPredictor``), simulated alone;
- ``scout``: (T1 + end of the rest pass's last trainer step) / (end of
  random's last trainer step). Both runs have the same total samples, so
  this is the ratio of mean iteration times with the scouts' samples
  consumed as part of their groups during the rest pass, *if* the trainer
  absorbs those extra steps in its idle time (optimistic: no trainer step
  is taken during the scout pass, since no group is complete);
  ``scout, trainer after``: the same with every extra trainer step the
  scouts' samples need added after the rest pass (pessimistic). The truth
  lies between: the trainer is busy 25-49% of a random run.

The rest pass is planned only once every scout has returned (a barrier: the
workers idle through the scout pass's last minibatch), which a rolling
scheme, scouting window k+1 while window k's rest runs, would avoid.

    nice .venv/bin/python benchmarks/scout_ceiling.py --repeats 2 [--predictors DIR] [--models M1,M2]

Prints one line per model and a mean. Skips with a message when the data
file is absent.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rl_reference as R  # noqa: E402 - the scenario's constants, inputs and per-model predictors

# Widest scout minibatch, sequences: vLLM's default max_num_seqs.
SCOUT_MAX_SEQS = 256


def prompt_table(recs: list[dict], suffix: str):
    from aspc.io.prompts import PromptTable

    texts = [r["prompt"] for r in recs]
    return PromptTable(
        ids=[r["id"] + suffix for r in recs],
        prompts=texts,
        texts=texts,
        source_rows=np.arange(len(recs), dtype=np.int64),
        prompt_tokens=np.array([max(1, len(t.encode()) // 4) for t in texts], dtype=np.int64),
        lengths=None,
        input_hash="scout-ceiling",
    )


def run_pass(table, prediction, cfg, rc, lengths: dict[str, np.ndarray]):
    """Compile ``table`` with asp and simulate it alone; returns the run's summary and step ends."""
    import pyarrow as pa

    from aspc.compiler import compile_plan
    from aspc.emit import schema as S
    from aspc.runtime import run

    plan = compile_plan(table, prediction, cfg, predictor_identity={"kind": "scout-ceiling"})
    t = plan.table
    # Each pass replays its own number of samples per prompt.
    t = t.set_column(
        t.schema.get_field_index(S.N_SAMPLES), S.N_SAMPLES, pa.array(np.full(t.num_rows, cfg.samples_per_prompt), pa.int32())
    )
    return run(t, config=rc, actual_lengths=lengths)


def last_step_end(res) -> float:
    return float(np.max(res.columns["steps"]["end"])) if res.summary.n_trainer_steps else 0.0


def one_repeat(model, rows, pdir, tmp, seed) -> dict[str, float]:
    from aspc.compiler import CompileConfig, InputOptions
    from aspc.predict import load_predictor
    from aspc.predict.history import HistoryPredictor
    from aspc.runtime import RunConfig
    from aspc.simulate import simulate_strategies

    inp, _ = R.inputs_for(model, rows, tmp, seed)
    recs = [json.loads(line) for line in open(inp)]
    cfg = CompileConfig(samples_per_prompt=R.N, seed=seed, predictor=str(pdir), workers=R.W, max_response_length=R.CAP)
    rc = RunConfig(workers=R.W, global_batch=R.GB, seed=seed, max_new_tokens=R.CAP)
    base = simulate_strategies(inp, InputOptions(length_field="lengths"), cfg, rc, strategies=["random", "asp", "oracle"])
    rnd = base["random"]
    pred = load_predictor(pdir)

    scouts = prompt_table(recs, "#scout")
    b_scout = min(SCOUT_MAX_SEQS, -(-len(recs) // R.W))
    cfg1 = dataclasses.replace(cfg, samples_per_prompt=1, batch_size=b_scout, slack=b_scout // 4)
    first = {r["id"] + "#scout": np.asarray(r["lengths"][:1], float) for r in recs}
    p1 = run_pass(scouts, pred.predict(scouts.texts), cfg1, rc, first)

    rest = prompt_table(recs, "#rest")
    seen = {r["id"] + "#rest": np.minimum(np.asarray(r["lengths"][:1], float), R.CAP) for r in recs}
    hist = HistoryPredictor(pred, seen).predict(rest.texts, ids=rest.ids)
    cfg2 = dataclasses.replace(cfg, samples_per_prompt=R.N - 1)
    others = {r["id"] + "#rest": np.asarray(r["lengths"][1 : R.N], float) for r in recs}
    p2 = run_pass(rest, hist, cfg2, rc, others)

    t1, end2, end_r = p1.summary.makespan, last_step_end(p2), last_step_end(rnd)
    steps = p2.columns["steps"]
    step_s = float(np.mean(steps["end"] - steps["start"]))
    extra = rnd.summary.n_trainer_steps - p2.summary.n_trainer_steps
    it = lambda res: res.summary.mean_iteration_time / rnd.summary.mean_iteration_time  # noqa: E731
    return {
        "asp": it(base["asp"]),
        "oracle": it(base["oracle"]),
        "scout pass": t1 / end_r,
        "scout": (t1 + end2) / end_r,
        "scout, trainer after": (t1 + end2 + extra * step_s) / end_r,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None, help="comma list (default: every model of the validate split)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--predictors", default=None, help="directory of per-model predictors (trained here if absent)")
    args = ap.parse_args()
    if not R.DATA.exists():
        print(f"skipped: {R.DATA.name} not found under ../shared/data (only on development machines)")
        return
    rows = R.load_rows()
    models = args.models.split(",") if args.models else sorted({r["model"] for r in rows if r["split"] == "validate"})
    cols = ("asp", "scout pass", "scout", "scout, trainer after", "oracle")
    print(
        f"Scout pass then n-1 from its history: n={R.N}, cap {R.CAP}, W={R.W}, global batch {R.GB}, static returns; "
        f"{args.repeats} repeats; mean iteration time vs random ('scout pass': its makespan over random's run)"
    )
    print("| model | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    means: dict[str, list[float]] = {c: [] for c in cols}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        cache = Path(args.predictors) if args.predictors else tmp / "pred"
        for model in models:
            t0 = time.perf_counter()
            pdir = R.predictor_for(model, rows, cache)
            reps = [one_repeat(model, rows, pdir, tmp, s) for s in range(args.repeats)]
            cells = []
            for c in cols:
                v = np.array([r[c] for r in reps])
                means[c].append(float(v.mean()))
                cells.append(f"{v.mean():.3f}" + (f" ± {v.std(ddof=1):.3f}" if len(v) > 1 else ""))
            print(f"| {model.split('--')[-1]} | " + " | ".join(cells) + f" |  <!-- {time.perf_counter() - t0:.0f} s -->",
                  flush=True)
    print("| **mean** | " + " | ".join(f"**{np.mean(means[c]):.3f}**" for c in cols) + " |")
    worst = max(means["scout"])
    print(f"worst model: scout {worst:.3f}, asp {max(means['asp']):.3f}")


if __name__ == "__main__":
    main()
