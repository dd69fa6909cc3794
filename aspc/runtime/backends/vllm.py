"""The ``vllm`` backend: a thin adapter on vLLM's documented offline API.

One ``vllm.LLM`` engine per worker; each minibatch is one ``LLM.generate``
call with one ``SamplingParams`` per prompt (``n`` = the prompt's samples,
``max_tokens`` = the cap). On Ascend NPUs the vllm-ascend plugin registers
itself with vLLM; nothing here is NPU-specific.

Replay mode
    Each sample becomes its own request with ``min_tokens == max_tokens ==``
    its recorded length and ``ignore_eos``, so it generates exactly that many
    tokens (vLLM has no per-sample length within one ``n``).

Weight reload
    Engines are built with ``worker_extension_cls`` naming
    :class:`AspcWorkerExtension`, whose method runs inside vLLM's worker
    processes through ``LLM.collective_rpc`` and hands the published tensors
    to the model's own ``load_weights``; the prefix cache is reset afterwards
    because cached KV blocks belong to the old weights.

This adapter cannot run on the CPU-only CI machines; ``tests/test_vllm_contract.py``
exercises it wherever vLLM imports. With several workers on the local engine
the engines share the visible device(s), each taking an equal slice of its
memory; use ``--engine ray`` to give each worker its own device.
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import numpy as np

from aspc.errors import BackendError
from aspc.runtime.backends.base import GenerationRequest, ModelBackend, replay_total
from aspc.runtime.backends.prompts import render_prompt
from aspc.runtime.contracts import GenerationResult

VLLM_EXTRA = "pip install 'aspc[vllm]' (on Ascend also vllm-ascend)"
# Share of device memory all local engines together may take (vLLM's default is 0.9).
DEVICE_MEMORY_SHARE = 0.85


def require_vllm() -> None:
    """Raise :class:`BackendError` with the install command if vLLM is not importable."""
    if importlib.util.find_spec("vllm") is None:
        raise BackendError(f"--backend vllm needs vLLM, which is not installed; {VLLM_EXTRA}")


class AspcWorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); runs inside vLLM's worker processes."""

    def aspc_load_weights(self, weights: Any) -> int:
        """Load ``weights`` (a list of (name, tensor) pairs, or a path) into the worker's model."""
        if isinstance(weights, str):
            from aspc.runtime.backends.hf import as_state_dict

            weights = list(as_state_dict(weights).items())
        self.model_runner.model.load_weights(weights=weights)  # type: ignore[attr-defined]
        return len(weights)


class VLLMBackend(ModelBackend):
    """Generation with vLLM engines, one per worker; see the module docstring."""

    name = "vllm"

    def __init__(self, options: Any):
        super().__init__(options)
        self._llm: dict[int, Any] = {}

    def start_worker(self, worker: int) -> None:
        require_vllm()
        from vllm import LLM

        if self.device_share is not None:
            share = DEVICE_MEMORY_SHARE * self.device_share
        else:  # local engine: every engine of this process shares the visible device
            share = DEVICE_MEMORY_SHARE / max(1, self.n_workers if self.serve_workers is None else 1)
        kwargs: dict[str, Any] = {
            "model": self.options.model,
            "seed": self.options.seed + worker,
            "worker_extension_cls": f"{__name__}.AspcWorkerExtension",
            "gpu_memory_utilization": share,
        }
        if self.options.dtype != "auto":
            kwargs["dtype"] = self.options.dtype
        try:
            self._llm[worker] = LLM(**kwargs)
        except Exception as exc:  # vLLM raises many types for an engine it cannot build
            raise BackendError(f"vLLM could not start worker {worker} on {self.options.model}: "
                               f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from None
        self._version.setdefault(worker, 0)

    def _engine(self, worker: int) -> Any:
        llm = self._llm.get(worker)
        if llm is None:
            raise BackendError(f"worker {worker} has no vLLM engine in this process; the engine did not start it")
        return llm

    def _load(self, worker: int, weights: Any) -> None:
        import os
        from collections.abc import Mapping

        llm = self._engine(worker)
        if isinstance(weights, Mapping):
            arg: Any = [(k, v.detach().cpu() if hasattr(v, "detach") else v) for k, v in weights.items()]
        elif isinstance(weights, (str, os.PathLike)):
            arg = str(weights)
        else:
            raise BackendError(f"the trainer published weights as {type(weights).__name__}; publish a state dict "
                               "or a directory of .safetensors")
        llm.collective_rpc("aspc_load_weights", args=(arg,))
        llm.reset_prefix_cache()

    def _sampling(self, n: int, max_tokens: int, exact: int | None = None) -> Any:
        from vllm import SamplingParams

        o = self.options
        common: dict[str, Any] = {
            "temperature": o.temperature,
            "top_p": o.top_p,
            "top_k": o.top_k if o.top_k > 0 else -1,
        }
        if exact is not None:
            return SamplingParams(n=1, max_tokens=max(1, exact), min_tokens=exact, ignore_eos=True, **common)
        return SamplingParams(n=n, max_tokens=max_tokens, **common)

    def _execute(self, worker: int, request: GenerationRequest) -> GenerationResult:
        llm = self._engine(worker)
        replay = replay_total(request)
        t0 = time.perf_counter()
        tok = llm.get_tokenizer()
        row_ids = []
        for prompt in request.prompts:
            text, templated = render_prompt(prompt, tok)
            row_ids.append(tok(text, add_special_tokens=not templated)["input_ids"])
        if replay is not None:
            sample_rows = np.repeat(np.arange(len(row_ids)), request.n_samples)
            prompts = [{"prompt_token_ids": row_ids[r]} for r in sample_rows]
            params = [self._sampling(1, request.max_new_tokens, int(x)) for x in replay]
        else:
            prompts = [{"prompt_token_ids": ids} for ids in row_ids]
            params = [self._sampling(int(n), request.max_new_tokens) for n in request.n_samples]
        outputs = llm.generate(prompts, sampling_params=params, use_tqdm=False)
        eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        completions = [c for out in outputs for c in out.outputs]
        if len(completions) != request.n_total:
            raise BackendError(f"vLLM returned {len(completions)} sequences for {request.n_total} samples")
        lens = np.empty(len(completions), dtype=np.int64)
        for i, c in enumerate(completions):
            ids = list(c.token_ids)
            ended_on_eos = c.finish_reason == "stop" and bool(ids) and ids[-1] in eos
            lens[i] = len(ids) - int(ended_on_eos)
        if replay is not None:
            lens = np.minimum(lens, replay)  # a zero-length replay still generates its one token
        t1 = time.perf_counter()
        payload = None
        if self.options.return_payload:
            rows = np.repeat(np.arange(len(row_ids)), request.n_samples)
            version = self.weights_version(worker)
            payload = [
                {
                    "prompt_id": request.prompt_ids[r],
                    "prompt": request.prompts[r],
                    "prompt_token_ids": list(row_ids[r]),
                    "response_token_ids": list(c.token_ids),
                    "text": c.text,
                    "finished": c.finish_reason == "stop",
                    "weights_version": version,
                }
                for r, c in zip(rows, completions, strict=True)
            ]
        # vLLM returns a minibatch whole: every sample counts as finished when the call returns.
        finish = np.full(lens.size, t1 - t0)
        return GenerationResult(response_len=lens, finish_offset=finish, elapsed=t1 - t0, payload=payload)

    def close(self) -> None:
        self.wait_idle()
        self._llm.clear()
