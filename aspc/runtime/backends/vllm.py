"""The ``vllm`` backend: a thin adapter on vLLM's offline ``LLM`` API.

One ``vllm.LLM`` engine per worker. A minibatch is queued with
``LLM.enqueue`` and driven step by step through ``llm_engine.step()``, so
each request's finish time is known (``finish_offset``). On Ascend NPUs the
vllm-ascend plugin registers itself with vLLM; nothing here is NPU-specific.

Sampling
    Free generation: one request per prompt with ``SamplingParams.n`` = its
    samples. Replay (``--replay-lengths``): the samples of a prompt that
    share a recorded length form one request with ``n`` = their count and
    ``min_tokens == max_tokens ==`` that length, ``ignore_eos``, so every
    sample generates exactly its length (``response_len`` == the replayed
    length; a zero-length replay still runs one step and reports 0).

Weight reload
    Engines are built with ``worker_extension_cls`` naming
    :class:`AspcWorkerExtension`. ``collective_rpc`` arguments travel by
    msgpack, which turns tensors inside containers into lists, so a
    published state dict is sent as safetensors bytes; the worker parses
    them and hands them to its own ``reload_weights(weights_iterator=...)``
    (vLLM's in-place, layer-wise reload; ``model.load_weights`` alone fails
    on CPU). A published path (a .safetensors file or a directory of them)
    is read inside the worker. The prefix cache is reset afterwards: cached
    KV blocks belong to the old weights.

Defaults on CPU
    vLLM on CPU reads ``gpu_memory_utilization`` as a share of host RAM for
    its KV cache (0.85 reserves most of the machine), so on CPU each engine
    gets ``kv_cache_memory_bytes`` = 1 GiB (``VLLM_CPU_KVCACHE_SPACE`` in
    GiB overrides it), and ``enforce_eager`` (torch.compile adds ~60-90 s
    to each engine start on two cores). ``--dtype auto`` is float32 on a
    CPU without native bf16 (no ``avx512_bf16``/``amx_bf16`` flag), where
    vLLM's own bf16 default is emulated: on 2 AVX2 cores SmolLM2-135M then
    costs ~37 ms per active sequence per decode step (``a + b·active`` with
    a ≈ 38 ms, b ≈ 34 ms), so a step's time follows the sequences in it and
    grouping similar lengths saves little; in float32 a step costs ~80-90 ms
    flat up to 4-5 sequences (a ≈ 61 ms, b ≈ 9 ms), 2x faster at 4, and a
    plan that removes steps removes time (``benchmarks/vllm_step_cost.py``).
    vLLM's logs go to stderr (set before vLLM is imported) so ``--json``
    keeps stdout to one object.

Measured on a 2-core CPU with vllm-cpu 0.32.0 (see README, "vLLM on CPU"):
SmolLM2-135M replaying 96 CASTILLO prompts' recorded lengths, static return,
an asp plan takes 0.62-0.72 x the makespan of a random one in the latest
three rounds (0.55-0.75 over nine), and the simulator calibrated on a run log
(``aspc calibrate``) predicts that run within 0.2% and another plan's run
within 9.4% (18 of 18 pairs).
With several workers on the local engine the engines share the visible
device(s), each taking an equal slice of its memory; ``--engine ray`` gives
each worker its own actor.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from aspc import interrupt_libraries
from aspc.errors import BackendError, ConfigError, WorkerLostError
from aspc.runtime.backends.base import GenerationRequest, ModelBackend, replay_total
from aspc.runtime.backends.prompts import check_plan_fits, check_prompt_fits, plan_prompt_tokens, render_prompt
from aspc.runtime.backends.vllm_args import (  # noqa: F401 - CPU_KV_CACHE_BYTES, parse_engine_args: imported from here
    CPU_KV_CACHE_BYTES,
    check_engine_args,
    configure_vllm_env,
    engine_kwargs,
    parse_engine_args,
)
from aspc.runtime.contracts import GenerationResult

VLLM_EXTRA = "pip install 'aspc[vllm]' (on Ascend also vllm-ascend; on a CPU: make vllm)"
# Share of device memory all local engines together may take (vLLM's default is 0.9).
DEVICE_MEMORY_SHARE = 0.85
MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams refuses higher
def require_vllm() -> None:
    """Raise :class:`BackendError` with the install command if vLLM is not importable."""
    if importlib.util.find_spec("vllm") is None:
        raise BackendError(f"--backend vllm needs vLLM, which is not installed; {VLLM_EXTRA}")


def serialize_state_dict(weights: Mapping[str, Any]) -> bytes:
    """A state dict as safetensors bytes (tied tensors copied: safetensors refuses shared storage)."""
    import torch
    from safetensors.torch import save

    out: dict[str, Any] = {}
    seen: set[int] = set()
    for k, v in weights.items():
        if not isinstance(v, torch.Tensor):
            raise BackendError(f"published weight {k!r} is a {type(v).__name__}, not a tensor")
        t = v.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[k] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return save(out)


def check_vllm_device(requested: str) -> None:
    """Refuse a ``--device`` vLLM would not honour: it runs on its platform's device and places engines itself."""
    if requested == "auto":
        return
    from vllm.platforms import current_platform

    kind, sep, _ = requested.partition(":")
    have = str(current_platform.device_type)
    if sep:
        raise ConfigError(f"--device {requested}: vLLM places each engine itself; choose the devices it sees with "
                          f"CUDA_VISIBLE_DEVICES (ASCEND_RT_VISIBLE_DEVICES on an NPU) and pass --device {kind} or "
                          "auto")  # fmt: skip
    if kind != have:
        raise ConfigError(f"--device {requested}: this vLLM runs on {have}, not {kind}; pass --device {have} or auto, "
                          "or install the vLLM build for that device")  # fmt: skip


class AspcWorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); runs inside vLLM's worker processes."""

    def aspc_load_weights(self, weights: bytes | str) -> int:
        """Reload the model from safetensors bytes or a path; returns the number of tensors read."""
        if isinstance(weights, (bytes, bytearray, memoryview)):
            from safetensors.torch import load

            state = load(bytes(weights))
        else:
            from aspc.runtime.backends.hf import as_state_dict

            state = as_state_dict(str(weights))
        self.reload_weights(weights_iterator=iter(state.items()))  # type: ignore[attr-defined]
        return len(state)


def max_model_len(llm: Any) -> int | None:
    """The engine's context length (prompt + response), or ``None`` where this vLLM does not say."""
    try:
        value = llm.llm_engine.model_config.max_model_len
    except AttributeError:
        return None
    return value if isinstance(value, int) and value > 0 else None


class VLLMBackend(ModelBackend):
    """Generation with vLLM engines, one per worker; see the module docstring."""

    name = "vllm"
    streams = True  # generate() reports each request as it ends: --return-mode continuous

    def __init__(self, options: Any):
        super().__init__(options)
        check_engine_args(options.engine_args)
        if options.temperature is not None and options.temperature > MAX_TEMPERATURE:
            # vLLM's own check fails every request, hours later, as a worker fault retried to the end.
            raise ConfigError(f"--temperature {options.temperature:g}: vLLM samples at temperatures in [0, "
                              f"{MAX_TEMPERATURE:g}]; pass {MAX_TEMPERATURE:g} or less")  # fmt: skip
        self._llm: dict[int, Any] = {}
        self._emit: dict[int, Any] = {}  # worker -> on_samples callback of its running call

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_emit"] = {}  # callbacks belong to the driver's engine thread
        return state

    def setup(self, work: Any, n_workers: int) -> None:
        self._closing.clear()  # a backend closed by an earlier run() serves the next one
        super().setup(work, n_workers)

    def start_worker(self, worker: int) -> None:
        if worker in self._llm:  # setup() again before close(): reuse the engine (startup is the slow part)
            self._version[worker] = 0  # whatever it holds is the new run's version 0
            return
        require_vllm()
        configure_vllm_env()
        from vllm import LLM
        from vllm.platforms import current_platform

        if self.device_share is not None:
            share = DEVICE_MEMORY_SHARE * self.device_share
        else:  # local engine: every engine of this process shares the visible device
            share = DEVICE_MEMORY_SHARE / max(1, self.n_workers if self.serve_workers is None else 1)
        kwargs = engine_kwargs(self.options, worker, share, current_platform.is_cpu())
        try:
            with interrupt_libraries.must_escape():  # vLLM swallows a KeyboardInterrupt while its engine starts
                self._llm[worker] = LLM(**kwargs)
        except Exception as exc:  # vLLM raises many types for an engine it cannot build
            raise BackendError(f"vLLM could not start worker {worker} on {self.options.model}: "
                               f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None
        self._version.setdefault(worker, 0)

    def check_prompts(self, worker: int, work: Any, max_new_tokens: int) -> dict[str, int]:
        llm = self._engine(worker)
        tokens = plan_prompt_tokens(work, llm.get_tokenizer())
        check_plan_fits(tokens, max_new_tokens, max_model_len(llm), "the engine's max_model_len")
        return {pid: len(ids) for pid, ids in tokens.items()}

    def _engine(self, worker: int) -> Any:
        llm = self._llm.get(worker)
        if llm is None:
            raise BackendError(f"worker {worker} has no vLLM engine in this process; the engine did not start it")
        return llm

    def _load(self, worker: int, weights: Any) -> None:
        llm = self._engine(worker)
        if isinstance(weights, Mapping):
            arg: bytes | str = serialize_state_dict(weights)
        elif isinstance(weights, (str, os.PathLike)):
            arg = str(weights)
        else:
            raise BackendError(f"the trainer published weights as {type(weights).__name__}; publish a state dict "
                               "or a directory of .safetensors")
        try:
            llm.collective_rpc("aspc_load_weights", args=(arg,))
        except Exception as exc:  # the worker's error comes back wrapped by vLLM
            raise BackendError(f"vLLM worker {worker} could not load the published weights: "
                               f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None
        llm.reset_prefix_cache()

    def _sampling(self, n: int, max_tokens: int, exact: int | None = None) -> Any:
        from vllm import SamplingParams

        o = self.options
        common: dict[str, Any] = {
            "n": n,
            "temperature": o.temperature,
            "top_p": o.top_p,
            "top_k": o.top_k if o.top_k > 0 else -1,
        }
        if exact is not None:
            return SamplingParams(max_tokens=max(1, exact), min_tokens=exact, ignore_eos=True, **common)
        return SamplingParams(max_tokens=max_tokens, **common)

    def _requests(self, request: GenerationRequest, row_ids: list[list[int]]) -> list[tuple[int, np.ndarray, Any]]:
        """(row, global-in-minibatch sample positions, SamplingParams) per vLLM request."""
        replay = replay_total(request)
        starts = np.concatenate([[0], np.cumsum(request.n_samples)])
        out = []
        greedy = self.options.temperature == 0  # vLLM refuses n > 1 greedy: one request per sample

        def add(r: int, pos: np.ndarray, exact: int | None = None) -> None:
            for part in (pos[i : i + 1] for i in range(pos.size)) if greedy else (pos,):
                out.append((r, part, self._sampling(int(part.size), request.max_new_tokens, exact)))

        for r in range(len(row_ids)):
            pos = np.arange(starts[r], starts[r + 1])
            if replay is None:
                add(r, pos)
                continue
            lens = replay[pos]
            for length in np.unique(lens):  # samples of one prompt and one length: one request, n of them
                add(r, pos[lens == length], int(length))
        return out

    def generate(self, worker: int, work: Any, on_samples: Any = None) -> GenerationResult:
        """Generate minibatch ``work``; ``on_samples(positions, lens, payload)`` hears each request as it ends."""
        return self.execute_streaming(worker, self.request(work), on_samples)

    def execute_streaming(self, worker: int, request: GenerationRequest, on_samples: Any) -> GenerationResult:
        """:meth:`execute`, with ``on_samples`` heard as each request ends (also where a Ray actor runs it)."""
        self._emit[worker] = on_samples  # one worker's calls never overlap, so one slot each is enough
        try:
            return self.execute(worker, request)
        finally:
            self._emit.pop(worker, None)

    def _execute(self, worker: int, request: GenerationRequest) -> GenerationResult:
        llm = self._engine(worker)
        emit = self._emit.get(worker)
        replay = replay_total(request)
        t0 = time.perf_counter()
        tok = llm.get_tokenizer()
        row_ids = []
        limit = max_model_len(llm)
        for pid, prompt in zip(request.prompt_ids, request.prompts, strict=True):
            text, templated = render_prompt(prompt, tok, pid)
            row_ids.append(tok(text, add_special_tokens=not templated)["input_ids"])
            check_prompt_fits(pid, len(row_ids[-1]), request.max_new_tokens, limit, "the engine's max_model_len")
        reqs = self._requests(request, row_ids)
        ids = llm.enqueue([{"prompt_token_ids": row_ids[r]} for r, _, _ in reqs],
                          sampling_params=[p for _, _, p in reqs], use_tqdm=False)
        # enqueue returns vLLM's internal ids ("<external>-<random>"); outputs carry the external one.
        index = {}
        for i, rid in enumerate(map(str, ids)):
            index[rid] = index[rid.rsplit("-", 1)[0]] = i
        n = request.n_total
        lens = np.full(n, -1, dtype=np.int64)
        finish = np.zeros(n)
        payload: list[Any] = [None] * n
        eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        version = self.weights_version(worker)
        engine = llm.llm_engine
        while engine.has_unfinished_requests():
            if self._closing.is_set():  # the run is over: drop the minibatch, keep the engine reusable
                engine.abort_request(list(map(str, ids)), internal=True)
                raise BackendError(f"worker {worker}: generation stopped because the run is closing")
            for out in self._step(worker, engine):
                i = index.get(str(out.request_id))
                if i is None or not out.finished:
                    continue
                r, pos, _ = reqs[i]
                seqs = sorted(out.outputs, key=lambda c: c.index)
                if len(seqs) != pos.size:
                    raise BackendError(f"vLLM returned {len(seqs)} sequences for {pos.size} samples")
                finish[pos] = time.perf_counter() - t0
                for p, c in zip(pos, seqs, strict=True):
                    toks = list(c.token_ids)
                    # An EOS of generation_config.json (Llama 3's <|eot_id|>, say) is a stop token to vLLM,
                    # which names it in stop_reason; the tokenizer's EOS alone missed it, so the response
                    # counted it and came back unfinished (hf merges both sources; so does this).
                    stop = c.finish_reason == "stop" and bool(toks) and (toks[-1] in eos or toks[-1] == c.stop_reason)
                    n_tok = len(toks) - int(stop)
                    if replay is not None:
                        n_tok = min(n_tok, int(replay[p]))  # a zero-length replay still generates one token
                    lens[p] = n_tok
                    if self.options.return_payload:
                        payload[p] = {
                            "prompt_id": request.prompt_ids[r],
                            "prompt": request.prompts[r],
                            "prompt_token_ids": list(row_ids[r]),
                            "response_token_ids": toks[: n_tok + int(stop)],
                            "text": c.text,
                            "finished": bool(stop),
                            "weights_version": version,
                        }
                if emit is not None:
                    emit(pos, lens[pos], [payload[p] for p in pos] if self.options.return_payload else None)
        if np.any(lens < 0):
            raise BackendError(f"vLLM finished minibatch {request.minibatch} without every sample; "
                               "another caller may be sharing this engine")
        t1 = time.perf_counter()
        return GenerationResult(response_len=lens, finish_offset=np.minimum(finish, t1 - t0), elapsed=t1 - t0,
                                payload=payload if self.options.return_payload else None)

    @staticmethod
    def _step(worker: int, engine: Any) -> list[Any]:
        """One engine step; a dead engine process (killed, or crashed on the model) stops the run in one line."""
        try:
            return engine.step()
        except Exception as exc:
            if type(exc).__name__ != "EngineDeadError":  # vLLM's class moves between releases; its name does not
                raise
            raise WorkerLostError(
                f"worker {worker}: vLLM's engine process died; its cause (out of memory, a model this vLLM "
                "cannot run) is in vLLM's log above: fix that, then rerun (with --resume where the run has a --log)"
            ) from None

    def close(self) -> None:
        self.release_remote()
        self.wait_idle()
        engines, self._llm = list(self._llm.values()), {}
        for llm in engines:
            # Shut each engine-core process down now: left to garbage collection, an engine still
            # referenced by an error's traceback kept the process waiting for it at exit.
            shutdown = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None), "shutdown", None)
            if callable(shutdown):
                try:
                    shutdown()
                except Exception:  # noqa: BLE001 - closing must not mask the run's own outcome
                    pass
