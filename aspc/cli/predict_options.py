"""Options and tables the ``aspc predict`` commands share (``train``, ``eval``, apply)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from aspc.cli.options import read_options
from aspc.errors import ConfigError, InputError

F = Callable[..., Any]

data_options = read_options  # the dataset-reading options every predict command takes


def target_option(fn: F) -> F:
    return click.option(
        "--target",
        default=None,
        help="Target-model head of a multi-model predictor (e.g. 'qwen2.5-7b' for the default); else pooled.",
    )(fn)


def target_field_option(fn: F) -> F:
    return click.option(
        "--target-field",
        default=None,
        metavar="NAME",
        help="Field naming the model that generated each row's lengths (rows of several policies): "
        "train: one head per model; eval: each row scored by its model's head.",
    )(fn)


def plan_option(fn: F) -> F:
    from pathlib import Path

    from aspc.cli.paths import PathArg

    return click.option(
        "--plan",
        type=PathArg(dir_okay=False, path_type=Path),
        default=None,
        help="With a run log DATA: the plan that was run, for prompt texts. [default: RUN/plan.parquet]",
    )(fn)


def device_option(fn: F) -> F:
    return click.option(
        "--device",
        default="auto",
        show_default=True,
        help="Transformer device: auto (NPU > CUDA > CPU), npu, cuda or cpu.",
    )(fn)


def check_device(device: str, predictor: str | None = None) -> None:
    """Fail early on an explicit device that is not there (any kind), before reading data.

    With ``predictor`` (eval, apply) a device given for a predictor that runs on the CPU is refused
    first: "CUDA is not available" hid that the option does not apply at all.
    """
    if device.lower() != "auto" and predictor is not None:
        from aspc.predict import predictor_path, read_metadata

        kind = read_metadata(predictor_path(predictor))["aspc_predictor"]
        if kind != "transformer":
            raise ConfigError(f"--device {device}: a {kind} predictor runs on the CPU with no device to choose; "
                              "drop --device")  # fmt: skip
    if device.lower() != "auto":
        from aspc.devices import resolve_device

        try:
            resolve_device(device)
        except ImportError:
            raise ConfigError(f"--device {device}: torch is not installed; use --device auto") from None


def check_fields(prompt: str, id_: str, length: str, target: str | None, group: str | None) -> None:
    """A target or group field must be a field of its own, not one the pairs are read from."""
    for opt, name in (("--target-field", target), ("--group-field", group)):
        for other_opt, other in (("--prompt-field", prompt), ("--id-field", id_), ("--length-field", length)):
            if name is not None and name == other:
                raise ConfigError(f"{opt} {name!r} is also the {other_opt}; name the field that holds the "
                                  f"{'model' if opt == '--target-field' else 'source'} of each row")  # fmt: skip
    if target is not None and target == group:
        raise ConfigError(f"--target-field and --group-field are both {target!r}; give the source field as "
                          "--group-field")  # fmt: skip


_DATASET_OPTIONS = ("length_field", "prompt_field", "id_field", "on_bad_line")


def check_run_log_options(data: Any) -> None:
    """Refuse the dataset-reading options a run log directory DATA would silently ignore.

    The reverse of "--plan applies to a run log directory, not to a dataset file". They all have
    defaults, so only those given on the command line are refused (click says where a value came from).
    """
    if not data.is_dir():
        return
    ctx = click.get_current_context(silent=True)
    src = click.core.ParameterSource
    given = [n for n in _DATASET_OPTIONS if ctx is not None and ctx.params.get(n) is not None
             and ctx.get_parameter_source(n) not in (src.DEFAULT, src.DEFAULT_MAP)]  # fmt: skip
    if given:
        names = ", ".join("--" + n.replace("_", "-") for n in given)
        verb, it = ("applies", "it") if len(given) == 1 else ("apply", "them")
        raise ConfigError(f"{names} {verb} to a dataset file, not to a run log directory ({data} holds its own "
                          f"lengths and takes prompt texts from its plan); drop {it}")  # fmt: skip


def metrics_table(columns: dict[str, dict[str, Any]], title: str) -> Any:
    from rich.table import Table

    from aspc.cli.render import plain

    rows = [
        ("kendall_tau", "Kendall τ", "{:.3f}"),
        ("spearman", "Spearman ρ", "{:.3f}"),
        ("mae", "MAE (tokens)", "{:.1f}"),
        ("bucket_accuracy", "10-bucket accuracy", "{:.3f}"),
        ("coverage_q10_q90", "q10–q90 coverage", "{:.3f}"),
        ("n", "prompts", "{}"),
    ]
    t = Table(title=plain(title), header_style="bold")  # titles and columns name user files: no markup
    t.add_column("metric")
    for name in columns:
        t.add_column(plain(name), justify="right")
    for key, label, fmt in rows:
        t.add_row(label, *(fmt.format(c[key]) if c.get(key) is not None else "–" for c in columns.values()))
    return t


def per_target_table(per: dict[str, dict[str, Any]], mean: dict[str, float]) -> Any:
    from rich.table import Table

    from aspc.cli.render import plain  # a target is the data's own name: drawn as written, never as markup

    t = Table(title="per target model", header_style="bold")
    for col in ("target", "prompts", "Kendall τ", "MAE (tokens)", "q10–q90 coverage"):
        t.add_column(col, justify="left" if col == "target" else "right")
    def cells(m: dict[str, Any]) -> list[str]:  # "–": a figure these prompts cannot define
        return [_num(m["kendall_tau"], "{:.3f}"), _num(m["mae"], "{:.1f}"), _num(m["coverage_q10_q90"], "{:.3f}")]

    for name, m in per.items():
        t.add_row(plain(name), str(m["n"]), *cells(m))
    t.add_row("mean", "", *cells(mean))
    return t


def _num(v: float | None, fmt: str) -> str:
    return "–" if v is None else fmt.format(v)


def read_pairs(data: Any, **kwargs: Any) -> Any:
    """DATA's (prompt, lengths) pairs, a dataset or a run log directory (``read_training_pairs``'s options)."""
    from aspc.predict.pairs import read_training_pairs

    if not data.exists():
        raise InputError(f"{data}: no such file or run log directory")
    return read_training_pairs(data, **kwargs)
