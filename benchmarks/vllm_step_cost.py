"""Seconds per vLLM decode step against the number of active sequences, on this machine.

    .venv-vllm/bin/python benchmarks/vllm_step_cost.py [--model smollm2-135m] [--sizes 1,2,3,4,5,8,16]
        [--tokens 48] [--repeats 2]

One engine with aspc's defaults (``aspc.runtime.backends.vllm.engine_kwargs``:
on a CPU eager mode and a 1 GiB KV cache). For each batch size ``s`` it
enqueues ``s`` requests of the same short prompt, each forced to generate
exactly ``--tokens`` tokens, and times every ``llm_engine.step()``: the first
step (prefill plus the first token) apart, the decode steps after it by their
median. It then fits ``step = a + b·active`` over the sizes by least squares
and prints what that means for a plan: a minibatch of ``s`` sequences and
``L`` steps costs ``L·(a + b·s)``, so grouping similar lengths (fewer steps
for the same tokens) saves ``a`` per step removed and nothing on ``b``.

The machine may be shared: the load average is printed beside the figures;
sizes run in interleaved order across repeats so load drift hits all alike.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--sizes", default="1,2,3,4,5,8,16")
    ap.add_argument("--tokens", type=int, default=48, help="tokens each sequence generates")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="auto", help="as aspc run --dtype (auto: aspc's default for the device)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    if importlib.util.find_spec("vllm") is None:  # an optional engine: skip as the benchmarks without their data do
        print("skipped: vllm is not installed (make vllm; run with .venv-vllm/bin/python)")
        return 0

    import numpy as np

    from aspc.runtime.backends.models import resolve_model
    from aspc.runtime.backends.vllm import configure_vllm_env, engine_kwargs

    configure_vllm_env()
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    class _Opt:  # the fields engine_kwargs reads
        model = str(resolve_model(args.model))
        seed = 0
        dtype = args.dtype
        engine_args: dict = {}

    llm = LLM(**engine_kwargs(_Opt, 0, 0.85, current_platform.is_cpu()))
    engine = llm.llm_engine
    tok = llm.get_tokenizer()
    prompt = tok("Write a short story about a lighthouse keeper.")["input_ids"]
    sp = SamplingParams(max_tokens=args.tokens, min_tokens=args.tokens, ignore_eos=True, temperature=1.0)
    sizes = [int(s) for s in args.sizes.split(",")]

    def one(size: int) -> tuple[float, list[float]]:
        llm.enqueue([{"prompt_token_ids": prompt}] * size, sampling_params=[sp] * size, use_tqdm=False)
        times = []
        while engine.has_unfinished_requests():
            t0 = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t0)
        return times[0], times[1:]

    one(2)  # warm-up: first calls allocate
    first: dict[int, list[float]] = {s: [] for s in sizes}
    decode: dict[int, list[float]] = {s: [] for s in sizes}
    for rep in range(args.repeats):
        for s in sizes if rep % 2 == 0 else sizes[::-1]:
            f, d = one(s)
            first[s].append(f)
            decode[s].extend(d)
    med = {s: float(np.median(decode[s])) for s in sizes}
    x = np.column_stack([np.ones(len(sizes)), np.asarray(sizes, dtype=float)])
    (a, b), *_ = np.linalg.lstsq(x, np.asarray([med[s] for s in sizes]), rcond=None)
    load = os.getloadavg()
    print(f"model {args.model} ({llm.llm_engine.model_config.dtype}), {args.tokens} tokens per sequence, load average {load[0]:.2f} {load[1]:.2f}")
    print(f"{'active':>6} {'decode step ms (median)':>24} {'ms per sequence':>16} {'first step ms':>14}")
    for s in sizes:
        print(f"{s:6d} {1e3 * med[s]:24.1f} {1e3 * med[s] / s:16.1f} {1e3 * float(np.median(first[s])):14.1f}")
    print(f"fit: step = {1e3 * a:.1f} ms + {1e3 * b:.2f} ms x active  (a/b = {a / b if b > 0 else float('inf'):.1f})")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"sizes": sizes, "decode_median_s": med, "first_step_median_s":
                       {s: float(np.median(first[s])) for s in sizes}, "a": a, "b": b, "load": load}, fh, indent=2)
    sys.stdout.flush()
    # vLLM's engine processes outlive a plain return here (its idle CPU worker
    # spins): shut the engine down, then leave without waiting on its threads.
    llm.llm_engine.engine_core.shutdown()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
