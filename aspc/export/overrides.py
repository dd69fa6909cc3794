"""The verl settings a plan needs, and what to warn a verl user about.

verl keeps the plan's order and batches exactly one group per step only when
it reads rows sequentially (``data.shuffle=False``), its dataloader batch is
the prompts per group (``data.train_batch_size``, with ``data.gen_batch_size``
unset, since the dataloader batches by ``gen_batch_size`` when it is set),
no row is dropped or subsampled (``data.filter_overlong_prompts=False``,
``data.train_max_samples=-1``) and it samples as many responses per prompt as
the plan costed (``actor_rollout_ref.rollout.n``). The length limits are the
plan's caps (``data.max_prompt_length``, ``data.max_response_length``); without
a prompt limit, the longest prompt, plus room for the chat template where a
tokenizer counted the message text alone. Counts other than verl's own
(template) ones are warned about.
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

import numpy as np

from aspc.caps import TEXT_ONLY
from aspc.emit import Plan
from aspc.emit import schema as S
from aspc.io.rows import chat_messages

# Room a plan counted without the chat template leaves for it (no --max-prompt-length): verl counts
# apply_chat_template(add_generation_prompt=True) tokens. Common templates add fewer: Qwen2.5's 21 for its
# default system prompt, 5 a message and 3 for the generation prompt (29 for one message); Llama 3.1's ~34.
TEMPLATE_BASE, TEMPLATE_PER_MESSAGE = 64, 8

# Hydra reads an unquoted value of these characters as that very string, unless it spells a number, a bool or
# null (_TYPED, a superset of Hydra's INT, FLOAT, BOOL and NULL: quoting more is harmless). Anything else (a
# space, a comma Hydra reads as a list, '=', '$', a non-ASCII letter its lexer refuses) is quoted.
_PLAIN = re.compile(r"[A-Za-z0-9_./@%+-]+", re.ASCII)
_TYPED = re.compile(r"[+-]?([\d_.]*(e[+-]?[\d_]*)?|inf|nan)|null|true|false", re.IGNORECASE | re.ASCII)


def _hydra_str(s: str) -> str:
    """``s`` as a Hydra override value that reads back as the string ``s`` once OmegaConf resolves it."""
    if _PLAIN.fullmatch(s) and not _TYPED.fullmatch(s):
        return s
    # OmegaConf resolves ${...} even in a quoted value: \${ is a literal one, and a backslash before it is
    # doubled so that it stays a backslash.
    s = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", s)
    # In '...' Hydra reads \' as a quote and \\ as one backslash, but only before a quote (or the closing one).
    s = re.sub(r"(\\*)('|\Z)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), s)
    return f"'{s}'"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    return _hydra_str(v) if isinstance(v, str) else str(v)


def override_args(overrides: dict[str, Any]) -> list[str]:
    """``key=value`` arguments for verl's Hydra config, one argv element each (a string value Hydra-quoted
    where needed, never shell-quoted: see :func:`shell_line`)."""
    return [f"{k}={_value(v)}" for k, v in overrides.items()]


def shell_line(args: list[str], sep: str = " ") -> str:
    """``args`` for a POSIX shell: each quoted so that the shell passes it as one argument, unchanged."""
    return sep.join(_shell_arg(a) for a in args)


def _shell_arg(arg: str) -> str:
    quoted = shlex.quote(arg)
    # "k='a b'" reads better than shlex's 'k='"'"'a b'"'"'; in "..." only $ ` \ " (and bash's ! history) act.
    if quoted != arg and "'" in arg and not any(c in arg for c in '$`\\"!'):
        return f'"{arg}"'
    return quoted


def verl_settings(plan: Plan, train_file: str, has_data_source: bool) -> tuple[dict[str, Any], list[str]]:
    """(overrides, warnings) for training on ``train_file``, the export of ``plan``."""
    m, cfg = plan.metrics, plan.config
    counts = np.bincount(plan.column(S.GROUP).astype(np.int64)).astype(int).tolist()
    nseq = plan.column(S.N_SAMPLES)
    out: dict[str, Any] = {"data.train_files": train_file, "data.shuffle": False}
    warnings: list[str] = []
    if len(set(counts)) == 1:
        out["data.train_batch_size"] = counts[0]
    else:
        warnings.append(
            f"the plan's {len(counts)} groups hold {min(counts)}-{max(counts)} prompts, so no data.train_batch_size "
            "makes each verl step one group; compile with --for verl"
        )
    out["data.max_prompt_length"], prompt_warning = _prompt_limit(plan)
    # False keeps every row whatever the token counts (verl left-truncates a prompt over the limit: the order
    # stands); with template counts none is over the limit anyway.
    out["data.filter_overlong_prompts"] = False
    out["data.train_max_samples"] = -1
    if np.all(nseq == nseq[0]):
        out["actor_rollout_ref.rollout.n"] = int(nseq[0])
    else:
        warnings.append("rows ask for different n_samples; verl samples one actor_rollout_ref.rollout.n for all")
    cap = m.get("response_cap", cfg.get("max_response_length"))
    if cap is not None:
        out["data.max_response_length"] = int(cap)
    else:
        warnings.append(
            "responses were not capped: verl stops them at data.max_response_length (default 512), so the plan "
            "balanced work verl will not do; compile with --max-response-length"
        )
    if prompt_warning:
        warnings.append(prompt_warning)
    warnings.append(
        "leave data.gen_batch_size unset (or equal to data.train_batch_size): verl's dataloader batches by "
        "gen_batch_size when it is set (dynamic-sampling recipes such as DAPO set it larger), and its batches "
        "would then span groups"
    )
    warnings.append("data.val_files is required by verl and is not scheduled: point it at your validation set")
    if not has_data_source:
        warnings.append(
            "rows have no data_source of their own, so they carry 'aspc', for which verl's default reward "
            "raises NotImplementedError; pass --data-source NAME or set custom_reward_function"
        )
    left = int(m.get("n_excluded_overlong", 0) or 0) + int(m.get("n_excluded_remainder", 0) or 0)
    if left:
        warnings.append(
            f"{left} prompts of the dataset are not in this plan ({m.get('n_excluded_overlong', 0)} over "
            f"--max-prompt-length, {m.get('n_excluded_remainder', 0)} remainder of --for verl)"
        )
    return out, warnings


def _prompt_limit(plan: Plan) -> tuple[int, str | None]:
    """(data.max_prompt_length, the warning its counts need, if any).

    Three kinds of counts: a tokenizer's with its chat template (verl's own count: the limit, else the longest
    prompt), a tokenizer's of the message text alone (``--tokenizer qwen``, or a plain ``--tokenizer DIR``
    compile, which counts no template), and a byte estimate (no tokenizer).
    """
    m = plan.metrics
    limit = plan.config.get("max_prompt_length")
    longest = m.get("prompt_tokens_max")
    if longest is None:
        longest = int(plan.column(S.PROMPT_TOKENS).max())
    value = int(limit) if limit is not None else int(longest)
    if m.get("prompt_tokens_exact") and m.get("prompt_count") != TEXT_ONLY:  # older plans marked TEXT_ONLY exact
        return value, None
    if not plan.token_counter:
        return value, (
            f"prompt tokens were estimated from bytes: a prompt may exceed data.max_prompt_length={value} (verl "
            "then left-truncates it); compile with --tokenizer MODEL_DIR to count as verl does"
        )
    how = "prompt tokens were counted on the message text alone, without the chat template verl counts"
    fix = "a --tokenizer MODEL_DIR that has a chat template (and transformers installed) to count as verl does"
    if limit is not None:
        return value, (f"{how}: a prompt may exceed data.max_prompt_length={value} in verl (which then "
                       f"left-truncates it); compile with {fix}")  # fmt: skip
    n_messages = [1 if c is None else max(1, len(c)) for c in map(chat_messages, plan.column(S.PROMPT).tolist())]
    tokens = plan.column(S.PROMPT_TOKENS).astype(np.int64)
    value = int((tokens + TEMPLATE_BASE + TEMPLATE_PER_MESSAGE * np.asarray(n_messages, dtype=np.int64)).max())
    return value, (f"{how}: data.max_prompt_length={value} allows {TEMPLATE_BASE} tokens a prompt and "
                   f"{TEMPLATE_PER_MESSAGE} a message for it, and verl left-truncates a prompt whose template runs "
                   f"longer; compile with --max-prompt-length and {fix}")  # fmt: skip


def steps(plan: Plan) -> int:
    """Trainer steps one pass over the export takes with the printed batch size."""
    counts = np.bincount(plan.column(S.GROUP).astype(np.int64))
    return int(counts.size) if len(set(counts.tolist())) == 1 else int(math.floor(plan.n_rows / max(1, counts.max())))


def order_notes(counts: list[int]) -> list[str]:
    """What a user of another trainer (``--format jsonl``: OpenRLHF, slime, AReaL) must know to keep the order;
    ``counts``: the plan's prompts per group.

    Each takes a fixed number of prompts per step from a dataloader; whether it can read rows in file order
    is each one's own (README, "Other trainers", with the places in their code).
    """
    notes = [
        "train on the rows in file order, one group per step (prompts per step = a group's prompts, responses per "
        "prompt = n_samples), never shuffled: slime reads in order by default, AReaL with train_dataset.shuffle=false "
        "(and max_head_offpolicyness 0 to keep groups apart; it reads a save_to_disk dataset with chats in "
        "messages, not JSON lines), OpenRLHF's prompt dataloader shuffles in code (README, "
        "Other trainers)"
    ]
    if len(set(counts)) > 1:
        notes.insert(0, f"the plan's {len(counts)} groups hold {min(counts)}-{max(counts)} prompts, so no fixed number "
                        "of prompts per step makes each step one group; compile with --for verl, whose equal groups "
                        "suit any trainer")  # fmt: skip
    return notes
