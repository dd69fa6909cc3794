"""The ``aspc`` command at scale: wall time, CPU time and peak RSS of the process.

Generates Parquet and JSONL inputs of N prompts (id, prompt text of 8-59
words, ~220 bytes; lengths), and one of short prompts (2-8 words, ~40 bytes),
then runs the CLI as a separate process under ``/usr/bin/time -v`` and prints
one row per case: best and median wall time over ``--repeat`` runs, CPU time
(user + sys) and peak RSS of the best run. A first, untimed run of every case
fills the Numba cache and the file cache (the targets are for a warm cache).

    .venv/bin/python benchmarks/cli_scale.py [--n 1000000] [--n 100000] [--repeat 3] [--cases parquet-one,...] [--floor]
        [--huge-pages] [--against REF]

``--against REF`` runs every case a second time with the code of git commit
REF (checked out in a temporary worktree, same venv), alternating run by
run: an A/B of a change within one run, on a machine whose speed drifts.

Targets for 1,000,000 prompts on a 2-core machine: Parquet, one known length
<= 2 s and <= 1 GB; Parquet, lists of 8 <= 3 s; JSONL, one length <= 5 s;
text through the default predictor <= 20 s; ``aspc simulate`` of that input,
one strategy <= 10 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from aspc.memory import HUGE_PAGES_ENV

ROOT = Path(__file__).resolve().parents[1]
# Word list of the generated prompts: English-like tokens of 2-10 letters.
_VOCAB_SIZE = 4000


def _vocab(rng: np.random.Generator) -> np.ndarray:
    letters = np.frombuffer(b"etaoinshrdlucmfwypvbgkjqxz", dtype=np.uint8)
    p = np.linspace(2.0, 0.2, letters.size)
    p /= p.sum()
    out = []
    for _ in range(_VOCAB_SIZE):
        k = int(rng.integers(2, 11))
        out.append(bytes(rng.choice(letters, size=k, p=p)).decode())
    return np.array(out, dtype=object)


def _prompts(rng: np.random.Generator, vocab: np.ndarray, n: int, lo: int, hi: int):
    """n prompts of lo..hi-1 words, their ids, and 8 lognormal sampled lengths each."""
    words = rng.integers(lo, hi, size=n)
    idx = rng.integers(0, _VOCAB_SIZE, size=int(words.sum()))
    ends = np.cumsum(words)
    starts = ends - words
    flat = vocab[idx]
    prompts = [" ".join(flat[s:e]) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
    ids = [f"p{i:08d}" for i in range(n)]
    mu = rng.normal(5.5, 0.9, size=n)
    samples = np.maximum(1, np.rint(rng.lognormal(mu[:, None], 0.3, size=(n, 8)))).astype(np.int64)
    return prompts, ids, samples


def _write(table: pa.Table, path: Path) -> None:
    if not path.exists():  # files already there stay (a run in progress may be reading them)
        pq.write_table(table, path)


def make_inputs(n: int, folder: Path, seed: int = 0) -> dict[str, Path]:
    """Write the benchmark inputs for ``n`` prompts into ``folder`` (cached by name)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "one.parquet": folder / f"one-{n}.parquet",
        "lists.parquet": folder / f"lists-{n}.parquet",
        "one.jsonl": folder / f"one-{n}.jsonl",
        "text.parquet": folder / f"text-{n}.parquet",
        "short.parquet": folder / f"short-{n}.parquet",
        "chat.parquet": folder / f"chat-{n}.parquet",
        "chat.jsonl": folder / f"chat-{n}.jsonl",
    }
    if all(p.exists() for p in paths.values()):
        return paths
    rng = np.random.default_rng(seed)
    vocab = _vocab(rng)
    prompts, ids, samples = _prompts(rng, vocab, n, 8, 60)
    one = samples[:, 0]
    short, _, _ = _prompts(rng, vocab, n, 2, 9)
    _write(pa.table({"id": ids, "prompt": short, "length": one}), paths["short.parquet"])
    _write(pa.table({"id": ids, "prompt": prompts, "length": one}), paths["one.parquet"])
    lists = pa.ListArray.from_arrays(pa.array(np.arange(0, 8 * n + 1, 8, dtype=np.int32)), pa.array(samples.ravel()))
    _write(pa.table({"id": ids, "prompt": prompts, "lengths": lists}), paths["lists.parquet"])
    _write(pa.table({"id": ids, "prompt": prompts, "length": one}), paths["text.parquet"])
    # verl's layout: each prompt a chat, list<struct<role, content>>, here a system turn and the user's.
    users = pa.StructArray.from_arrays([pa.array(["user"] * n), pa.array(prompts)], names=["role", "content"])
    system = pa.StructArray.from_arrays([pa.array(["system"] * n), pa.array(["Think step by step."] * n)],
                                        names=["role", "content"])  # fmt: skip
    turns = pa.concat_arrays([system, users]).take(pa.array(np.arange(2 * n).reshape(2, n).T.ravel()))
    chats = pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32)), turns)
    _write(pa.table({"id": ids, "prompt": chats, "length": one}), paths["chat.parquet"])
    system_turn = {"role": "system", "content": "Think step by step."}
    for name, record in (
        ("one.jsonl", lambda a, p, x: {"id": a, "prompt": p, "length": x}),
        # The same chats as chat.parquet, as OpenAI-style JSON lines.
        ("chat.jsonl", lambda a, p, x: {"id": a, "prompt": [system_turn, {"role": "user", "content": p}], "length": x}),
    ):
        if paths[name].exists():
            continue
        with open(paths[name], "w", encoding="utf-8") as fh:
            for i in range(0, n, 100_000):
                rows = zip(ids[i : i + 100_000], prompts[i : i + 100_000], one[i : i + 100_000].tolist(), strict=True)
                fh.write("".join(json.dumps(record(a, p, x)) + "\n" for a, p, x in rows))
    return paths


def cases(paths: dict[str, Path], out: Path) -> dict[str, list[str]]:
    plan = str(out / "plan.parquet")
    text_plan = str(out / "text-plan.parquet")
    return {
        "parquet-one": ["compile", str(paths["one.parquet"]), "--length-field", "length", "-o", plan, "--quiet"],
        "parquet-one-short": ["compile", str(paths["short.parquet"]), "--length-field", "length", "-o", plan, "--quiet"],
        "parquet-lists8": ["compile", str(paths["lists.parquet"]), "--length-field", "lengths", "-o", plan, "--quiet"],
        "parquet-chat": ["compile", str(paths["chat.parquet"]), "--length-field", "length", "-o", plan, "--quiet"],
        "jsonl-one": ["compile", str(paths["one.jsonl"]), "--length-field", "length", "-o", plan, "--quiet"],
        "jsonl-chat": ["compile", str(paths["chat.jsonl"]), "--length-field", "length", "-o", plan, "--quiet"],
        "text-default": ["compile", str(paths["text.parquet"]), "-o", text_plan, "--quiet"],
        "simulate-asp": [
            "simulate", str(paths["text.parquet"]), "--length-field", "length", "--strategies", "asp", "--quiet",
        ],
        "run-sim": ["run", text_plan, "--quiet"],
    }


_WALL = re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)")


def _measure(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    aspc = shutil.which("aspc", path=str(Path(sys.executable).parent)) or "aspc"
    res = subprocess.run(
        ["/usr/bin/time", "-v", aspc, *argv], env=env, capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise SystemExit(f"aspc {' '.join(argv)} failed (rc {res.returncode}):\n{res.stderr[-2000:]}")
    err = res.stderr
    m = _WALL.search(err)
    assert m, err[-500:]
    wall = int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", err).group(1))
    sys_t = float(re.search(r"System time \(seconds\): ([\d.]+)", err).group(1))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1))
    return {"wall": wall, "cpu": user + sys_t, "rss_mb": rss / 1024}


@contextlib.contextmanager
def _worktree(ref: str) -> Iterator[Path]:
    """The repository's code at commit ``ref``, in a temporary git worktree removed on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="aspc-ref-"))
    git = ["git", "-C", str(ROOT), "worktree"]
    subprocess.run([*git, "add", "--detach", str(tmp), ref], check=True, capture_output=True)
    try:
        yield tmp
    finally:
        subprocess.run([*git, "remove", "--force", str(tmp)], check=False, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def floor(paths: dict[str, Path], repeat: int) -> None:
    """What any compile of ``one.parquet`` that writes today's plan bytes must do, one step after another.

    The prompt column can be gathered only once the dispatch order is known,
    and encoded only once gathered; pyarrow encodes a column chunk on one
    thread (zstd, dictionary attempt). Reading the input comes first. So
    start-up + read + gather + encode of that one column is a floor under
    the command's wall time for a byte-identical plan on this machine
    (the partition, anneal, order and the other columns come on top or
    beside). Best of ``repeat``, in process, except the start-up.
    """
    import time

    from aspc.emit import stitch
    from aspc.emit.halves import encode_in_halves
    from aspc.emit.plan import _WRITE_OPTIONS

    def best(fn) -> float:
        out = []
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return min(out)

    start = best(lambda: subprocess.run([sys.executable, "-c", "import numba, pyarrow.parquet, aspc.compiler"],
                                        check=True))
    src = paths["one.parquet"]
    read = best(lambda: pq.read_table(src, columns=["id", "prompt", "length"]))
    prompts = pq.read_table(src, columns=["prompt"])["prompt"].combine_chunks()
    order = pa.array(np.random.default_rng(0).permutation(len(prompts)))
    gather = best(lambda: prompts.take(order))
    one = pa.table({"prompt": prompts.take(order)})

    def encode() -> None:
        sink = pa.BufferOutputStream()
        pq.write_table(one, sink, **_WRITE_OPTIONS)

    enc = best(encode)
    # What aspc does from aspc.emit.halves.HALVES_ROWS rows on: the same bytes, two threads.
    halves = best(lambda: encode_in_halves(one, _WRITE_OPTIONS, stitch._to_buffer))
    print(f"floor, {len(prompts):,} prompts ({prompts.nbytes / 1e6:.0f} MB of prompt column): start-up "
          f"(python, numba, pyarrow, aspc.compiler) {start:.2f} s + read {read:.2f} s + gather {gather:.2f} s + "
          f"encode the prompt column alone {enc:.2f} s = {start + read + gather + enc:.2f} s; "
          f"with the column encoded in two halves on two threads ({halves:.2f} s): "
          f"{start + read + gather + halves:.2f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, action="append", help="prompts per input (repeatable) [100000, 1000000]")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per case (after one warm-up)")
    ap.add_argument("--repeat-slow", type=int, default=1, help="timed runs of text-default and simulate-asp")
    ap.add_argument("--cases", default="", help="comma list of cases to run (default: all)")
    ap.add_argument("--data", type=Path, default=None, help="folder for the generated inputs (kept between runs)")
    ap.add_argument("--floor", action="store_true", help="also time the steps a byte-identical plan cannot skip")
    ap.add_argument(
        "--huge-pages", action="store_true",
        help="also run every case with ASPC_HUGE_PAGES=1 (the kernel's huge-page policy), runs alternating",
    )
    ap.add_argument(
        "--against", metavar="REF", default=None,
        help="also run every case with the code of git commit REF (a temporary worktree), runs alternating",
    )
    args = ap.parse_args()
    with _worktree(args.against) if args.against else contextlib.nullcontext() as ref_tree:
        run_all(args, ref_tree)


def run_all(args: argparse.Namespace, ref_tree: Path | None) -> None:
    sizes = args.n or [100_000, 1_000_000]
    data = args.data or Path(tempfile.gettempdir()) / "aspc-cli-scale"
    path = os.environ.get("PYTHONPATH", "")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + path}
    env.pop(HUGE_PAGES_ENV, None)
    variants = {"": env} | ({" (huge pages)": {**env, HUGE_PAGES_ENV: "1"}} if args.huge_pages else {})
    if ref_tree is not None:
        variants[f" ({args.against})"] = {**env, "PYTHONPATH": str(ref_tree) + os.pathsep + path}
    wanted = [c for c in args.cases.split(",") if c]
    # The machine's 1-minute load average while a case ran: wall time on a
    # shared machine is only comparable at a similar load; CPU time is.
    print("| case | n | command | runs | wall best s | wall median s | CPU s (best run) | peak RSS MB | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        paths = make_inputs(n, data)
        if args.floor:
            floor(paths, args.repeat)
        with tempfile.TemporaryDirectory() as tmp:
            for name, argv in cases(paths, Path(tmp)).items():
                if wanted and name not in wanted:
                    continue
                for venv in variants.values():
                    _measure(argv, venv)  # warm: Numba cache (each tree its own), file cache
                reps = args.repeat_slow if name in ("text-default", "simulate-asp") else args.repeat
                # Variants alternate run by run, so a change in the machine's state hits both alike.
                runs: dict[str, list] = {label: [] for label in variants}
                for _ in range(reps):
                    for label, venv in variants.items():
                        runs[label].append(_measure(argv, venv))
                load = os.getloadavg()[0]
                shown = " ".join(a if not a.startswith(("/", tmp)) else Path(a).name for a in argv)
                for label, rs in runs.items():
                    best = min(rs, key=lambda r: r["wall"])
                    print(
                        f"| {name}{label} | {n:,} | `aspc {shown}` | {len(rs)} | {best['wall']:.2f} | "
                        f"{statistics.median(r['wall'] for r in rs):.2f} | {best['cpu']:.2f} | {best['rss_mb']:.0f} | "
                        f"{load:.1f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
