"""What keeping the waiting samples' tokens costs a run: ``RUN/payloads/`` parts written, read back, released.

    .venv/bin/python benchmarks/payload_parts.py [--samples 2048 --tokens 4096 --text 16000 --per-commit 256]

Synthetic payloads shaped as the hf / vllm backends return them (random token
ids, 200 prompt tokens, a text of ``--text`` bytes), held by
``PendingPayloads`` as the recorder holds them: each commit writes the
samples whose minibatches it commits as one part (encoding included), a
resume reads every part back, and releasing the samples deletes the parts.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from aspc.runtime.record.payloads import PAYLOAD_DIR, PendingPayloads, read_payloads


class _Work:
    """The WorkPlan fields the payload parts read: one sample per prompt."""

    def __init__(self, n: int):
        self.prompt_ids = np.array([f"p{i}" for i in range(n)])
        self.sample_row = np.arange(n)
        self.sample_index = np.zeros(n, dtype=np.int64)
        self.n_samples = np.ones(n, dtype=np.int64)

    def row_first_samples(self) -> np.ndarray:
        return np.arange(len(self.prompt_ids))


def measure(n: int, tokens: int, text: int, per_commit: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    payloads = [
        {"prompt_id": f"p{i}", "prompt": "x" * 200, "prompt_token_ids": rng.integers(0, 150_000, 200).tolist(),
         "response_token_ids": rng.integers(0, 150_000, tokens).tolist(), "text": "y" * text, "finished": True,
         "weights_version": 0}
        for i in range(n)
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        run_dir, work, held = Path(tmp), _Work(n), PendingPayloads()
        held.add(np.arange(n), payloads)
        finished = np.zeros(n, dtype=bool)
        write = 0.0
        for a in range(0, n, per_commit):
            finished[a : a + per_commit] = True
            t0 = time.perf_counter()
            held.write(run_dir, finished, work)
            write += time.perf_counter() - t0
        size = sum(p.stat().st_size for p in (run_dir / PAYLOAD_DIR).iterdir())
        t0 = time.perf_counter()
        assert len(read_payloads(run_dir)) == n
        read = time.perf_counter() - t0
        t0 = time.perf_counter()
        held.release(np.arange(n))
        release = time.perf_counter() - t0
        assert not any((run_dir / PAYLOAD_DIR).iterdir())
    return {"mb": size / 1e6, "write_s": write, "read_s": read, "release_s": release}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, nargs="+", default=[2048, 512])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 1024])
    ap.add_argument("--text", type=int, nargs="+", default=[16000, 4000])
    ap.add_argument("--per-commit", type=int, nargs="+", default=[256, 64])
    args = ap.parse_args()
    for n, tok, text, per in zip(args.samples, args.tokens, args.text, args.per_commit, strict=True):
        r = measure(n, tok, text, per)
        print(f"{n} samples x {tok} tokens, {text} B text, {per} per commit: {r['mb']:.1f} MB in parts, "
              f"written (encoding included) in {r['write_s']:.2f} s, read back in {r['read_s']:.2f} s, "
              f"released (parts deleted) in {r['release_s']:.3f} s")  # fmt: skip


if __name__ == "__main__":
    main()
