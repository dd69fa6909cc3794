"""Observed response lengths from verl's rollout dumps (``trainer.rollout_data_dir``).

verl's ``RayPPOTrainer._log_rollout_data`` writes one JSONL file per trainer
step, ``{global_step}.jsonl``, one line per generated sample, with at least

- ``input``: the prompt token ids decoded with ``skip_special_tokens=True``
  (the chat template's text with its special tokens removed, left padding
  gone),
- ``output``: the response decoded the same way,
- ``gts``, ``score``, ``step``, and any reward extras.

No prompt id is written, so samples are matched to prompts **by content**.
Both sides are compared in NFC (a normalizing tokenizer such as Qwen2's
encodes NFC, so the dump decodes it) with all whitespace removed (decoding
may change it). A prompt is a *candidate* for a dump line when

1. its messages (system prompt and every turn, whatever their roles) all
   occur in the line's ``input`` in order, and
2. its last message ends the conversation: nothing follows it but template
   text, i.e. text that the inputs of the same step file end with (all of
   them, or any half when more than two: an input verl cut short lacks it;
   the generation prompt, e.g. ``assistant``; verl renders one template per run).

The line goes to the candidate that accounts for the **most message text**
(a multi-turn or system-prompted conversation beats a prompt equal to one of
its turns), then to one whose last message starts at a word boundary; where
candidates tie, having different messages that squash to the same text, the
ones with the most message text occurring exactly (whitespace included) in
the input win. Prompts with identical messages share the line's length.
Limits: template text is only told apart from a conversation by that common
ending, so where every input of a step file ends with the same words
(one prompt's samples alone), a prompt equal to one of the turns is accepted;
text the tokenizer turns into special tokens (``<|endoftext|>`` written in a
prompt) is missing from the dump: with a tokenizer it is removed from the
prompts too (its special tokens, as its added-token rules find them), without
one such a prompt does not match; a prompt and its twin without that text
render to the same input, so they share its samples.
Cost: each distinct input of a step file is squashed once and looked up
only at the points of its template tail, by bisection in the sorted reversed
last messages: near-linear in the dump's size.
Response lengths are counted with a tokenizer when given, else estimated
from UTF-8 bytes (and the result says so).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import unicodedata
from bisect import bisect_right
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

from aspc.errors import InputError
from aspc.io.readers import json_int
from aspc.io.tokens import QWEN25_KEPT_TOKENS, QWEN25_SPECIAL_TOKENS
from aspc.io.word_chars import is_white_space, is_word_char, skip_white_space

# Template text a step file's inputs end with is looked for in their last this many characters (a chat
# template's generation prompt is tens of them).
_TAIL_SPAN = 4096

STEP_FILE = re.compile(r"^(\d+)\.jsonl$")
BYTES_PER_TOKEN = 4.0  # as aspc.io's prompt estimate: rough tokens per byte of English BPE text
_WS = re.compile(r"\s+")
_HEAD = 8  # characters of a last message's end that rule most places of an input out at once


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


def _nfc(s: str) -> str:
    """``s`` in NFC, as a normalizing tokenizer (Qwen2's) encodes it and so verl's dump decodes it."""
    return s if unicodedata.is_normalized("NFC", s) else unicodedata.normalize("NFC", s)


def _common_start(a: str, b: str) -> int:
    """The length of the longest common start of ``a`` and ``b`` (bisection over C-speed compares)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.startswith(b[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_ending(texts: set[str]) -> str:
    """The longest text most of ``texts`` end with: every one of them, or of any half when more than two.

    A half, not all: an input whose end verl cut off (``data.truncation`` right or middle on an over-long
    prompt) ends without the template's tail, and the ending of all the inputs then shrank to nothing, so
    no other sample of its step file matched. Sorted reversed, the strings sharing a start sit together,
    and a window of them shares what its first and last share. Only the last _TAIL_SPAN characters count.
    """
    ends = sorted(t[-_TAIL_SPAN:][::-1] for t in texts)
    if not ends:
        return ""
    h = min(len(ends), max(2, (len(ends) + 1) // 2))  # how many must share it
    shared = [_common_start(ends[i], ends[i + h - 1]) for i in range(len(ends) - h + 1)]
    i = int(np.argmax(shared))  # the first window sharing the most
    return ends[i][: shared[i]][::-1]


def _added_tokens(tok: Any) -> list[Any]:
    """The added tokens of an aspc tokenizer (``AddedToken``-like: content, special, lstrip, rstrip,
    single_word, normalized); [] for a tokenizer aspc cannot look into."""
    core = getattr(tok, "_tok", None)  # aspc.io.tokens' Hugging Face tokenizer: its tokenizers.Tokenizer
    if core is not None and hasattr(core, "get_added_tokens_decoder"):
        return list(core.get_added_tokens_decoder().values())
    if getattr(tok, "kind", "") == "qwen":  # the Qwen BPE (tiktoken): verl runs the Hugging Face Qwen2.5 one
        return [_Added(t, special=True) for t in QWEN25_SPECIAL_TOKENS] + [
            _Added(t, special=False) for t in QWEN25_KEPT_TOKENS
        ]
    return []


@dataclass(frozen=True)
class _Added:
    content: str
    special: bool = True
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False
    normalized: bool = False


def _special_remover(tok: Any) -> Callable[[str], str] | None:
    """``text`` -> what verl's encode + decode(skip_special_tokens=True) leaves of it, up to NFC: the
    tokenizer's special tokens' texts gone. None when it has none.

    As ``tokenizers`` extracts added tokens: the un-normalized ones from the raw text first, the normalized
    ones from each piece between them after normalizing (NFC here), leftmost then longest; a non-special
    added token is found too (so a special one inside it stays) and kept as its content, as decode writes it."""
    added = {t.content: t for t in _added_tokens(tok) if t.content}
    if not any(t.special for t in added.values()):
        return None

    def pattern(normalized: bool) -> re.Pattern[str] | None:
        # Literals alone, longest first: re then skips to their first characters at C speed (named groups or
        # lookarounds in the alternation made it ~10,000x slower).
        texts = sorted((c for c, t in added.items() if bool(t.normalized) == normalized), key=len, reverse=True)
        return re.compile("|".join(map(re.escape, texts))) if texts else None

    def drop(p: re.Pattern[str] | None, s: str) -> list[tuple[str, bool]]:
        """``s`` cut at ``p``'s tokens: (piece, is a token) for the pieces between them and the tokens kept
        (non-special ones), each as its content alone: decoding writes no whitespace it stripped."""
        out, pos, at = [], 0, 0
        while p is not None and (m := p.search(s, at)):
            t, start, end = added[m.group()], m.start(), m.end()
            if t.single_word and ((start and is_word_char(s[start - 1])) or (end < len(s) and is_word_char(s[end]))):
                at = end  # inside a word: not this token; the search goes on after it, as tokenizers' does
                continue
            while t.lstrip and start > pos and is_white_space(s[start - 1]):  # it takes the whitespace before it along
                start -= 1
            if t.rstrip:
                end = skip_white_space(s, end)
            out += [(s[pos:start], False), (_nfc(t.content) if not t.special else "", True)]
            pos = at = end
        return [*out, (s[pos:], False)]

    def remove(text: str) -> str:
        # A token the first pass extracted is never searched again (tokenizers does not split it).
        return "".join(
            piece if token else "".join(q for q, _ in drop(norm, _nfc(piece))) for piece, token in drop(raw, text)
        )

    raw, norm = pattern(False), pattern(True)
    return remove


def _messages(stored: str) -> list[str]:
    if stored.startswith('[{"role":'):
        try:
            value = json.loads(stored)
        except (json.JSONDecodeError, RecursionError):  # RecursionError: text nesting '[' past Python's parser
            value = None
        if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
            return [str(m.get("content", "")) for m in value]
    return [stored]


class _ContentIndex:
    """Plan prompts keyed by their squashed last message, found where it ends a dump input."""

    def __init__(self, prompts: list[str], clean: Callable[[str], str] = _nfc) -> None:
        """``clean``: a message -> the text verl's dump holds of it (NFC; special tokens' texts removed)."""
        self.by_key: dict[str, list[int]] = {}
        self.earlier: list[list[str]] = []
        self.weight: list[int] = []  # squashed characters of every message: the text the prompt accounts for
        self.exact: list[list[str]] = []  # the messages as the dump holds them: what decides between squashed twins
        for i, p in enumerate(prompts):
            exact = [m for m in map(clean, _messages(p)) if m.strip()]
            msgs = [_squash(m) for m in exact] or [""]
            self.earlier.append(msgs[:-1])
            self.weight.append(sum(map(len, msgs)))
            self.exact.append(exact)
            self.by_key.setdefault(msgs[-1], []).append(i)
        # Last messages reversed, sorted: the ones ending at a point of an input are found by bisection.
        self.reversed = sorted(key[::-1] for key in self.by_key if key)
        self.longest = max(map(len, self.reversed), default=0)
        # A quick no: the first _HEAD characters of the long ones, and the short ones whole.
        self.heads = {k[:_HEAD] for k in self.reversed if len(k) >= _HEAD}
        self.short = {k for k in self.reversed if len(k) < _HEAD}
        self.short_lengths = sorted({len(k) for k in self.short})

    def _ending_at(self, before: str) -> list[str]:
        """The keys ``before`` ends with (``before``: the input up to a point, reversed)."""
        out, s, hi = [], before, len(self.reversed)
        while s:
            j = bisect_right(self.reversed, s, 0, hi) - 1
            if j < 0:
                break
            k = self.reversed[j]
            if s.startswith(k):  # a key; any shorter one is a prefix of it, so sorts before it
                out.append(k[::-1])
                s, hi = k[:-1], j
            else:  # a key before s in the order sharing more than their common start with s would sort after k
                s, hi = s[: _common_start(k, s)], j
        return out

    def _holds_earlier(self, text: str, at: int, i: int) -> bool:
        pos = 0
        for m in self.earlier[i]:
            j = text.find(m, pos, at)
            if j < 0:
                return False
            pos = j + len(m)
        return True

    def match(self, raw: str, tail: int) -> list[int]:
        """Plan rows the dump input ``raw`` (NFC) is a sample of: see the module notes. ``tail``: how many
        squashed characters of template text may follow the last message (its step file's common ending)."""
        parts = list(filter(None, _WS.split(raw)))
        text = "".join(parts)
        starts = set(accumulate(map(len, parts), initial=0))
        found: list[tuple[int, bool, int]] = []  # (accounted, word start?, row)
        size = len(text)
        backwards = text[::-1]
        heads, short, short_lengths = self.heads, self.short, self.short_lengths
        for r in range(min(tail, size) + 1):  # r: template characters after the point e
            if backwards[r : r + _HEAD] not in heads and not (
                short_lengths and any(backwards[r : r + n] in short for n in short_lengths)
            ):
                continue  # no last message ends here
            e = size - r
            for key in self._ending_at(backwards[r : r + self.longest]):
                at = e - len(key)
                found += [
                    (self.weight[i], at in starts, i) for i in self.by_key[key] if self._holds_earlier(text, at, i)
                ]
        if not found:
            return []
        best = max(found)[:2]  # the most text accounted for, then a key starting at a word
        rows = sorted({i for a, w, i in found if (a, w) == best})
        if len(rows) > 1 and len({tuple(self.exact[i]) for i in rows}) > 1:
            # Twins under squashing: the messages written exactly as in the input decide.
            score = {i: sum(len(m) for m in self.exact[i] if m in raw) for i in rows}
            top = max(score.values())
            rows = [i for i in rows if score[i] == top]
        return rows


def _response_tokens(outputs: list[str], tok: Any | None) -> np.ndarray:
    if tok is None:
        return np.array(
            [max(1, math.ceil(len(o.encode("utf-8")) / BYTES_PER_TOKEN)) for o in outputs], dtype=np.float64
        )
    from aspc.io.tokens import count_tokens

    return np.asarray(count_tokens(tok, outputs), dtype=np.float64)


def read_rollout_lengths(
    path: str | os.PathLike,
    ids: list[str],
    prompts: list[str],
    *,
    tokenizer: str | Any | None = None,
    keep: Collection[str] | None = None,
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
    keep
        The ids whose lengths are wanted (a plan's, when a prompt limit left
        some of ``prompts`` out); ``None``: all. The samples of the others are
        matched and dropped, so they go to no kept prompt.

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
    file_ends: list[int] = []
    for f in files:
        with open(f, encoding="utf-8-sig", errors="strict") as fh:
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
            if (
                not isinstance(rec, dict)
                or not isinstance(rec.get("input"), str)
                or not isinstance(rec.get("output"), str)
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
        file_ends.append(len(inputs))
    if isinstance(tokenizer, str):
        from aspc.io.tokens import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    # verl's dump lacks the text its tokenizer made special tokens of; only a given tokenizer tells which.
    index = _ContentIndex(prompts, (tokenizer is not None and _special_remover(tokenizer)) or _nfc)
    kept = None if keep is None else [i in keep for i in ids]
    memo: dict[tuple[str, int], list[int]] = {}
    rows_of = []
    start = 0
    for end in file_ends:
        texts = {s: _nfc(s) for s in set(inputs[start:end])}
        tail = len(_squash(_common_ending(set(texts.values()))))  # the template text after the last message
        for s in inputs[start:end]:
            if (s, tail) not in memo:
                memo[s, tail] = index.match(texts[s], tail)
            rows_of.append(memo[s, tail])
        start = end
    lens = _response_tokens(outputs, tokenizer)
    found: dict[int, list[float]] = {}
    matched = 0
    unmatched: list[str] = []
    for k, rows in enumerate(rows_of):
        if not rows and len(unmatched) < 3:
            unmatched.append(inputs[k][:80])
        if kept is not None:
            rows = [r for r in rows if kept[r]]  # a left-out prompt's samples: matched, and dropped
        matched += bool(rows)
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
