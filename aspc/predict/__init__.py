"""Response-length predictors: train, evaluate, load, predict.

Three kinds share one interface (:class:`Predictor`, ``predict(texts) ->
LengthPrediction`` with a mean and q10/q50/q90 per prompt, in tokens):

- ``lexical``: hashed word n-grams and prompt length, ridge on log length;
  NumPy only. The predictor shipped in the package (``"default"``) is one.
- ``transformer``: a small pretrained encoder fine-tuned with regression and
  pinball heads (needs torch and transformers).
- ``static``: that encoder distilled into one vector per vocabulary token and a
  ridge head on their mean: NumPy, Numba and the Rust tokenizer at inference,
  thousands of prompts/s on a CPU (training needs torch once, to distil).
- ``history``: any of the above blended with lengths observed for the same
  prompt id in earlier runs (:class:`HistoryPredictor`).

Importing this package does not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from aspc.choices import PREDICTOR_KINDS
from aspc.errors import ConfigError, PredictorError
from aspc.predict.base import FORMAT_VERSION, MIN_PAIRS, LengthPrediction, Predictor, read_metadata
from aspc.predict.history import HistoryPredictor, blend_history
from aspc.predict.metrics import evaluate
from aspc.progress import NULL_PROGRESS, Progress

__all__ = [
    "FORMAT_VERSION",
    "KINDS",
    "MIN_PAIRS",
    "HistoryPredictor",
    "LengthPrediction",
    "Predictor",
    "blend_history",
    "default_predictor_path",
    "evaluate",
    "load_predictor",
    "predictor_path",
    "train_predictor",
]

KINDS = PREDICTOR_KINDS
"""Kinds that :func:`train_predictor` can train and :func:`load_predictor` can read."""

DEFAULT = "default"


def default_predictor_path() -> Path:
    """Directory of the lexical predictor shipped inside the package."""
    return Path(str(resources.files("aspc.predict") / "default"))


def predictor_path(name: str | Path) -> Path:
    """The directory a predictor name the user gave stands for: the shipped one for ``"default"``.

    Commands call this on the name as given (``--predictor``, ``--init``, ``PREDICTOR``), before
    reading or writing anything: it is the path their outputs must stay out of.

    Raises
    ------
    aspc.errors.ConfigError
        ``"default"`` while the current directory holds a predictor ``default`` (one trained with
        ``-o default``): the name silently meant the shipped predictor, never that directory.
    """
    if str(name) != DEFAULT:
        return Path(name)
    # Only a predictor there is ambiguous (`-o default` made it); any other folder of that name is not one.
    if (Path(DEFAULT) / "metadata.json").is_file():
        raise ConfigError("'default' names the shipped predictor, but ./default is also a directory here; "
                          "pass ./default for that directory, or rename it to use the shipped one")  # fmt: skip
    return default_predictor_path()


def load_predictor(
    path: str | Path,
    *,
    kind: str | None = None,
    target: str | None = None,
    device: str = "auto",
) -> Predictor:
    """Load a predictor directory, or the shipped default with ``"default"``.

    Parameters
    ----------
    path
        A directory written by :meth:`Predictor.save` / ``aspc predict train``,
        or ``"default"``.
    kind
        When given, fail unless the directory holds a predictor of this kind.
    target
        Target model head to answer for (predictors trained with target
        names, such as the default, which knows the 13 CASTILLO models); any
        unique case-insensitive substring works, e.g. ``"qwen2.5-7b"``.
        ``None``: the pooled head.
    device
        For transformer predictors: ``auto`` (NPU > CUDA > CPU), ``npu``,
        ``cuda`` or ``cpu``.

    Raises
    ------
    aspc.errors.PredictorError
        Missing directory, unknown or mismatched kind, other format version,
        corrupt weights.
    """
    name = str(path)
    directory = default_predictor_path() if name == DEFAULT else Path(path)
    meta = read_metadata(directory, kind=kind)
    found = meta["aspc_predictor"]
    if found == "lexical":
        from aspc.predict.lexical import LexicalPredictor

        pred: Predictor = LexicalPredictor.load(directory, target=target)
    elif found == "transformer":
        from aspc.predict.transformer import TransformerPredictor

        pred = TransformerPredictor.load(directory, target=target, device=device)
    elif found == "static":
        from aspc.predict.static import StaticPredictor

        pred = StaticPredictor.load(directory, target=target)
    else:
        raise PredictorError(
            f"{directory}: unknown predictor kind {found!r}; this aspc reads {', '.join(KINDS)}"
        )
    from aspc.predict.ease import marginal_range

    try:
        marginal_range(pred.metadata)
    except PredictorError as exc:
        raise PredictorError(f"{directory}: {exc}") from None
    pred.metadata["name"] = DEFAULT if name == DEFAULT else directory.name
    return pred


def train_predictor(
    kind: str,
    texts: Sequence[str],
    lengths: Sequence[Any],
    *,
    targets: Sequence[str] | None = None,
    groups: Sequence[str] | None = None,
    seed: int = 0,
    validation_split: float = 0.1,
    base_model: str | None = None,
    device: str = "auto",
    epochs: int | None = None,
    freeze_encoder: bool = False,
    init: str | Path | Predictor | None = None,
    static_prior: bool = True,
    progress: Progress = NULL_PROGRESS,
) -> Predictor:
    """Train a predictor of ``kind`` on (prompt text, observed lengths) pairs.

    Parameters
    ----------
    kind
        ``lexical``, ``transformer`` or ``static``.
    texts
        Prompt texts.
    lengths
        Per prompt, one observed length or an array of sampled lengths (tokens).
    targets
        Optional name of the LLM that produced each prompt's lengths.
    groups
        Optional source of each prompt (lexical: leave-one-source-out residuals
        for the quantile band).
    seed
        Same seed, data and kind give the same predictor (lexical: bit for bit;
        transformer: up to non-deterministic kernels on accelerators).
    validation_split
        Fraction of distinct prompts held out; their metrics go to the metadata.
    base_model, device, epochs, freeze_encoder
        Transformer settings (rejected when set for lexical; static takes
        ``base_model``, the encoder it distils).
    init
        Refit from this predictor (a directory, ``"default"``, or a loaded
        predictor of the same kind) instead of starting from scratch: lexical
        fits a penalised correction of its weights
        (:mod:`aspc.predict.lexical_train`), transformer fine-tunes its weights;
        static takes a static predictor (refits its head), a transformer one
        (distils its fine-tuned encoder) or a lexical one (a fixed offset).
    static_prior
        Static: fit the head on top of the shipped default's text score (a
        fixed offset) unless ``init`` brings its own. On CASTILLO validate this
        ranked at least as well as the lexical predictor alone (README, Length
        prediction); ``False``: the static head alone.
    progress
        Progress sink (the CLI passes a rich bar).

    Returns
    -------
    Predictor
        Not yet saved; call ``.save(directory)``.
    """
    if not static_prior and kind != "static":
        raise ConfigError("--no-prior applies to --kind static only")
    check_kind_options(kind, base_model=base_model, device=device, epochs=epochs, freeze_encoder=freeze_encoder)
    if kind == "lexical":
        from aspc.predict.lexical_train import train_lexical

        return train_lexical(
            texts,
            lengths,
            targets=targets,
            groups=groups,
            init=_init_predictor(init, "lexical", device),
            seed=seed,
            validation_split=validation_split,
            progress=progress,
        )
    if kind == "transformer":
        from aspc.predict.transformer import TransformerConfig
        from aspc.predict.transformer_train import train_transformer

        config = TransformerConfig(base_model=base_model, freeze_encoder=freeze_encoder, epochs=epochs)
        return train_transformer(
            texts,
            lengths,
            targets=targets,
            config=config,
            init=_init_predictor(init, "transformer", device),
            device=device,
            seed=seed,
            validation_split=validation_split,
            progress=progress,
        )
    if kind == "static":
        from aspc.predict.static_train import train_static

        start = _init_predictor(init, init_kinds("static"), device)
        init_kind = getattr(start, "kind", None)
        if not static_prior and init_kind in ("lexical", "static"):
            # Refused, not honoured: a lexical init is used only as the offset the head fits on top of
            # (without it the init would do nothing), and a static init's head weights, the refit's
            # starting point, were fitted on top of its prior (they mean nothing without it). A
            # transformer init brings an encoder only, so --no-prior applies to it as to a fresh fit.
            raise ConfigError(f"--no-prior does not apply with a {init_kind} --init: a static refit keeps its init's "
                              "text-score offset, and a lexical --init is that offset; drop --no-prior, or drop "
                              "--init to fit the static head alone")  # fmt: skip
        prior = load_predictor(DEFAULT) if static_prior and init_kind in (None, "transformer") else None
        return train_static(
            texts,
            lengths,
            targets=targets,
            groups=groups,
            base_model=base_model,
            init=start,
            prior=prior,
            seed=seed,
            validation_split=validation_split,
            progress=progress,
        )
    raise ConfigError(f"unknown predictor kind {kind!r}; use one of {', '.join(KINDS)}")


def check_kind_options(
    kind: str, *, base_model: object = None, device: str | None = "auto", epochs: object = None,
    freeze_encoder: bool = False,
) -> None:
    """Refuse the training settings ``kind`` does not read (the CLI calls it before checking the device
    itself, so that ``--device cuda`` with lexical names the real problem, not a missing CUDA)."""
    if kind in ("lexical", "static") and (freeze_encoder or epochs is not None):
        raise ConfigError("--epochs and --freeze-encoder apply to --kind transformer only")
    if kind == "lexical" and base_model is not None:
        # static distils the encoder --base-model names: the option is not the transformer's alone.
        raise ConfigError("--base-model applies to --kind transformer and static (the encoder they start from); "
                          "drop it, or use --kind transformer or static")  # fmt: skip
    if kind == "lexical" and device not in (None, "auto"):
        raise ConfigError(f"--device {device}: the lexical predictor trains on the CPU with no device to "
                          "choose; drop --device, or use --kind transformer or static")  # fmt: skip


def _init_predictor(init: str | Path | Predictor | None, kind: str | tuple[str, ...], device: str) -> Any:
    """The predictor a refit starts from, checked to be of ``kind`` (or one of several)."""
    kinds = (kind,) if isinstance(kind, str) else kind
    if init is None:
        return None
    if isinstance(init, Predictor):
        pred = init
    else:
        from aspc.errors import PredictorError

        try:
            pred = load_predictor(init, device=device) if "transformer" in kinds else load_predictor(init)
        except PredictorError as exc:
            raise ConfigError(f"--init: {exc}") from None
    check_init_kind(pred, kinds[0], init)
    return pred


def init_kinds(kind: str) -> tuple[str, ...]:
    """The predictor kinds a ``--kind`` refit may start from (``--init``): its own; a static one, any."""
    return ("static", "transformer", "lexical") if kind == "static" else (kind,)


def check_init_kind(pred: Any, kind: str, init: object) -> None:
    """Raise :class:`ConfigError` unless ``pred`` (loaded from ``--init init``) can start a ``--kind kind`` refit."""
    kinds = init_kinds(kind)
    if pred.kind in kinds:
        return
    if len(kinds) > 1:
        raise ConfigError(f"--init {init}: holds a {pred.kind} predictor; --kind {kind} starts from one of "
                          f"{', '.join(kinds)}")  # fmt: skip
    raise ConfigError(
        f"--init {init}: holds a {pred.kind} predictor, but --kind is {kind}; a refit keeps the kind: "
        f"pass --kind {pred.kind}, or an --init of kind {kind}"
    )
