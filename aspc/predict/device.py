"""Choose the torch device for the transformer predictor: Ascend NPU > CUDA > CPU.

``import torch_npu`` happens only here and only when an NPU is asked for or
auto-detected, so CPU and CUDA users never need the Ascend stack.
"""

from __future__ import annotations

import importlib
from typing import Any

from aspc.errors import ConfigError

DEVICE_CHOICES = ("auto", "npu", "cuda", "cpu")


def _npu_available() -> bool:
    try:
        importlib.import_module("torch_npu")
    except Exception:  # noqa: BLE001 - a broken Ascend install must not stop CPU/CUDA use
        return False
    import torch

    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available())


def resolve_device(requested: str = "auto") -> Any:
    """The ``torch.device`` to train or predict on.

    Parameters
    ----------
    requested
        ``auto`` (NPU when ``torch_npu`` imports and sees a device, else CUDA
        when available, else CPU), or one of ``npu``, ``cuda``, ``cpu``; an
        index such as ``cuda:1`` is accepted.

    Raises
    ------
    ConfigError
        When the requested accelerator is not present.
    """
    import torch

    name = (requested or "auto").lower()
    base = name.split(":", 1)[0]
    if base not in DEVICE_CHOICES:
        raise ConfigError(f"unknown device {requested!r}; use one of {', '.join(DEVICE_CHOICES)}")
    if base == "auto":
        if _npu_available():
            return torch.device("npu")
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    if base == "npu" and not _npu_available():
        raise ConfigError(
            "--device npu: no Ascend NPU found (torch_npu does not import or sees no device); "
            "install torch_npu or use --device auto"
        )
    if base == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: CUDA is not available to this torch; use --device auto or cpu")
    return torch.device(name)
