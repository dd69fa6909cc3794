"""Which accelerator a worker uses: Ascend NPU, then CUDA, then CPU, unless ``--device`` says otherwise.

``torch_npu`` is imported only here (and only when an NPU is asked for or
probed), as the design requires of optional hardware packages.
"""

from __future__ import annotations

import importlib
import importlib.util

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

        return bool(torch.npu.is_available())  # type: ignore[attr-defined]
    except Exception:  # a broken CANN install must not stop a CPU run
        return False


def check_device_request(requested: str) -> None:
    """Validate ``--device`` without touching hardware; raise for a missing package or a bad name."""
    kind, sep, index = requested.partition(":")
    if kind not in DEVICE_KINDS or (sep and (kind in ("auto", "cpu") or not index.isdigit())):
        raise ConfigError(f"--device {requested!r}: use auto, cpu, cuda[:N] or npu[:N]")
    if kind == "npu" and importlib.util.find_spec("torch_npu") is None:
        raise BackendError(f"--device {requested} needs torch-npu, which is not installed; {NPU_EXTRA}")


def pick_device(requested: str = "auto", worker: int = 0) -> str:
    """The torch device string for ``worker``.

    ``auto`` prefers an NPU, then CUDA, then the CPU. Without an explicit
    index, workers are spread round-robin over the visible devices of the
    chosen kind (a Ray actor sees only its own device, index 0).

    Raises
    ------
    BackendError
        An accelerator that was asked for explicitly is not available.
    """
    check_device_request(requested)
    import torch

    kind, _, index = requested.partition(":")
    if kind == "auto":
        kind = "npu" if npu_available() else "cuda" if torch.cuda.is_available() else "cpu"
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
