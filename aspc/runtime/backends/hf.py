"""The ``hf`` backend: Hugging Face ``transformers`` generation, one minibatch per ``generate`` call.

Each worker holds its own copy of the model (its own weights version) on its
device (NPU > CUDA > CPU unless ``--device``). A minibatch is generated in
one batched, left-padded ``generate`` call, every prompt repeated once per
sample; the call returns when its longest sequence ends, which is the
``static`` return mode the preprint describes.

Replay mode (``--replay-lengths``)
    A logits processor forbids end-of-sequence tokens before a sequence's
    recorded length and forces one at it, so a real model on real hardware
    reproduces a recorded length distribution exactly:
    ``response_len == min(recorded, max_new_tokens)``. The sampler runs
    after it, so sampling cannot undo the forcing.

Sampling (``--temperature`` > 0)
    A logits processor of aspc's draws each token, with a generator seeded
    from ``(--seed, epoch, minibatch)``: the same seed gives the same tokens with
    any number of workers, whichever worker runs a minibatch (on one device
    type; kernels differ between devices). Only aspc's options shape it: the
    model's ``generation_config.json`` contributes its special tokens alone.

Timing
    The minibatch's ``elapsed`` is measured around tokenization, ``generate``
    and decoding; a second logits processor timestamps every decode step, so
    each sample's ``finish_offset`` is when its last token was produced.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np

from aspc.devices import pick_device
from aspc.errors import BackendError, ConfigError, InputError
from aspc.runtime.backends.base import GenerationRequest, ModelBackend, replay_total
from aspc.runtime.backends.models import load_causal_lm, load_tokenizer, require_transformers
from aspc.runtime.backends.options import GenerationOptions
from aspc.runtime.backends.prompts import check_plan_fits, check_prompt_fits, plan_prompt_tokens, render_prompt
from aspc.runtime.backends.special_ids import special_ids
from aspc.runtime.contracts import GenerationResult


class _WorkerState:
    """One worker's model, tokenizer and token ids, living on one device."""

    def __init__(self, model: Any, tokenizer: Any, device: str, path: Any):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        ids = special_ids(tokenizer, model, path)
        self.eos_ids = ids.eos  # every id that ends a sequence; eos_ids[0] is the one replay forces
        self.pad_id = ids.pad
        self.n_embeddings = int(model.get_input_embeddings().num_embeddings)
        self.max_positions = _max_positions(model.config)


def _max_positions(config: Any) -> int | None:
    """The longest prompt + response ``config`` declares, or ``None`` where it names none.

    RoPE scaling extends it as vLLM derives ``max_model_len``: YaRN's
    original length times its factor, linear or dynamic scaling the declared
    length times the factor; Llama 3 and LongRoPE configs declare the
    extended length already.
    """
    value = None
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(config, name, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            value = v
            break
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None)
    if value is None or not isinstance(rope, dict):
        return value
    kind, factor = rope.get("rope_type") or rope.get("type"), rope.get("factor")
    if kind in (None, "default", "llama3", "longrope", "su") or not isinstance(factor, (int, float)) or factor <= 1:
        return value
    original = rope.get("original_max_position_embeddings") if kind == "yarn" else None
    base = original if isinstance(original, int) and original > 0 else value
    return max(value, int(base * factor))


# The fields of a model's generation_config.json that say which token is which, not how to sample.
SPECIAL_TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def only_special_tokens(config: Any) -> Any:
    """A ``GenerationConfig`` holding only ``config``'s special token ids.

    ``generate`` fills every field aspc leaves unset from the model's own
    generation config, so a checkpoint's ``repetition_penalty`` (Qwen2.5-Instruct
    ships 1.05), ``min_new_tokens`` or ``no_repeat_ngram_size`` silently shaped
    the sampling: aspc's options alone decide it, every other field falls to
    transformers' neutral defaults (no penalty, no minimum length).
    """
    from transformers import GenerationConfig

    return GenerationConfig(**{k: getattr(config, k) for k in SPECIAL_TOKEN_FIELDS if getattr(config, k, None) is not None})


def check_prompt_tokens(prompt_id: str, ids: list[int], max_new_tokens: int, state: _WorkerState) -> None:
    """Refuse a prompt the model cannot take, before ``generate`` fails on it with an IndexError.

    All three errors stop the run at once (they are not worker faults): another
    worker would fail the same way.
    """
    if not ids:  # alone in a minibatch it fails generate; beside others its row is all padding, its response noise
        raise InputError(
            f"prompt {prompt_id!r} renders to no tokens with --model's tokenizer and chat template (the template "
            "leaves out all of its messages); give the prompt a message the template renders, fix the template in "
            "the model directory, or drop the prompt"
        )
    if max(ids) >= state.n_embeddings:
        raise ConfigError(
            f"the tokenizer in --model gives prompt {prompt_id!r} token id {max(ids)}, past the model's "
            f"{state.n_embeddings} embeddings; --model's tokenizer and weights must come from the same model"
        )
    check_prompt_fits(prompt_id, len(ids), max_new_tokens, state.max_positions, "the model's")


def _stop_when(event: Any) -> Any:
    """A StoppingCriteriaList that ends every sequence once ``event`` is set (the backend is closing)."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Closing(StoppingCriteria):
        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
            return torch.full((input_ids.shape[0],), event.is_set(), dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([Closing()])


def _processors(
    prompt_len: int, eos_ids: list[int], replay: np.ndarray | None, stamps: list[float], sampler: Any = None
) -> Any:
    """A LogitsProcessorList: a step clock, the replay forcing when ``replay`` is given, then ``sampler`` if any."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    class StepClock(LogitsProcessor):
        """Records when each decode step's logits are ready (one call per generated position)."""

        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            stamps.append(time.perf_counter())
            return scores

    class ReplayEnds(LogitsProcessor):
        """Forbid EOS before each row's target length and force it at that length."""

        def __init__(self, target: torch.Tensor):
            self.target = target  # int64 per row: tokens before the EOS
            self.eos = torch.tensor(eos_ids, dtype=torch.long, device=target.device)

        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            if self.target.device != scores.device:  # built on the CPU, used where the model runs
                self.target, self.eos = self.target.to(scores.device), self.eos.to(scores.device)
            t = input_ids.shape[1] - prompt_len  # tokens generated so far == index of the token being chosen
            neg = torch.finfo(scores.dtype).min
            early = (self.target > t).unsqueeze(1)
            eos_scores = scores[:, self.eos]
            scores[:, self.eos] = torch.where(early, torch.full_like(eos_scores, neg), eos_scores)
            at = (self.target == t).unsqueeze(1)
            forced = torch.full_like(scores[:1], neg)
            forced[0, self.eos[0]] = 0.0
            return torch.where(at, forced.expand_as(scores), scores)

    procs = [StepClock()]
    if replay is not None:
        procs.append(ReplayEnds(torch.tensor(np.asarray(replay), dtype=torch.long)))
    if sampler is not None:
        procs.append(sampler)
    return LogitsProcessorList(procs)


def _sampler(temperature: float, top_p: float, top_k: int, seed: int) -> Any:
    """A logits processor that samples each step's token with its own generator, seeded by ``seed``.

    ``generate(do_sample=True)`` draws from torch's one process-wide
    generator, which every thread worker shares: with two workers the draws
    interleave as the threads happen to run, and the same ``--seed`` gave other
    tokens. This one applies transformers' own temperature, top-k and top-p
    warpers, draws from a generator of its own, and leaves only the drawn token
    for ``generate``'s greedy pick. Seeded per minibatch, a minibatch's samples
    are the same whichever worker runs it and whatever runs beside it.
    """
    import torch
    from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = [TemperatureLogitsWarper(temperature)]  # the order generate(do_sample=True) applies them
    if top_k:
        warpers.append(TopKLogitsWarper(top_k=top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p))

    class SeededDraw(LogitsProcessor):
        def __init__(self) -> None:
            self.gen: Any = None

        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            for w in warpers:
                scores = w(input_ids, scores)
            if self.gen is None:
                self.gen = torch.Generator(device=scores.device).manual_seed(seed)
            probs = torch.softmax(scores.float(), dim=-1)
            drawn = torch.multinomial(probs, num_samples=1, generator=self.gen)
            only = torch.full_like(scores, torch.finfo(scores.dtype).min)
            return only.scatter_(1, drawn, 0.0)

    return SeededDraw()


def minibatch_seed(seed: int, run_seed: int, minibatch: int) -> int:
    """The sampling seed of one minibatch (``-1``: the speed probe): 63 bits of a hash of it, ``--seed`` and
    the run's seed (``RunConfig.seed``, one more each epoch, so epochs draw afresh and a resumed one the same)."""
    digest = hashlib.sha256(f"aspc-hf:{seed}:{run_seed}:{minibatch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class HFBackend(ModelBackend):
    """Generation with ``transformers``; see the module docstring for replay and timing."""

    name = "hf"

    def __init__(self, options: GenerationOptions):
        super().__init__(options)
        self._state: dict[int, _WorkerState] = {}

    def start_worker(self, worker: int) -> None:
        if worker in self._state:  # setup() again before close(): keep the loaded model
            self._version[worker] = 0  # whatever it holds is the new run's version 0
            return
        require_transformers()
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one console owner: the CLI
        device = pick_device(self.options.device, worker)
        from pathlib import Path

        path = Path(self.options.model)
        model = load_causal_lm(path, device=device, dtype=self.options.dtype)
        model.generation_config = only_special_tokens(model.generation_config)
        tok = load_tokenizer(path)
        self._state[worker] = _WorkerState(model, tok, device, path)
        self._version.setdefault(worker, 0)

    def check_prompts(self, worker: int, work: Any, max_new_tokens: int) -> dict[str, int]:
        st = self._worker(worker)
        tokens = plan_prompt_tokens(work, st.tokenizer)
        for pid, row in tokens.items():
            if not row or max(row) >= st.n_embeddings:
                check_prompt_tokens(pid, row, 0, st)  # raises: no prompt, or the tokenizer does not match the model
        check_plan_fits(tokens, max_new_tokens, st.max_positions, "the model's")
        return {pid: len(ids) for pid, ids in tokens.items()}

    def _worker(self, worker: int) -> _WorkerState:
        st = self._state.get(worker)
        if st is None:
            raise BackendError(f"worker {worker} has no model in this process; the engine did not start it")
        return st

    def _load(self, worker: int, weights: Any) -> None:
        st = self._worker(worker)
        state = as_state_dict(weights)
        check_shapes(st.model.state_dict(), state)
        result = st.model.load_state_dict(state, strict=False)
        if result.unexpected_keys:
            raise BackendError(
                f"published weights hold {len(result.unexpected_keys)} tensors the model does not have "
                f"(e.g. {result.unexpected_keys[0]!r}); the trainer and --model must be the same architecture"
            )

    def _execute(self, worker: int, request: GenerationRequest) -> GenerationResult:
        import torch
        from transformers import GenerationConfig

        st = self._worker(worker)
        replay = replay_total(request)
        t0 = time.perf_counter()
        tok = st.tokenizer
        row_ids = []
        for pid, prompt in zip(request.prompt_ids, request.prompts, strict=True):
            text, templated = render_prompt(prompt, tok, pid)
            row_ids.append(tok(text, add_special_tokens=not templated)["input_ids"])
            check_prompt_tokens(pid, row_ids[-1], request.max_new_tokens, st)
        seqs = [ids for ids, n in zip(row_ids, request.n_samples, strict=True) for _ in range(int(n))]
        prompt_len = max(len(s) for s in seqs)
        input_ids = torch.full((len(seqs), prompt_len), st.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), prompt_len), dtype=torch.long)
        for i, s in enumerate(seqs):
            if s:
                input_ids[i, prompt_len - len(s) :] = torch.tensor(s, dtype=torch.long)
                mask[i, prompt_len - len(s) :] = 1
        o = self.options
        # Sampling is the seeded processor's (see _sampler); generate itself always picks greedily.
        cfg = GenerationConfig(max_new_tokens=request.max_new_tokens, do_sample=False, eos_token_id=st.eos_ids,
                               pad_token_id=st.pad_id)  # fmt: skip
        sampler = None
        if o.temperature > 0:
            sampler = _sampler(o.temperature, o.top_p, o.top_k, minibatch_seed(o.seed, request.run_seed, request.minibatch))
        stamps: list[float] = []
        with torch.inference_mode():
            out = st.model.generate(
                input_ids=input_ids.to(st.device),
                attention_mask=mask.to(st.device),
                generation_config=cfg,
                logits_processor=_processors(prompt_len, st.eos_ids, replay, stamps, sampler),
                stopping_criteria=_stop_when(self._closing),
            )
        gen = out[:, prompt_len:].cpu()
        is_eos = torch.isin(gen, torch.tensor(st.eos_ids, dtype=gen.dtype))
        finished = is_eos.any(dim=1)
        first = torch.where(finished, is_eos.to(torch.int8).argmax(dim=1), torch.full_like(finished, gen.shape[1],
                                                                                             dtype=torch.long))
        lens = first.numpy().astype(np.int64)
        ended = finished.numpy()
        payload = None
        if o.return_payload:
            gen_l = gen.tolist()
            texts = tok.batch_decode([g[: int(n)] for g, n in zip(gen_l, lens, strict=True)], skip_special_tokens=True)
            version = self.weights_version(worker)
            payload = []
            k = 0
            for r, n in enumerate(request.n_samples):
                for _ in range(int(n)):
                    payload.append({
                        "prompt_id": request.prompt_ids[r],
                        "prompt": request.prompts[r],
                        "prompt_token_ids": list(seqs[k]),
                        "response_token_ids": gen_l[k][: int(lens[k]) + int(ended[k])],
                        "text": texts[k],
                        "finished": bool(ended[k]),
                        "weights_version": version,
                    })
                    k += 1
        t1 = time.perf_counter()
        # Token index i is done when step i + 1 starts (or when generate returned).
        done_at = np.asarray(stamps[1:] + [t1], dtype=np.float64)
        last_index = np.minimum(lens + ended.astype(np.int64) - 1, done_at.size - 1).clip(min=0)
        finish = np.minimum(done_at[last_index] - t0, t1 - t0)
        return GenerationResult(response_len=lens, finish_offset=finish, elapsed=t1 - t0, payload=payload)

    def close(self) -> None:
        self.release_remote()
        self.wait_idle()
        self._state.clear()


def check_shapes(model_state: dict[str, Any], published: dict[str, Any]) -> None:
    """Refuse published tensors whose shapes are not the model's, before any of them is loaded.

    ``load_state_dict`` raised torch's own multi-line "size mismatch" report,
    cut off mid-word by the one-line failure message.
    """
    wrong = [(k, tuple(v.shape), tuple(model_state[k].shape)) for k, v in published.items()
             if k in model_state and hasattr(v, "shape") and tuple(v.shape) != tuple(model_state[k].shape)]  # fmt: skip
    if wrong:
        name, have, want = wrong[0]
        raise BackendError(
            f"published weights hold {len(wrong)} tensors of another shape than the model's (e.g. {name!r}: {have} "
            f"published, {want} in the model); the trainer and --model must be the same architecture"
        )


def as_state_dict(weights: Any) -> dict[str, Any]:
    """A published weights handle as a state dict: a mapping, a .safetensors file, or a directory of them."""
    import os
    from collections.abc import Mapping
    from pathlib import Path

    if isinstance(weights, Mapping):
        return dict(weights)
    if isinstance(weights, (str, os.PathLike)):
        from safetensors.torch import load_file

        path = Path(weights)
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if not files or not all(f.is_file() and f.suffix == ".safetensors" for f in files):
            raise BackendError(f"published weights {path}: expected a .safetensors file or a directory of them")
        state: dict[str, Any] = {}
        for f in files:
            state.update(load_file(str(f)))
        return state
    raise BackendError(
        f"the trainer published weights as {type(weights).__name__}; publish a state dict, "
        "a .safetensors file or a directory of them"
    )
