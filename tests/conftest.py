"""Shared fixtures: small datasets written to tmp paths, and the shared data path."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT / ".." / "shared" / "data" / "castillo-dev.parquet"
EXAMPLE = ROOT / "examples" / "prompts.jsonl"


def write_jsonl(path: Path, records: list) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def invoke_cli(*args: object):
    """``aspc ARGS`` in this process (click's runner): exceptions propagate, so a traceback fails the test."""
    from click.testing import CliRunner

    from aspc.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def one_line_error(result, code: int | None = None) -> str:
    """The single ``Error: ...`` line a refused command printed (asserts the exit code, else any non-zero)."""
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == code if code is not None else result.exit_code != 0, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def lognormal_records(n: int, seed: int = 0, n_lengths: int = 4) -> list[dict]:
    rng = np.random.default_rng(seed)
    mu = rng.normal(5.5, 0.8, size=n)
    return [
        {
            "id": f"p{i:05d}",
            "prompt": f"prompt number {i} " + "word " * int(rng.integers(1, 30)),
            "lengths": [int(max(1, round(x))) for x in rng.lognormal(mu[i], 0.25, size=n_lengths)],
        }
        for i in range(n)
    ]


@pytest.fixture
def small(tmp_path: Path) -> Path:
    """120 prompts with 4 known lengths each (field ``lengths``)."""
    return write_jsonl(tmp_path / "x.jsonl", lognormal_records(120))


@pytest.fixture
def plan(tmp_path: Path, small: Path) -> Path:
    """``small`` compiled with its known lengths."""
    out = tmp_path / "p.parquet"
    r = invoke_cli("compile", small, "--length-field", "lengths", "-o", out, "-q")
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """A 400-prompt JSONL with lists of four sampled lengths per prompt."""
    return write_jsonl(tmp_path / "in.jsonl", lognormal_records(400))


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip("../shared/data/castillo-dev.parquet not present (only on development machines)")
    return SHARED_DATA


def save_tiny_bert(d: Path, words: Sequence[str], chars: str) -> Path:
    """A 2-layer, 32-wide BERT with random weights and a word-piece vocabulary of ``words`` and ``chars``, saved in ``d``.

    Built with the tokenizers library itself: a BertTokenizerFast(vocab_file=...) keeps only the
    special tokens under transformers 5, and every word would be [UNK].
    """
    import torch
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *chars, *("##" + c for c in chars)]
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                                cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")  # fmt: skip
    fast.save_pretrained(str(d))
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(str(d))
    return d


def trainer_failing_at(step: int):
    """The sim trainer, failing at ``step``: a run stops part-way with a resumable log (status failed)."""
    from aspc.runtime.backends.sim_cost import SimCostModel
    from aspc.runtime.trainers.sim import SimTrainer

    trainer = SimTrainer(SimCostModel())  # the class a resume's sim trainer has: another one is refused
    real = trainer.step

    def failing(batch):
        if batch.step == step:
            raise RuntimeError("trainer lost")
        return real(batch)

    trainer.step = failing
    return trainer
