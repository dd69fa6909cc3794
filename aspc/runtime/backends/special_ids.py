"""Which token ids end and pad a sequence for the hf backend, and the checks that they fit the model.

The tokenizer names them first; a model whose tokenizer names none may
declare them in ``generation_config.json`` (which transformers derives from
``config.json`` where the file is missing) or ``config.json``. ``generate``
looks every one of them up in the model's embeddings (a pad id even where the
attention mask hides it), so an id past them failed each minibatch with an
IndexError after the run log had started: they are checked when a worker
loads its model, before the log starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aspc.errors import BackendError


@dataclass(frozen=True)
class SpecialIds:
    eos: list[int]  # every id that ends a sequence, distinct; eos[0] is the one replay forces
    pad: int  # the id left-padding fills rows with; masked out, but still looked up in the embeddings


def _ids(value: Any) -> list[int]:
    """The ids an ``eos_token_id``/``pad_token_id`` field holds: an int, a list of them, or none.

    A negative id is no id: old configs write ``pad_token_id: -1`` for "none".
    """
    values = value if isinstance(value, (list, tuple)) else [value]
    return [int(v) for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]


def special_ids(tokenizer: Any, model: Any, path: Any) -> SpecialIds:
    """The end and pad ids of ``model`` with ``tokenizer`` (loaded from ``path``), checked against its embeddings.

    End ids: the tokenizer's and generation_config's together (Llama 3 ends on
    either of two); config.json's only where both name none. Pad: the
    tokenizer's (its eos where it names no pad, see ``load_tokenizer``), else
    generation_config's, else config.json's, else the first end id, as a
    tokenizer without a pad gets its eos.
    """
    gen, cfg = getattr(model, "generation_config", None), getattr(model, "config", None)
    # Each id with the file that declared it (None: the tokenizer), in order of declaration.
    eos: dict[int, str | None] = {}
    for i in _ids(tokenizer.eos_token_id):
        eos.setdefault(i, None)
    for i in _ids(getattr(gen, "eos_token_id", None)):
        eos.setdefault(i, "generation_config.json")
    if not eos:
        eos = dict.fromkeys(_ids(getattr(cfg, "eos_token_id", None)), "config.json")
    pad: tuple[int, str | None] | None = None
    if tokenizer.pad_token_id is not None:
        pad = (int(tokenizer.pad_token_id), None)
    for value, file in ((getattr(gen, "pad_token_id", None), "generation_config.json"),
                        (getattr(cfg, "pad_token_id", None), "config.json")):  # fmt: skip
        if pad is None and _ids(value):
            pad = (_ids(value)[0], file)
    if pad is None and eos:
        pad = next(iter(eos.items()))
    if pad is None:  # the message of the tokenizer-only check this replaces
        raise BackendError(f"--model {path}: the tokenizer has neither a pad nor an eos token, and neither config "
                           "declares one; set eos_token_id in generation_config.json (or eos_token in "
                           "tokenizer_config.json)")  # fmt: skip
    if not eos:
        raise BackendError(f"--model {path}: neither the tokenizer nor generation_config.json nor config.json names "
                           "an end-of-sequence token, so generation could never end; set eos_token_id in "
                           "generation_config.json")  # fmt: skip
    n = int(model.get_input_embeddings().num_embeddings)
    for (i, file), what in [*((e, "eos") for e in eos.items()), (pad, "pad")]:
        if i < n:
            continue
        if file is None:
            token = tokenizer.eos_token if what == "eos" else tokenizer.pad_token
            raise BackendError(
                f"--model {path}: the tokenizer's {what} token {token!r} is id {i}, past the model's {n} embeddings "
                "(a token added to the tokenizer without model.resize_token_embeddings); resize the model's "
                "embeddings and save the model, or use a token the model has"
            )
        raise BackendError(f"--model {path}: {file} declares {what} token id {i}, past the model's {n} embeddings "
                           f"(an id of another model?); set {what}_token_id in {file} to ids the model has")  # fmt: skip
    return SpecialIds(eos=list(eos), pad=pad[0])
