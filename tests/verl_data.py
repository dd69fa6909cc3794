"""Synthetic GSM8K-style datasets in verl's layout (``examples/data_preprocess/gsm8k.py``), made offline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
NAMES = ("Natalia", "Weng", "Betty", "Julie", "James", "Mark", "Albert", "Ken", "Alexis", "Tina")
ITEMS = ("clips", "apples", "books", "pencils", "stamps", "marbles", "cookies", "shells")


def problems(n: int, seed: int = 0, long_every: int = 0) -> list[dict[str, str]]:
    """``n`` distinct word problems with GSM8K-style answers (``... #### 42``).

    Every ``long_every``-th problem (0: none) carries a long preamble, so a
    prompt-length limit has something to exclude.
    """
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        a, b, c = (int(x) for x in rng.integers(2, 90, size=3))
        name, item = NAMES[i % len(NAMES)], ITEMS[(i // len(NAMES)) % len(ITEMS)]
        q = (
            f"{name} had {a} {item} on day {i}. She bought {b} more and then gave away {c % (a + b)}. "
            f"How many {item} does {name} have now?"
        )
        if long_every and i % long_every == long_every - 1:
            q = " ".join(f"Fact {k}: {name} counted {a + k} {item} before lunch." for k in range(40)) + " " + q
        total = a + b - c % (a + b)
        out.append({"question": q, "answer": f"{name} has {a} + {b} - {c % (a + b)} = {total} {item}.\n#### {total}"})
    return out


def gsm8k_row(example: dict[str, str], idx: int, split: str = "train") -> dict:
    """One row as verl's gsm8k.py ``process_fn`` builds it."""
    question_raw, answer_raw = example["question"], example["answer"]
    solution = answer_raw.split("#### ")[1].replace(",", "")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question_raw + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": solution},
        "extra_info": {"split": split, "index": idx, "answer": answer_raw, "question": question_raw},
    }


def write_gsm8k(path: Path, n: int, seed: int = 0, long_every: int = 0) -> Path:
    """A verl GSM8K-style Parquet file written with pyarrow (no ``datasets`` needed)."""
    rows = [gsm8k_row(ex, i) for i, ex in enumerate(problems(n, seed, long_every))]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
