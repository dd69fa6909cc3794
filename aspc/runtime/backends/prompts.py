"""Plan prompts as model input: plain text, or chat messages through the tokenizer's template.

The plan's ``prompt`` column holds the text, or the chat messages as compact
JSON (``[{"role": ..., "content": ...}, ...]``, as :mod:`aspc.io.prompts`
stores them). Chat prompts go through the tokenizer's chat template with the
generation prompt appended; a tokenizer without a template gets a plain
``role: content`` transcript. Plain text is used as it is.
"""

from __future__ import annotations

from typing import Any

from aspc.emit import schema as S
from aspc.errors import InputError, short_reason
from aspc.io.rows import chat_messages


def parse_chat(prompt: str) -> list[dict[str, str]] | None:
    """The chat messages stored in ``prompt``, or ``None`` if it is plain text.

    Only the compact form ``aspc.io`` stores a chat in counts: a plain-text
    prompt that merely looks like a JSON chat list was run as a chat.
    """
    return chat_messages(prompt)


def render_prompt(prompt: str, tokenizer: Any, prompt_id: str | None = None) -> tuple[str, bool]:
    """The text to tokenize for ``prompt``, and whether a chat template already added special tokens.

    Text from a chat template already holds the model's special tokens, so it
    must be tokenized with ``add_special_tokens=False`` (no second BOS).
    ``prompt_id`` names the prompt in the error below.

    Raises
    ------
    InputError
        The model's chat template failed on the prompt's messages: a template
        that refuses a role (Gemma's and Mistral's ``raise_exception('System
        role not supported')``), or one that does not parse.
    """
    messages = parse_chat(prompt)
    if messages is None:
        return prompt, False
    if getattr(tokenizer, "chat_template", None):
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), True
        except Exception as exc:  # a model's template is code: jinja errors, its own raise_exception, anything
            raise template_error(prompt_id, messages, exc) from None
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: ", False


def template_error(prompt_id: str | None, messages: list[dict[str, str]], exc: Exception) -> InputError:
    """The one-line error for a chat template that failed on ``prompt_id``'s ``messages``.

    Uncaught, the jinja error surfaced as a traceback from the plan check, before anything said which prompt.
    """
    from jinja2 import TemplateSyntaxError  # transformers renders chat templates with jinja2: it is installed

    what = "a chat prompt" if prompt_id is None else f"prompt {prompt_id!r}"
    if isinstance(exc, TemplateSyntaxError):
        where = f" at line {exc.lineno}" if exc.lineno else ""
        return InputError(
            f"{what}: --model's chat template does not parse ({' '.join(str(exc.message).split())[:160]}"
            f"{where}); fix the template (chat_template.jinja, or chat_template in tokenizer_config.json, in the "
            "model directory)"
        )
    roles = ", ".join(dict.fromkeys(str(m.get("role")) for m in messages))
    if any(m.get("role") == "system" for m in messages):  # Gemma's and Mistral's templates take no system turn
        fix = "fold the system message into the first user turn, or fix the template in the model directory"
    else:
        fix = "make the prompt's messages fit what the template accepts, or fix the template in the model directory"
    return InputError(f"{what}: --model's chat template refused its messages (roles {roles}): "
                      f"{short_reason(exc, limit=160)}; {fix}")


def check_prompt_fits(prompt_id: str, n_tokens: int, max_new_tokens: int, limit: int | None, limit_name: str) -> None:
    """Refuse a prompt whose tokens plus ``max_new_tokens`` pass the context ``limit`` (``None``: no limit).

    Past it, generation fails (learned positions: an IndexError), is cut
    short (vLLM), or runs on positions a RoPE model was not trained on
    (transformers only warns); verl asks the same of its rollout's
    ``max_model_len``. An :class:`InputError`: the run stops
    at once rather than retrying the minibatch on another worker.
    """
    if limit is None or n_tokens + max_new_tokens <= limit:
        return
    room = limit - n_tokens
    fix = f"lower --max-new-tokens to {room} or less, or " if room > 0 else ""
    err = InputError(
        f"prompt {prompt_id!r} is {n_tokens} tokens; with --max-new-tokens {max_new_tokens} it needs "
        f"{n_tokens + max_new_tokens} positions, more than {limit_name} {limit}; {fix}drop or shorten the prompt"
    )
    err.context = (n_tokens + max_new_tokens, f"{limit_name} {limit}")  # for callers whose prompt is aspc's own
    raise err


def plan_prompt_tokens(work: Any, tokenizer: Any) -> dict[str, list[int]]:
    """Each distinct prompt of plan ``work`` as token ids, as a backend feeds it to its model.

    A rolling scout's rows repeat their prompt (:func:`aspc.emit.schema.prompt_of`): tokenized once.
    """
    out: dict[str, list[int]] = {}
    for pid, prompt in zip(work.prompt_ids, work.table.column(S.PROMPT).to_pylist(), strict=True):
        pid = S.prompt_of(str(pid))
        if pid not in out:
            text, templated = render_prompt(prompt, tokenizer, pid)
            out[pid] = tokenizer(text, add_special_tokens=not templated)["input_ids"]
    return out


def check_plan_fits(tokens: dict[str, list[int]], max_new_tokens: int, limit: int | None, limit_name: str) -> None:
    """:func:`check_prompt_fits` over a whole plan, before its run log starts: the advice covers every prompt.

    Checked minibatch by minibatch, each fix ("lower --max-new-tokens to N")
    failed again on the next prompt past it, hours into a run.
    """
    if limit is None:
        return
    over = [(len(ids), pid) for pid, ids in tokens.items() if len(ids) + max_new_tokens > limit]
    if not over:
        return
    n, pid = max(over)
    if len(over) == 1:
        check_prompt_fits(pid, n, max_new_tokens, limit, limit_name)
    room = limit - n
    fix = f"lower --max-new-tokens to {room} or less, or " if room > 0 else ""
    raise InputError(
        f"{len(over)} of the plan's prompts need more positions than {limit_name} {limit} with --max-new-tokens "
        f"{max_new_tokens} (the longest, {pid!r}, is {n} tokens); {fix}drop or shorten them"
    )
