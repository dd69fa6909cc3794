"""How much can a run learn about its own prompts? Kendall tau on the rest after a share of them returned.

What re-planning (``asp+replan``) can gain is bounded by how well the lengths
returned so far predict the prompts not yet dispatched. For every model of
the CASTILLO ``validate`` split: the model's own predictor (lexical, refit
from ``--init`` on the model's ``train`` rows, as ``benchmarks/rl_reference.py
--own-init`` makes it), then a seeded random share of the validate prompts
"returns" with the mean of 8 of its sampled lengths (capped at 4,096), and
each learner below is fitted on those prompts and scored on the others
(Kendall tau against the mean of all ten recorded lengths):

- ``plan``: the predictor alone (nothing learned);
- ``ridge λ``: the re-planner's correction (:mod:`aspc.replan`): ridge on the
  prompts' lexical features with the plan's log prediction as offset, at each
  penalty of its grid;
- ``scratch``: a lexical predictor trained on the returned prompts alone;
- ``refit``: the predictor refit on them (``aspc predict train --init``);
- ``static``, with ``--static``: the static predictor (distilled MiniLM) on
  top of the predictor's score (``--kind static --init``), and alone.

The returned share is random here; in a run it is biased toward what the
plan dispatched first. Compare the figures with ``benchmarks/tau_sensitivity.py``
(what asp/random a given tau buys).

    .venv/bin/python benchmarks/replan_ceiling.py --init DIR [--shares 0.1,0.25] [--static]

``DIR``: the train-split default (``scripts/train_default_predictor.py --splits
train --output DIR``). Skips with a message when the data file is absent.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rl_reference as R  # noqa: E402 - the scenario's data and per-model predictors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", required=True, help="prior of the per-model predictors (see above)")
    ap.add_argument("--predictors", default=None, help="cache of per-model predictors (rl_reference's --predictors)")
    ap.add_argument("--models", default=None,
                    help="comma list of model names or substrings (default: every model of the validate split)")
    ap.add_argument("--shares", type=R.comma_list(float), default=[0.1, 0.25])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--static", action="store_true", help="also the static predictor (distils MiniLM: ~1 min)")
    R.data_option(ap)
    args = ap.parse_args()
    if not R.use_data(args.data):
        return
    sys.path.insert(0, str(R.ROOT))
    from aspc.predict import load_predictor, train_predictor
    from aspc.predict.features import FeatureConfig, featurize
    from aspc.predict.metrics import kendall_tau
    from aspc.predict.ridge import ridge_fit
    from aspc.replan import RIDGE_LAMBDAS, used_columns

    rows = R.load_rows()
    models = R.pick_models(args.models, rows)  # before the static distillation: a typo costs no minute
    table = None
    if args.static:
        from aspc.predict.static import StaticConfig
        from aspc.predict.static_train import _distil
        from aspc.progress import NULL_PROGRESS

        table = _distil(None, None, StaticConfig(), NULL_PROGRESS)
    shares = args.shares
    totals: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as t:
        cache = Path(args.predictors) if args.predictors else Path(t)
        for model in models:
            pdir = R.predictor_for(model, rows, cache, args.init)
            va = list({r["prompt_id"]: r for r in rows if r["model"] == model and r["split"] == "validate"}.values())
            texts = [r["prompt_text"] for r in va]
            lens = [np.minimum(np.asarray(r["output_sizes"], dtype=float), R.CAP) for r in va]
            truth = np.array([x.mean() for x in lens])
            y = np.log(np.maximum([x[: R.N].mean() for x in lens], 1.0))
            plan = load_predictor(pdir)
            offset = np.log(np.maximum(plan.predict(texts).mean, 1.0))
            feats = used_columns(featurize(texts, FeatureConfig()).compact())
            for share in shares:
                got = np.random.default_rng([args.seed, int(share * 1000)]).random(len(va)) < share
                o, r = np.nonzero(got)[0], np.nonzero(~got)[0]
                pick = lambda seq, idx: [seq[i] for i in idx]  # noqa: E731
                out = {"plan": kendall_tau(offset[r], truth[r])}
                for lam in RIDGE_LAMBDAS:
                    sol = ridge_fit(feats.take_rows(o), y[o], lam, offset=offset[o], max_iter=60)
                    out[f"ridge {lam:g}"] = kendall_tau(sol.predict(feats.take_rows(r)) + offset[r], truth[r])
                obs_lens = [v[: R.N] for v in pick(lens, o)]
                scratch = train_predictor("lexical", pick(texts, o), obs_lens, seed=args.seed)
                out["scratch"] = kendall_tau(scratch.predict(pick(texts, r)).mean, truth[r])
                refit = train_predictor("lexical", pick(texts, o), obs_lens, seed=args.seed, init=str(pdir))
                out["refit"] = kendall_tau(refit.predict(pick(texts, r)).mean, truth[r])
                if table is not None:
                    from aspc.predict.static_train import train_static

                    for name, init in (("static+plan", plan), ("static alone", None)):
                        p = train_static(pick(texts, o), obs_lens, init=init, table=table, seed=args.seed)
                        out[name] = kendall_tau(p.predict(pick(texts, r)).mean, truth[r])
                print(f"{model} share {share:g} ({len(o)} returned): "
                      + ", ".join(f"{k} {v:.3f}" for k, v in out.items()), flush=True)
                for k, v in out.items():
                    totals.setdefault(f"{share:g}|{k}", []).append(float(v))
    names = list(dict.fromkeys(k.split("|", 1)[1] for k in totals))
    print("\n| returned share | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for share in shares:
        cells = [f"{np.mean(totals[f'{share:g}|{n}']):.3f}" for n in names]
        print(f"| {share:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
