"""Observed response lengths from verl's rollout dumps (``trainer.rollout_data_dir``).

verl's ``RayPPOTrainer._log_rollout_data`` writes one JSONL file per trainer
step, ``{global_step}.jsonl``, one line per generated sample, with at least

- ``input``: the prompt token ids decoded with ``skip_special_tokens=True``
  (the chat template's text with its special tokens removed, left padding
  gone),
- ``output``: the response decoded the same way,
- ``gts``, ``score``, ``step``, and any reward extras.

No prompt id is written, so samples are matched to plan prompts **by
content**: a prompt matches a dump line when its last user message (all
whitespace removed, so tokenizer decoding quirks do not matter) appears in
the line's ``input`` starting at a word boundary, and every earlier message
of the prompt appears before it. Prompts with identical messages receive the
same observed lengths. Response lengths are counted with a tokenizer when
given, else estimated from UTF-8 bytes (and the result says so).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aspc.errors import InputError
from aspc.io.readers import json_int

STEP_FILE = re.compile(r"^(\d+)\.jsonl$")
BYTES_PER_TOKEN = 4.0  # as aspc.io's prompt estimate: rough tokens per byte of English BPE text
_WS = re.compile(r"\s+")
_PREFIX = 24  # characters of a key indexed for the word-boundary lookup


@dataclass
class RolloutLengths:
    """What a rollout directory gave."""

    lengths: dict[str, np.ndarray]  # prompt id -> observed response lengths (tokens, float64)
    n_samples: int  # dump lines read
    n_matched: int  # dump lines matched to at least one prompt
    n_files: int  # step files read
    counted_with: str  # "tokenizer" or "bytes" (estimate: UTF-8 bytes / 4)
    unmatched_examples: list[str] = field(default_factory=list)  # a few inputs that matched no prompt


def step_files(path: str | os.PathLike) -> list[Path]:
    """The step files of a rollout directory, in step order."""
    p = Path(path)
    found = [(int(m.group(1)), f) for f in p.iterdir() if f.is_file() and (m := STEP_FILE.match(f.name))]
    return [f for _, f in sorted(found)]


def is_rollout_dir(path: str | os.PathLike) -> bool:
    """True for a directory holding verl step dumps (``N.jsonl``) and no aspc run log."""
    p = Path(path)
    return p.is_dir() and not (p / "samples").is_dir() and bool(step_files(p))


def rollout_dir_hash(path: str | os.PathLike) -> str:
    """sha256 over the step files' names and bytes (the plan records it, never the path)."""
    h = hashlib.sha256()
    for f in step_files(path):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _squash(s: str) -> str:
    return _WS.sub("", s)


def _squash_with_starts(s: str) -> tuple[str, list[int]]:
    """``s`` without whitespace, and the positions in it where a word started in ``s``."""
    parts = _WS.split(s)
    out, starts, pos = [], [], 0
    for part in parts:
        if part:
            starts.append(pos)
            out.append(part)
            pos += len(part)
    return "".join(out), starts


def _messages(stored: str) -> list[str]:
    if stored.startswith('[{"role":'):
        try:
            value = json.loads(stored)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
            return [str(m.get("content", "")) for m in value]
    return [stored]


class _ContentIndex:
    """Plan prompts keyed by their squashed last message, for lookup inside dump inputs."""

    def __init__(self, ids: list[str], prompts: list[str]) -> None:
        self.by_key: dict[str, list[int]] = {}
        self.earlier: list[list[str]] = []
        self.keys: list[str] = []
        for i, p in enumerate(prompts):
            msgs = [_squash(m) for m in _messages(p)]
            msgs = [m for m in msgs if m] or [""]
            self.keys.append(msgs[-1])
            self.earlier.append(msgs[:-1])
            self.by_key.setdefault(msgs[-1], []).append(i)
        self.prefix: dict[str, list[str]] = {}
        for key in self.by_key:
            if key:
                self.prefix.setdefault(key[:_PREFIX], []).append(key)
        self.prefix_lengths = sorted({len(k) for k in self.prefix})
        self.ids = ids

    def _verify(self, text: str, at: int, key: str) -> list[int]:
        if not text.startswith(key, at):
            return []
        out = []
        for i in self.by_key[key]:
            pos, ok = 0, True
            for m in self.earlier[i]:
                j = text.find(m, pos, at)
                if j < 0:
                    ok = False
                    break
                pos = j + len(m)
            if ok:
                out.append(i)
        return out

    def match(self, raw: str) -> list[int]:
        """Plan rows whose content the dump input holds (the longest last message wins)."""
        text, starts = _squash_with_starts(raw)
        for positions in (starts, range(len(text))):  # word starts first; any position if none matched
            best: list[int] = []
            best_len = -1
            for at in positions:
                for n in self.prefix_lengths:
                    for key in self.prefix.get(text[at : at + n], ()):
                        if len(key) > best_len:
                            rows = self._verify(text, at, key)
                            if rows:
                                best, best_len = rows, len(key)
            if best:
                return best
        return []


def _response_tokens(outputs: list[str], tokenizer: str | Any | None) -> np.ndarray:
    if tokenizer is None:
        return np.array([max(1, math.ceil(len(o.encode("utf-8")) / BYTES_PER_TOKEN)) for o in outputs], dtype=np.float64)
    from aspc.io.tokens import count_tokens, load_tokenizer

    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    return np.asarray(count_tokens(tok, outputs), dtype=np.float64)


def read_rollout_lengths(
    path: str | os.PathLike, ids: list[str], prompts: list[str], *, tokenizer: str | Any | None = None
) -> RolloutLengths:
    """Observed response lengths per plan prompt from a verl rollout directory.

    Parameters
    ----------
    path
        ``trainer.rollout_data_dir`` of a verl run.
    ids, prompts
        The prompts being compiled (stored form: text or compact chat JSON).
    tokenizer
        Counts response tokens: a spec for ``aspc.io.tokens.load_tokenizer``
        (directory or ``"qwen"``) or a loaded one; ``None``: UTF-8 bytes / 4.

    Raises
    ------
    InputError
        Not a rollout directory, malformed lines, or lines without ``input``
        and ``output`` strings; the message names the file and line.
    """
    root = Path(path)
    files = step_files(root) if root.is_dir() else []
    if not files:
        raise InputError(f"{root}: no verl rollout dumps (N.jsonl files) found; pass trainer.rollout_data_dir")
    inputs: list[str] = []
    outputs: list[str] = []
    for f in files:
        with open(f, encoding="utf-8", errors="strict") as fh:
            try:
                # Only \n ends a line: verl writes with ensure_ascii=False, so a response may hold
                # U+2028/U+2029/U+0085, at which str.splitlines would cut a valid line in two.
                lines = fh.read().split("\n")
            except UnicodeDecodeError:
                raise InputError(f"{f.name}: not valid UTF-8; is this a verl rollout dump?") from None
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{root.name}/{f.name}: line {lineno}"
            try:
                rec = json.loads(line, parse_int=json_int)
            except json.JSONDecodeError as exc:
                last = lineno == len(lines) or (lineno == len(lines) - 1 and not lines[-1])
                cut = " (the file's last line: cut off by an interrupted run? delete that line)" if last else ""
                raise InputError(f"{where}: malformed JSON ({exc.msg}){cut}") from None
            except RecursionError:
                raise InputError(f"{where}: JSON nested too deeply; is this a verl rollout dump?") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("input"), str) or not isinstance(
                rec.get("output"), str
            ):
                raise InputError(
                    f"{root.name}/{f.name}: line {lineno}: expected verl's rollout fields 'input' and 'output' (strings)"
                )
            for key in ("input", "output"):
                try:
                    rec[key].encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate (\udc00): valid JSON, not text
                    raise InputError(f"{where}: '{key}' holds a lone UTF-16 surrogate, which is not text; "
                                     "is this a verl rollout dump?") from None  # fmt: skip
            inputs.append(rec["input"])
            outputs.append(rec["output"])
    index = _ContentIndex(ids, prompts)
    memo: dict[str, list[int]] = {}
    rows_of = []
    for s in inputs:
        if s not in memo:
            memo[s] = index.match(s)
        rows_of.append(memo[s])
    lens = _response_tokens(outputs, tokenizer)
    found: dict[int, list[float]] = {}
    matched = 0
    unmatched: list[str] = []
    for k, rows in enumerate(rows_of):
        if rows:
            matched += 1
        elif len(unmatched) < 3:
            unmatched.append(inputs[k][:80])
        for r in rows:
            found.setdefault(r, []).append(float(lens[k]))
    return RolloutLengths(
        lengths={ids[r]: np.asarray(v, dtype=np.float64) for r, v in sorted(found.items())},
        n_samples=len(inputs),
        n_matched=matched,
        n_files=len(files),
        counted_with="bytes" if tokenizer is None else "tokenizer",
        unmatched_examples=unmatched,
    )
