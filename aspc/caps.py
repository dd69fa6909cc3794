"""The length limits a trainer enforces, applied at compile time.

- **Response cap** (``--max-response-length L``; verl's
  ``data.max_response_length``): generation stops at ``L`` tokens, so a
  response's length is ``min(X, L)``. Predictions are capped here, and the
  minibatch cost models integrate only up to ``L`` (``E[min(max, L)]``), so
  balance is measured on the work the trainer will really do.
- **Prompt limit** (``--max-prompt-length P``; verl's ``data.max_prompt_length``
  with ``data.filter_overlong_prompts``): a prompt whose chat-templated token
  count exceeds ``P`` is excluded from the plan, so verl's own filter drops
  nothing and no later batch shifts off its group. Counted as verl counts it
  (``apply_chat_template(add_generation_prompt=True)`` tokens) when a
  tokenizer with a chat template is given; a tokenizer without one counts the
  message text alone (real tokens, yet short of verl's count: not exact, and
  the notes and the export say so); else estimated from UTF-8 bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from aspc import portable_math as pm
from aspc.errors import ConfigError, InputError, short_reason
from aspc.predict.base import LengthPrediction

# z-score of the 90th percentile: q90 = exp(mu + Z90 * sigma) for a lognormal.
_Z90 = 1.2815515655446004


def check_cap(name: str, value: int | None) -> int | None:
    """Validate a token limit option (``None`` = no limit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be a positive number of tokens, got {value!r}")
    return int(value)


def cap_lengths(lengths: Any, cap: int | None) -> Any:
    """Known response lengths as the trainer will see them: each ``min(len, cap)``.

    ``lengths`` is a list of per-prompt arrays or a ragged (values, offsets) container.
    """
    if cap is None:
        return lengths
    if hasattr(lengths, "values") and hasattr(lengths, "offsets"):
        return type(lengths)(np.minimum(lengths.values, float(cap)), lengths.offsets)
    return [np.minimum(x, float(cap)) for x in lengths]


_ERFC = np.frompyfunc(math.erfc, 1, 1)


def _norm_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * _ERFC(-np.asarray(z, dtype=np.float64) / math.sqrt(2.0)).astype(np.float64)


def cap_prediction(pred: LengthPrediction, cap: int | None) -> LengthPrediction:
    """Predictions of ``min(X, cap)``.

    Quantiles commute with ``min``: ``q_p(min(X, L)) = min(q_p(X), L)``
    exactly. The mean does not; it is scaled by the capped fraction of a
    lognormal fitted to (q10, q50, q90), ``E[min(X, L)] / E[X]`` with
    ``E[min(X, L)] = e^(mu + s^2/2) Phi((ln L - mu - s^2)/s) + L (1 - Phi((ln L - mu)/s))``,
    and finally clipped to ``L``. A prompt with no spread is ``min(mean, L)``.
    """
    if cap is None:
        return pred
    L = float(cap)
    q10, q50, q90 = (np.minimum(q, L) for q in (pred.q10, pred.q50, pred.q90))
    mu = pm.log(np.maximum(pred.q50, 1e-9))
    spread = pm.log(np.maximum(pred.q90, 1e-9)) - pm.log(np.maximum(pred.q10, 1e-9))
    sigma = np.clip(spread, 0.0, 20.0) / (2 * _Z90)
    mean = np.minimum(pred.mean, L)
    wide = sigma > 1e-9  # every spread-out prediction has a tail above the cap (for L >> q90 the factor is ~1)
    if wide.any():
        m, s = mu[wide], sigma[wide]
        lnl = math.log(L)
        full = pm.exp(m + s * s / 2)
        capped = full * _norm_cdf((lnl - m - s * s) / s) + L * (1.0 - _norm_cdf((lnl - m) / s))
        mean[wide] = np.minimum(pred.mean[wide] * capped / full, L)
    mean = np.maximum(mean, 1e-9)
    return LengthPrediction(mean=mean, q10=np.minimum(q10, q50), q50=q50, q90=np.maximum(q90, q50))


def cap_for_plan(plan_config: dict[str, Any] | None, cap: int | None) -> int | None:
    """The cap to apply to predictions derived from a plan's: None where the plan's are capped at ``cap`` already.

    :func:`cap_prediction` is not idempotent (each call scales a mean by the
    capped share of its band again), so a planner that starts from a capped
    plan's stored predictions (a scout's blend, a rolling scout's windows)
    must not cap them a second time.
    """
    stored = (plan_config or {}).get("max_response_length")
    return None if cap is not None and stored == cap else cap


# How a tokenizer without a chat template (``--tokenizer qwen``, or a directory without one) counted.
TEXT_ONLY = "tokenizer, message text (no chat template)"


@dataclass
class PromptCounts:
    """Prompt token counts as a trainer measures them."""

    tokens: np.ndarray  # int64 (n,), tokens per prompt
    exact: bool  # True: counted as verl counts them (a tokenizer and its chat template)
    how: str  # human-readable method, for notes and the plan metadata (TEXT_ONLY: a tokenizer, no template)


def _messages(stored: str) -> list[dict[str, str]]:
    """Chat messages of a stored prompt (a text prompt is one user message, as the verl export writes it)."""
    if stored.startswith('[{"role":'):
        try:
            value = json.loads(stored)
        except (json.JSONDecodeError, RecursionError):  # RecursionError: text nesting '[' past Python's parser
            value = None
        if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
            return value
    return [{"role": "user", "content": stored}]


def chat_tokenizer(spec: str | None) -> Any | None:
    """A transformers tokenizer with a chat template for ``spec`` (a directory), else ``None``.

    verl measures a prompt as ``apply_chat_template(messages,
    add_generation_prompt=True)`` tokens, so the template (with any default
    system prompt it adds) counts; only transformers renders templates
    exactly as verl does. Loaded from the local directory only.
    """
    if spec is None or spec == "qwen":
        return None
    from pathlib import Path

    folder = Path(spec)
    has_template = (folder / "chat_template.jinja").is_file()
    if not has_template and (folder / "tokenizer_config.json").is_file():
        try:
            config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
            has_template = isinstance(config, dict) and bool(config.get("chat_template"))
        except (json.JSONDecodeError, UnicodeDecodeError, OSError, RecursionError):  # nested too deep: no template
            has_template = False
    if not has_template:
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # transformers raises many types for a bad directory
        raise ConfigError(f"--tokenizer {folder.name}: cannot load it with transformers ({short_reason(exc, limit=120)})") from None


def prompt_token_counts(
    prompts: list[str], texts: list[str], estimate: np.ndarray, tokenizer: str | Any | None = None
) -> PromptCounts:
    """Tokens of each prompt as verl's ``RLHFDataset`` counts them.

    Parameters
    ----------
    prompts
        Stored prompts (text, or chat messages as compact JSON).
    texts
        Their flattened text (what a tokenizer without a chat template counts).
    estimate
        The byte estimate, used when ``tokenizer`` is ``None``.
    tokenizer
        A tokenizer spec (``aspc.io.tokens``: a directory or ``"qwen"``) or a
        loaded transformers tokenizer. With a chat template: rendered with
        ``add_generation_prompt=True``, then tokens without special ones
        added, exactly verl's ``doc2len``; without one: message text only
        (real tokens, but not ``exact``: verl counts the template too).
    """
    if tokenizer is None:
        return PromptCounts(np.asarray(estimate, dtype=np.int64), False, "estimated from UTF-8 bytes (no --tokenizer)")
    hf = tokenizer if hasattr(tokenizer, "apply_chat_template") else chat_tokenizer(tokenizer)
    if hf is not None and getattr(hf, "chat_template", None):
        try:
            rendered = [hf.apply_chat_template(_messages(p), add_generation_prompt=True, tokenize=False) for p in prompts]
            ids = hf(rendered, add_special_tokens=False, return_attention_mask=False)["input_ids"]
        except Exception as exc:  # a user's template can raise anything (jinja errors, role checks)
            raise InputError(
                f"--tokenizer: its chat template failed on a prompt ({short_reason(exc, limit=120)}); "
                "check the tokenizer matches the model's chat format"
            ) from None
        return PromptCounts(np.array([len(x) for x in ids], dtype=np.int64), True, "chat template + tokenizer")
    from aspc.io.tokens import count_tokens, load_tokenizer

    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    # Not exact: verl counts the chat template's tokens too (for Qwen2.5's ~30 a prompt), so export warns.
    return PromptCounts(np.asarray(count_tokens(tok, texts), dtype=np.int64), False, TEXT_ONLY)


def overlong(counts: PromptCounts, limit: int | None) -> np.ndarray:
    """Boolean mask of prompts over ``limit`` tokens (all False without a limit)."""
    if limit is None:
        return np.zeros(counts.tokens.shape, dtype=bool)
    return counts.tokens > limit
