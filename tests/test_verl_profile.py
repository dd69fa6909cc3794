"""Compile for verl: equal groups with a counted remainder, response caps in predictions and costs, prompt limits."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.caps import cap_prediction, prompt_token_counts
from aspc.cli import main
from aspc.compiler import CompileConfig
from aspc.costs import minibatch_costs
from aspc.emit import read_plan
from aspc.emit import schema as S
from aspc.io import read_prompts
from aspc.predict.base import LengthPrediction
from aspc.profiles import select_prompts
from tests.conftest import EXAMPLE, lognormal_records, write_jsonl
from tests.verl_data import write_gsm8k


def _cli(args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _groups(plan):
    return np.bincount(plan.column(S.GROUP).astype(np.int64)).tolist()


@pytest.mark.parametrize("strategy", ["asp", "sorted", "random"])
def test_for_verl_equal_groups_and_counted_remainder(tmp_path, strategy):
    src = write_jsonl(tmp_path / "in.jsonl", lognormal_records(437, seed=4))
    out = tmp_path / "plan.parquet"
    r = _cli(["compile", src, "--for", "verl", "-b", "8", "--group-size", "4", "--strategy", strategy, "-o", out])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert "21 remainder prompts left out" in err and "data.train_batch_size=32" in err
    plan = read_plan(out)
    assert _groups(plan) == [32] * 13  # 437 = 13 x 32 + 21
    assert plan.metrics["n_excluded_remainder"] == 437 % 32 == 21
    assert plan.metrics["remainder_policy"] == "drop"
    ids = plan.column(S.PROMPT_ID).tolist()
    assert len(set(ids)) == len(ids) == 416
    # Each group is contiguous in dispatch order: verl's sequential batches of 32 are exactly the groups.
    assert plan.column(S.GROUP).tolist() == sorted(plan.column(S.GROUP).tolist())
    assert _cli(["check", out]).exit_code == 0


def test_remainder_is_seeded_and_rotates(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", lognormal_records(100, seed=5))
    kept = {}
    for seed in (0, 0, 1):
        out = tmp_path / f"p{seed}.parquet"
        assert _cli(["compile", src, "--for", "verl", "-b", "4", "--group-size", "4", "--seed", seed, "-o", out, "-q"]).exit_code == 0
        kept.setdefault(seed, []).append(frozenset(read_plan(out).column(S.PROMPT_ID).tolist()))
    assert kept[0][0] == kept[0][1]  # same seed, same prompts
    assert kept[0][0] != kept[1][0] and len(kept[1][0]) == 96


def test_for_verl_bad_options(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", lognormal_records(100, seed=6))
    for extra, words in (
        (["--slack", "2"], "--slack 0"),
        (["--groups", "3"], "--group-size"),
        (["-b", "16", "--group-size", "8"], "fewer than one verl trainer step"),
        (["--max-response-length", "0"], "--max-response-length"),
    ):
        r = _cli(["compile", src, "--for", "verl", *extra, "-o", tmp_path / "x.parquet"])
        assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, (extra, r.output)
        assert not (tmp_path / "x.parquet").exists()


def test_response_cap_on_known_lengths(tmp_path):
    recs = lognormal_records(200, seed=7)
    src = write_jsonl(tmp_path / "in.jsonl", recs)
    for strategy in ("asp", "sorted", "random"):
        out = tmp_path / f"{strategy}.parquet"
        r = _cli(["compile", src, "--length-field", "lengths", "--max-response-length", "300", "--strategy", strategy, "-o", out, "-q"])
        assert r.exit_code == 0, r.output
        plan = read_plan(out)
        by_id = {r["id"]: np.minimum(np.array(r["lengths"], float), 300) for r in recs}
        for pid, mean, q90 in zip(plan.column(S.PROMPT_ID), plan.column(S.PREDICTED_LEN), plan.column(S.PREDICTED_Q90), strict=True):
            assert mean == pytest.approx(by_id[pid].mean()) and q90 <= 300
        assert plan.metrics["response_cap"] == 300
        assert _cli(["check", out]).exit_code == 0  # check recomputes capped costs from the rows


def test_expected_max_cost_is_capped_like_monte_carlo():
    rng = np.random.default_rng(0)
    n = 12
    q50 = rng.uniform(200, 900, n)
    sigma = rng.uniform(0.2, 0.8, n)
    z = 1.2815515655446004
    q10, q90 = q50 * np.exp(-z * sigma), q50 * np.exp(z * sigma)
    mean = q50 * np.exp(sigma**2 / 2)
    nseq = np.full(n, 4.0)
    starts = np.array([0, 4, 8, 12])
    cap = 800.0
    got = minibatch_costs("expected-max", starts, nseq, mean, q10, q50, q90, cap=cap)
    draws = np.minimum(np.exp(np.log(q50)[None, :, None] + sigma[None, :, None] * rng.standard_normal((20000, n, 4))), cap)
    for b in range(3):
        lo, hi = starts[b], starts[b + 1]
        mc = draws[:, lo:hi, :].max(axis=(1, 2)).mean() * nseq[lo:hi].sum()
        assert got[b] == pytest.approx(mc, rel=0.01)
        assert got[b] <= cap * nseq[lo:hi].sum() + 1e-6
    uncapped = minibatch_costs("expected-max", starts, nseq, mean, q10, q50, q90)
    assert np.all(got < uncapped)
    padded = minibatch_costs("padded", starts, nseq, mean, cap=cap)
    assert padded.tolist() == [4 * 4 * min(cap, mean[s:s + 4].max()) for s in (0, 4, 8)]


@settings(max_examples=60, deadline=None)
@given(st.floats(50, 2000), st.floats(0.05, 1.5), st.floats(20, 3000))
def test_cap_prediction_quantiles_exact_mean_matches_lognormal(q50, sigma, cap):
    z = 1.2815515655446004
    pred = LengthPrediction(
        mean=np.array([q50 * np.exp(sigma**2 / 2)]),
        q10=np.array([q50 * np.exp(-z * sigma)]),
        q50=np.array([q50]),
        q90=np.array([q50 * np.exp(z * sigma)]),
    )
    got = cap_prediction(pred, int(cap))
    for q in ("q10", "q50", "q90"):
        assert getattr(got, q)[0] == pytest.approx(min(getattr(pred, q)[0], int(cap)))
    assert 0 < got.mean[0] <= min(pred.mean[0], int(cap)) + 1e-9
    # E[min(X, L)] of the lognormal = integral of its survival function over [0, L] (fine trapezoid).
    from scipy.special import ndtr

    x = np.linspace(1e-9, int(cap), 200001)
    survival = 1.0 - ndtr((np.log(x) - np.log(q50)) / sigma)
    want = float(np.sum((survival[1:] + survival[:-1]) / 2 * np.diff(x)))
    assert got.mean[0] == pytest.approx(want, rel=1e-3)


def test_example_prompts_capped_at_512(tmp_path):
    """The issue's case: 34.8% of the example's predictions exceed 512 uncapped; capped, none does."""
    out = tmp_path / "plan.parquet"
    r = _cli(["compile", EXAMPLE, "--max-response-length", "512", "-o", out, "-q"])
    assert r.exit_code == 0, r.output
    plan = read_plan(out)
    assert plan.column(S.PREDICTED_LEN).max() <= 512 and plan.column(S.PREDICTED_Q90).max() <= 512
    r = _cli(["check", out, "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["response_cap"] == 512


def test_max_prompt_length_estimate_excludes_and_says_so(tmp_path):
    src = write_gsm8k(tmp_path / "g.parquet", 300, long_every=10)
    table = read_prompts(src)
    limit = 200
    over = int((table.prompt_tokens > limit).sum())
    assert 0 < over < 300
    out = tmp_path / "plan.parquet"
    r = _cli(["compile", src, "--max-prompt-length", limit, "-o", out])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert f"left out {over} prompts over --max-prompt-length" in err and "--tokenizer" in err
    plan = read_plan(out)
    assert plan.n_rows == 300 - over and plan.metrics["n_excluded_overlong"] == over
    assert plan.column(S.PROMPT_TOKENS).max() <= limit and plan.metrics["prompt_tokens_exact"] is False
    r = _cli(["compile", src, "--max-prompt-length", "5", "-o", tmp_path / "none.parquet"])
    assert r.exit_code == 2 and "every prompt is longer" in r.output


class _CharChat:
    """A transformers-like tokenizer: one token per character, a ChatML-like template adding 6 tokens per message."""

    chat_template = "chatml-like"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<asst>"

    def __call__(self, texts, add_special_tokens, return_attention_mask):
        assert not add_special_tokens
        return {"input_ids": [list(t) for t in texts]}


def test_prompt_counts_use_the_chat_template(tmp_path):
    src = write_gsm8k(tmp_path / "g.parquet", 64, long_every=8)
    table = read_prompts(src)
    counts = prompt_token_counts(table.prompts, table.texts, table.prompt_tokens, _CharChat())
    want = [len(f"<user>{json.loads(p)[0]['content']}<asst>") for p in table.prompts]
    assert counts.exact and counts.tokens.tolist() == want
    limit = int(np.median(want))
    sel = select_prompts(table, CompileConfig(max_prompt_length=limit, target="verl", batch_size=2, group_size=2), _CharChat())
    kept = counts.tokens[sel.keep]
    assert kept.max() <= limit and sel.n_overlong == int((counts.tokens > limit).sum())
    assert sel.keep.size % 4 == 0 and sel.n_remainder == (64 - sel.n_overlong) % 4
    assert sel.prompt_tokens_max == kept.max() and sel.prompt_tokens_exact


@settings(max_examples=40, deadline=None)
@given(st.integers(8, 300), st.integers(1, 6), st.integers(1, 5), st.integers(0, 3), st.integers(5, 60))
def test_selection_property(n, b, k, seed, limit):
    """Kept prompts: all within the limit, a multiple of B x K, drop count = remainder, deterministic."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 80, size=n)

    class T:
        prompts = [f"p{i}" for i in range(n)]
        texts = prompts
        prompt_tokens = tokens

        def __len__(self):
            return n

    cfg = CompileConfig(target="verl", batch_size=b, group_size=k, max_prompt_length=limit, seed=seed)
    ok = int((tokens <= limit).sum())
    if ok == 0 or ok < b * k:
        return
    sel = select_prompts(T(), cfg)
    assert np.all(tokens[sel.keep] <= limit)
    assert sel.keep.size == ok - ok % (b * k) and sel.n_remainder == ok % (b * k)
    assert np.all(np.diff(sel.keep) > 0)
    assert np.array_equal(select_prompts(T(), cfg).keep, sel.keep)
