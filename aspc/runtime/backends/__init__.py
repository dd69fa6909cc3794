"""Real generation backends: ``hf`` (transformers) and ``vllm`` (vLLM / vLLM-Ascend).

Both hold one model per worker, take their options from
``BackendContext.options`` (see :mod:`aspc.runtime.backends.options`), and
run under the local engine (threads) or the Ray engine (one actor per worker).
Their heavy imports (torch, transformers, vllm) happen inside the backend
modules, when a backend is built.
"""

from __future__ import annotations

from aspc.runtime.backends.base import GenerationRequest, ModelBackend
from aspc.runtime.backends.options import OPTION_KEYS, GenerationOptions, options_from_context

__all__ = ["OPTION_KEYS", "GenerationOptions", "GenerationRequest", "ModelBackend", "make_model_backend"]


def make_model_backend(kind: str, options: dict) -> ModelBackend:
    """Build the ``hf`` or ``vllm`` backend from ``BackendContext.options``.

    The model path is resolved (and a GGUF converted, once) here, so a bad
    ``--model`` fails before any run log is written.

    Raises
    ------
    ConfigError
        Missing ``--model`` or invalid sampling options.
    BackendError
        The model cannot be used, or the backend's packages are not installed.
    """
    import dataclasses

    from aspc.runtime.devices import check_device_request
    from aspc.runtime.models import resolve_model

    opts = options_from_context(options)
    check_device_request(opts.device)
    if kind == "vllm":
        from aspc.runtime.backends.vllm import VLLMBackend, require_vllm

        require_vllm()
        return VLLMBackend(dataclasses.replace(opts, model=str(resolve_model(opts.model))))
    from aspc.runtime.backends.hf import HFBackend

    return HFBackend(dataclasses.replace(opts, model=str(resolve_model(opts.model))))
