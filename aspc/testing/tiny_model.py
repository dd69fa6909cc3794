"""A tiny randomly initialised causal LM with a character tokenizer, built offline in a second.

For tests, smoke runs and the CPU GRPO example: a real ``LlamaForCausalLM``
(real tokens, real ``generate``, real gradients) small enough that a
minibatch takes milliseconds on a CPU. The tokenizer maps each printable
ASCII character to one token, so its vocabulary is about a hundred tokens: a
random policy emits any given character with probability ~1%, which a few
policy-gradient steps can visibly move.
"""

from __future__ import annotations

import os
from pathlib import Path

from aspc.atomic import atomic_dir

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
# A minimal chat template, so chat prompts exercise the template path.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def char_tokenizer():
    """A ``PreTrainedTokenizerFast``: one token per printable ASCII character (and newline)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(list(SPECIAL_TOKENS) + chars)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def save_tiny_causal_lm(
    path: str | os.PathLike,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    max_positions: int = 1024,
) -> Path:
    """Write a tiny random ``LlamaForCausalLM`` and its character tokenizer to ``path`` (atomically).

    Parameters
    ----------
    path
        Target directory (replaced if it exists).
    seed
        Seeds the random weights: the same seed gives the same model.
    hidden_size, n_layers, n_heads
        Model shape; the defaults give ~0.1M parameters.
    max_positions
        Longest prompt + response the model accepts, tokens.

    Returns
    -------
    Path
        ``path``, now a Hugging Face causal-LM directory usable as ``--model``.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the library never draws on the terminal

    tok = char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_heads,
        max_position_embeddings=max_positions,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    target = Path(path)
    with atomic_dir(target) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return target
