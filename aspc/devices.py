"""One device policy for predictors and generation backends: Ascend NPU, then CUDA, then CPU.

``--device auto`` means the first of those that is present (:func:`auto_kind`);
an explicit kind must be present or the request fails. Predictors ask for a
``torch.device`` (:func:`resolve_device`), backends for a device string per
worker, spread round-robin over the visible devices (:func:`pick_device`).

``torch_npu`` is imported only here, and only when an NPU is asked for or
probed, as the design requires of optional hardware packages; CPU and CUDA
users never need the Ascend stack.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from aspc.errors import BackendError, ConfigError

DEVICE_KINDS = ("auto", "cpu", "cuda", "npu")
NPU_EXTRA = "pip install 'aspc[npu]' (torch-npu, matching your CANN toolkit)"


def npu_available() -> bool:
    """True when torch-npu imports and sees at least one NPU."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        importlib.import_module("torch_npu")
        import torch

        npu = getattr(torch, "npu", None)
        return bool(npu is not None and npu.is_available())
    except Exception:  # a broken CANN install must not stop a CPU or CUDA run
        return False


def auto_kind() -> str:
    """The device kind ``auto`` stands for here: ``npu``, else ``cuda``, else ``cpu``."""
    import torch

    return "npu" if npu_available() else "cuda" if torch.cuda.is_available() else "cpu"


def check_device_request(requested: str) -> None:
    """Validate a backend's ``--device`` without touching hardware; raise for a missing package or a bad name."""
    kind, sep, index = requested.partition(":")
    if kind not in DEVICE_KINDS or (sep and (kind in ("auto", "cpu") or not index.isdigit())):
        raise ConfigError(f"--device {requested!r}: use auto, cpu, cuda[:N] or npu[:N]")
    if kind == "npu" and importlib.util.find_spec("torch_npu") is None:
        raise BackendError(f"--device {requested} needs torch-npu, which is not installed; {NPU_EXTRA}")


def pick_device(requested: str = "auto", worker: int = 0) -> str:
    """The torch device string for generation worker ``worker``.

    Without an explicit index, workers are spread round-robin over the
    visible devices of the chosen kind (a Ray actor sees only its own device,
    index 0).

    Raises
    ------
    BackendError
        An accelerator that was asked for explicitly is not available.
    """
    check_device_request(requested)
    import torch

    kind, _, index = requested.partition(":")
    if kind == "auto":
        kind = auto_kind()
    if kind == "cpu":
        return "cpu"
    if kind == "npu":
        if not npu_available():
            raise BackendError(f"--device {requested}: torch-npu is installed but sees no NPU; check the CANN setup")
        count = torch.npu.device_count()  # type: ignore[attr-defined]
    else:
        if not torch.cuda.is_available():
            raise BackendError(f"--device {requested}: CUDA is not available to this torch build; use --device cpu")
        count = torch.cuda.device_count()
    if index:
        return f"{kind}:{int(index)}"
    return f"{kind}:{worker % max(1, count)}"


def resolve_device(requested: str = "auto") -> Any:
    """The ``torch.device`` a predictor trains or predicts on.

    Parameters
    ----------
    requested
        ``auto`` (see :func:`auto_kind`), or one of ``npu``, ``cuda``, ``cpu``
        (any case); an index such as ``cuda:1`` is accepted.

    Raises
    ------
    ConfigError
        When the requested accelerator is not present.
    """
    import torch

    name = (requested or "auto").lower()
    base = name.split(":", 1)[0]
    if base not in DEVICE_KINDS:
        raise ConfigError(f"unknown device {requested!r}; use one of auto, npu, cuda, cpu")
    if base == "auto":
        return torch.device(auto_kind())
    if base == "npu" and not npu_available():
        raise ConfigError(
            "--device npu: no Ascend NPU found (torch_npu does not import or sees no device); "
            "install torch_npu or use --device auto"
        )
    if base == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: CUDA is not available to this torch; use --device auto or cpu")
    return torch.device(name)
