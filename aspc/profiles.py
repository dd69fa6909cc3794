"""Compile profiles for a trainer (``--for verl``) and the prompt selection they imply.

verl's trainer takes ``data.train_batch_size`` prompts per step from a
sequential sampler and drops a trailing incomplete batch (``drop_last=True``).
For each step to be exactly one aspc group, every group must hold the same
number of prompts ``P = B x K`` (minibatch size x minibatches per group), so
the profile fixes ``--slack 0`` and keeps a multiple of ``P`` prompts.

Remainder policy (``drop``): when the prompt count ``n`` is not a multiple
of ``P``, ``n mod P`` prompts (fewer than one trainer step), drawn uniformly at
random with ``--seed``, are left out of this plan and counted in its metrics
(``n_excluded_remainder``). Every kept prompt is then trained on, in plan order,
and verl's ``drop_last`` discards nothing. Compiling the next epoch with
another ``--seed`` leaves out a different handful. (Padding by repeating
prompts would train some twice per epoch; a short last group would be
silently dropped by verl, hiding which prompts it skipped.)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from aspc.caps import TEXT_ONLY, overlong, prompt_token_counts
from aspc.choices import TARGETS
from aspc.errors import ConfigError, InputError
from aspc.io import PromptTable

REMAINDER_POLICY = "drop"


@dataclass
class Selection:
    """Which prompts a plan holds, and how many were left out and why."""

    keep: np.ndarray  # int64 indices into the read table, ascending
    n_overlong: int  # prompts over --max-prompt-length, excluded
    n_remainder: int  # prompts left out so groups hold equal counts (--for verl)
    prompt_tokens_max: int  # largest kept prompt, tokens (by `prompt_count`)
    prompt_tokens_exact: bool  # counted as verl counts them (a tokenizer and its chat template)
    prompt_count: str  # how prompt tokens were counted
    active: bool = True  # False: no prompt limit and no target, nothing was selected (no metrics recorded)

    def metrics(self) -> dict[str, Any]:
        if not self.active:
            return {}
        return {
            "n_excluded_overlong": self.n_overlong,
            "n_excluded_remainder": self.n_remainder,
            "remainder_policy": REMAINDER_POLICY,
            "prompt_tokens_max": self.prompt_tokens_max,
            "prompt_tokens_exact": self.prompt_tokens_exact,
            "prompt_count": self.prompt_count,
        }


def check_target(target: str | None) -> str | None:
    if target is not None and target not in TARGETS:
        raise ConfigError(f"unknown --for {target!r}; use one of {', '.join(TARGETS)}")
    return target


def verl_sizes(config: Any, n: int) -> tuple[int, int]:
    """(B, K) of a config made by :func:`verl_config`, checked against ``n`` prompts."""
    b, k = config.batch_size, config.group_size
    if b is None or k is None:
        raise ValueError("select_prompts(target='verl') needs explicit batch_size and group_size; use verl_config first")
    if b < 1 or k < 1:
        raise ConfigError(f"--batch-size and --group-size must be >= 1, got {b} and {k}")
    if n < b * k:
        raise InputError(
            f"{n} prompts are fewer than one verl trainer step of {b} x {k} = {b * k} prompts; "
            "use a smaller --batch-size or --group-size"
        )
    return b, k


def verl_config(config: Any, default_batch_size: int, default_group_size: int) -> Any:
    """The compile config ``--for verl`` implies: every minibatch exactly B prompts, K per group.

    B and K are made explicit (the compiler's defaults passed in) so its
    small-dataset default for B cannot differ from the sizes the prompt
    selection used.
    """
    if config.groups is not None:
        raise ConfigError("--for verl sizes groups by prompts per trainer step: use --group-size, not --groups")
    if config.slack not in (None, 0):
        raise ConfigError("--for verl needs equal groups: use --slack 0 or leave --slack out")
    if config.minibatch_overhead is not None:
        # Slack 0 leaves the partition one choice (every minibatch B prompts), so κ, which trades
        # minibatch count against padding, cannot change the plan: refused rather than recorded as if used.
        raise ConfigError("--for verl cuts every minibatch at exactly --batch-size prompts, so --minibatch-overhead "
                          "has no effect: drop it")  # fmt: skip
    b = config.batch_size if config.batch_size is not None else default_batch_size
    k = config.group_size if config.group_size is not None else default_group_size
    return dataclasses.replace(config, slack=0, batch_size=b, group_size=k)


def take_rows(table: PromptTable, idx: np.ndarray) -> PromptTable:
    """The prompts at ``idx`` (ascending), every per-prompt field kept aligned."""
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size == len(table):
        return table
    if hasattr(table, "id_array"):  # columnar table: Arrow columns, ragged lengths
        import pyarrow as pa

        at = pa.array(idx)
        return type(table)(
            ids=table.id_array.take(at),
            prompts=table.prompt_array.take(at),
            texts=table.text_array.take(at),
            source_rows=table.source_rows[idx],
            prompt_tokens=table.prompt_tokens[idx],
            lengths=None if table.lengths is None else table.lengths.take(idx),
            input_hash=table.input_hash,
            skipped=table.skipped,
            token_counter=getattr(table, "token_counter", None),
            ids_unique=True,  # ascending rows of a table whose ids are unique
        )
    pick = idx.tolist()
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(table):
        v = getattr(table, f.name)
        if isinstance(v, np.ndarray) and v.shape[:1] == (len(table),):
            changes[f.name] = v[idx]
        elif isinstance(v, list) and len(v) == len(table) and f.name != "skipped":
            changes[f.name] = [v[i] for i in pick]
    return dataclasses.replace(table, **changes)


def select_prompts(table: PromptTable, config: Any, tokenizer: str | Any | None = None) -> Selection:
    """Prompts a plan keeps under ``config``'s prompt limit and target.

    Overlong prompts go first (they would be dropped by the trainer anyway);
    then, for ``--for verl``, the remainder (see the module notes).
    """
    target = check_target(getattr(config, "target", None))
    limit = getattr(config, "max_prompt_length", None)
    counts = None
    if limit is not None or target == "verl":
        counts = prompt_token_counts(table.prompts, table.texts, table.prompt_tokens, tokenizer)
    keep = np.arange(len(table), dtype=np.int64)
    n_over = 0
    if counts is not None and limit is not None:
        over = overlong(counts, limit)
        n_over = int(over.sum())
        keep = keep[~over]
        if keep.size == 0:
            raise InputError(
                f"every prompt is longer than --max-prompt-length {limit} tokens ({counts.how}); raise the limit"
            )
    n_rem = 0
    if target == "verl":
        b, k = verl_sizes(config, int(keep.size))
        n_rem = int(keep.size % (b * k))
        if n_rem:
            rng = np.random.default_rng(config.seed)
            drop = rng.choice(keep.size, size=n_rem, replace=False)
            mask = np.ones(keep.size, dtype=bool)
            mask[drop] = False
            keep = keep[mask]
    if counts is not None:
        tmax, exact, how = int(counts.tokens[keep].max()), counts.exact, counts.how
    else:
        tmax, exact, how = int(np.asarray(table.prompt_tokens)[keep].max()), False, "estimated from UTF-8 bytes"
    return Selection(keep, n_over, n_rem, tmax, exact, how, active=counts is not None)


def overlong_note(metrics: dict[str, Any], config: Any) -> list[str]:
    """The prompts ``--max-prompt-length`` left out, if any (compile and simulate say it alike)."""
    if not metrics.get("n_excluded_overlong"):
        return []
    return [f"left out {metrics['n_excluded_overlong']} prompts over --max-prompt-length {config.max_prompt_length} "
            f"tokens ({metrics.get('prompt_count')})"]  # fmt: skip


def simulate_selection_notes(metrics: dict[str, Any], config: Any) -> list[str]:
    """What ``simulate``'s plans left out of its input: every strategy plans the same prompts."""
    out = overlong_note(metrics, config)
    if metrics.get("n_excluded_remainder"):
        out.append(f"--for verl: left out {metrics['n_excluded_remainder']} remainder prompts, so that every group "
                   f"holds exactly --batch-size x --group-size prompts (policy '{REMAINDER_POLICY}', chosen by --seed)")  # fmt: skip
    return out


def compile_notes(metrics: dict[str, Any], config: Any, predictor: dict[str, Any]) -> list[str]:
    """One line per thing the user should know about prompts left out, caps and verl history."""
    out = overlong_note(metrics, config)
    if (config.max_prompt_length is not None or config.target == "verl") and not metrics.get("prompt_tokens_exact"):
        if metrics.get("prompt_count") == TEXT_ONLY:
            out.append(
                "prompt tokens are counted on the message text alone (the tokenizer has no chat template aspc can "
                "apply), while verl counts the chat template's tokens too, so a kept prompt can be longer in verl; "
                "pass --tokenizer MODEL_DIR with a chat template (and transformers installed) to count them as verl does"
            )
        else:
            out.append(
                "prompt tokens are estimated from bytes and can run 2-3x low for math or code; "
                "pass --tokenizer MODEL_DIR to count them as verl does"
            )
    if config.target == "verl":
        n = metrics.get("n_excluded_remainder", 0)
        per = metrics.get("n_prompts", 0) // max(1, metrics.get("n_groups", 1))
        out.append(
            f"--for verl: {metrics.get('n_groups')} groups of exactly {per} prompts (data.train_batch_size={per}); "
            + (
                f"{n} remainder prompts left out (policy '{REMAINDER_POLICY}', chosen by --seed)"
                if n
                else "no remainder"
            )
        )
    spread = metrics.get("group_samples_range")
    # Only the annealer swaps minibatches to even groups out; the baselines and --order ascending say so above.
    balanced = config.strategy == "asp" and config.order != "ascending"
    if spread and spread[0] != spread[1] and config.target != "verl" and balanced:
        out.append(f"--equal-samples: groups hold {spread[0]}-{spread[1]} samples, as equal as swapping their "
                   "minibatches made them; --for verl makes every group exactly --batch-size x --group-size prompts")  # fmt: skip
    if config.target == "verl" and config.max_response_length is None:
        out.append("responses uncapped: verl stops them at data.max_response_length; pass --max-response-length")
    if "history" in predictor and predictor.get("history_prompts_matched") == 0:
        # The plan is then the predictor's alone, which nothing else would say.
        if predictor.get("history_verl_rollouts"):  # they carry no ids: matched by content, so ids are no advice
            out.append("--history: no prompt of the input is in the verl rollouts, matched by content, so the "
                       "history changed nothing; give the rollout_data_dir of a run on this dataset")  # fmt: skip
        else:
            out.append("--history: none of the input's prompt ids has observed lengths there, so the history "
                       "changed nothing; key its lengths by the input's prompt ids")  # fmt: skip
    for r in predictor.get("history_verl_rollouts", []):
        how = "a tokenizer" if r["counted_with"] == "tokenizer" else "a byte estimate (pass --tokenizer to count exactly)"
        out.append(
            f"verl rollouts: {r['matched']:,} of {r['samples']:,} samples in {r['files']} step files matched "
            f"plan prompts by content; response tokens from {how}"
        )
    return out
