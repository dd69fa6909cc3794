"""Hashed lexical features computed with vectorised NumPy, no Python loop per n-gram.

The lexical predictor has to featurise tens of thousands of prompts per
second on a small CPU, so every n-gram hash is computed for the whole batch at
once over one concatenated byte buffer. Hashes are a polynomial hash modulo
2**64 (NumPy's unsigned arithmetic wraps) followed by a multiply-shift into
``2**bits`` buckets: stable across processes and platforms, unlike Python's
salted ``hash``.

Notes
-----
Polynomial (Rabin–Karp) hashing of substrings from prefix sums: with
``H[i] = sum_{j<i} b[j] P**j`` the hash of ``b[s:e]`` is
``(H[e] - H[s]) * P**-s``; ``P`` is odd so it is invertible modulo ``2**64``.
The multiply-shift bucket map is Dietzfelbinger et al. (1997).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aspc import portable_math as pm

# Odd 64-bit constants: the polynomial base, its inverse modulo 2**64, and a
# golden-ratio multiplier for the final multiply-shift into buckets.
_P = np.uint64(0x100000001B3)
_P_INV = np.uint64(pow(0x100000001B3, -1, 2**64))
_MIX = np.uint64(0x9E3779B97F4A7C15)
_POW = [np.uint64(pow(0x100000001B3, k, 2**64)) for k in range(16)]

# Byte -> lowercase byte; non-ASCII bytes (UTF-8 continuation/lead bytes) kept.
_LOWER = np.arange(256, dtype=np.uint8)
_LOWER[65:91] += 32
# Word characters: ASCII letters, digits, underscore, and any non-ASCII byte so
# that words in other scripts stay whole.
_WORD = np.zeros(256, dtype=bool)
_WORD[48:58] = True
_WORD[97:123] = True
_WORD[95] = True
_WORD[128:] = True

# Distinct seeds per feature family so a word and a char n-gram that happen to
# hash equally still land in different buckets.
_SEED_WORD = np.uint64(0x51ED270B27A1F1C3)
_SEED_BIGRAM = np.uint64(0x2545F4914F6CDD1D)
_SEED_CHAR = np.uint64(0x7FEB352D2C1B7A11)
_SEED_LENBIN = np.uint64(0x3C6EF372FE94F82B)


MAX_SLICE_BYTES = 1 << 24
"""Most head or tail bytes a saved configuration may ask for (prompts are at most 2 MiB)."""


@dataclass(frozen=True)
class FeatureConfig:
    """How prompts are turned into hashed features (saved with the predictor)."""

    bits: int = 18  # log2 of the hash table size: 2**18 float32 weights = 1 MiB, few collisions
    # Char n-gram sizes. Off by default: on the CASTILLO data they added < 0.005 to Kendall tau
    # over words + bigrams while costing 4x the prediction time.
    char_ngrams: tuple[int, ...] = ()
    word_bigrams: bool = True  # bigrams catch instructions such as "in detail", "one word"
    head_bytes: int = 3072  # n-grams are taken from the head and tail only: keeps the cost per
    tail_bytes: int = 1024  # prompt bounded; length features still see the full prompt

    def to_dict(self) -> dict:
        return {
            "bits": self.bits,
            "char_ngrams": list(self.char_ngrams),
            "word_bigrams": self.word_bigrams,
            "head_bytes": self.head_bytes,
            "tail_bytes": self.tail_bytes,
        }

    def __post_init__(self) -> None:
        # The same rules for a configuration built in Python as for one read from a saved predictor:
        # word_bigrams=1 or head_bytes=2**30 trained, saved, and then refused at load.
        def whole(name: str, lo: int, hi: int) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
                raise ValueError(f"features.{name} {v!r} is not an integer in {lo}..{hi}")
            object.__setattr__(self, name, int(v))

        grams = self.char_ngrams
        if not isinstance(grams, (list, tuple)) or any(
            isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= 16 for n in grams
        ):
            raise ValueError(f"features.char_ngrams {grams!r} is not a list of integers in 1..16")
        object.__setattr__(self, "char_ngrams", tuple(int(n) for n in grams))
        if not isinstance(self.word_bigrams, (bool, np.bool_)):
            raise ValueError(f"features.word_bigrams {self.word_bigrams!r} is not true or false")
        object.__setattr__(self, "word_bigrams", bool(self.word_bigrams))
        whole("bits", 1, 30)
        whole("head_bytes", 0, MAX_SLICE_BYTES)
        whole("tail_bytes", 0, MAX_SLICE_BYTES)

    @classmethod
    def from_dict(cls, d: dict) -> FeatureConfig:
        """Read a saved configuration, refusing (ValueError) values training never writes.

        A hand-edited ``head_bytes`` of -1 loaded and changed predictions by up to 68%; ``"false"``
        read as a true ``word_bigrams``; a ``tail_bytes`` of 1e11 was taken as is. JSON has no
        tuples or NumPy types, so a saved list must be a list and a number a plain int or bool.
        """
        grams = d["char_ngrams"]
        if not isinstance(grams, list):
            raise ValueError(f"features.char_ngrams {grams!r} is not a list of integers in 1..16")
        return cls(
            bits=d["bits"],
            char_ngrams=tuple(grams),
            word_bigrams=d["word_bigrams"],
            head_bytes=d["head_bytes"],
            tail_bytes=d["tail_bytes"],
        )


N_DENSE = 6
"""Number of dense columns: an intercept and five prompt-length features."""


@dataclass
class Features:
    """Prompt features: a few dense columns and a hashed sparse part in COO form.

    The sparse part may repeat a ``(row, col)`` pair; repeated entries add up,
    which is what a matrix-vector product does anyway, so no sort or
    deduplication pass is needed (that pass would dominate prediction time).
    Columns ``0 .. N_DENSE-1`` of the full matrix are ``dense``; hashed
    column ``c`` is full column ``N_DENSE + c``.
    """

    dense: np.ndarray  # (n_rows, N_DENSE) float64
    rows: np.ndarray  # int64 row of every sparse entry
    cols: np.ndarray  # int64 hashed column of every sparse entry, < 2**bits
    vals: np.ndarray  # float64 value of every sparse entry
    n_hashed: int  # number of hashed columns (2**bits)

    @property
    def n_rows(self) -> int:
        return self.dense.shape[0]

    @property
    def n_cols(self) -> int:
        return N_DENSE + self.n_hashed

    def hashed_matvec(self, beta: np.ndarray) -> np.ndarray:
        """``H @ beta`` where ``H`` is the hashed part (``n_hashed`` columns)."""
        from aspc.predict.sparse_kernel import coo_matvec

        return coo_matvec(self.rows, self.cols, self.vals, beta, self.n_rows)

    def hashed_rmatvec(self, r: np.ndarray) -> np.ndarray:
        """``H.T @ r``."""
        from aspc.predict.sparse_kernel import coo_rmatvec

        return coo_rmatvec(self.rows, self.cols, self.vals, r, self.n_hashed)

    def hashed_sq_norms(self, row_weight: np.ndarray | None = None) -> np.ndarray:
        """``sum_i row_weight_i * H_ij**2`` per column (exact unless a row repeats a column)."""
        v = self.vals**2 if row_weight is None else self.vals**2 * row_weight[self.rows]
        return np.bincount(self.cols, weights=v, minlength=self.n_hashed)

    def compact(self) -> Features:
        """The same matrix with repeated ``(row, col)`` entries merged and sorted by row.

        Two linear passes (:func:`aspc.predict.sparse_kernel.merge_entries`, the
        bits of ``np.unique`` of ``row * n_hashed + col`` and ``np.bincount`` of
        the values, whose sort of every entry took seconds at 300,000 prompts);
        worth it before an iterative solve that multiplies by the matrix
        hundreds of times.
        """
        from aspc.predict.sparse_kernel import merge_entries

        rows, cols, vals = merge_entries(self.rows, self.cols, self.vals, self.n_rows, self.n_hashed)
        return Features(self.dense, rows, cols, vals, self.n_hashed)

    def take_rows(self, rows: np.ndarray, dense: np.ndarray | None = None) -> Features:
        """A new matrix made of the given rows, in that order (a row may repeat).

        Parameters
        ----------
        rows
            Row indices into this matrix.
        dense
            Dense part of the new matrix; defaults to ``self.dense[rows]``.
        """
        rows = np.asarray(rows, dtype=np.int64)
        order = np.argsort(self.rows, kind="stable")
        indptr = np.searchsorted(self.rows[order], np.arange(self.n_rows + 1))
        starts = indptr[rows]
        counts = indptr[rows + 1] - starts
        new_starts = np.cumsum(counts) - counts
        # Source position of every entry of the new matrix.
        src = order[np.repeat(starts - new_starts, counts) + np.arange(int(counts.sum()), dtype=np.int64)]
        return Features(
            self.dense[rows] if dense is None else dense,
            np.repeat(np.arange(len(rows), dtype=np.int64), counts),
            self.cols[src],
            self.vals[src],
            self.n_hashed,
        )


def _encode(texts: Sequence[str], head: int, tail: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate lowercased UTF-8 bytes, each prompt framed by a separator byte.

    Returns the buffer, the start offset of each prompt in it, and each prompt's
    full (untruncated) byte length.
    """
    raw = [t.encode("utf-8", "replace") for t in texts]
    full = np.fromiter((len(b) for b in raw), dtype=np.int64, count=len(raw))
    limit = head + tail
    pieces = []
    for b in raw:
        # A leading and trailing space make the first/last word a boundary-
        # delimited token, and separate prompts so no n-gram spans two of them.
        # b[-0:] is all of b: a tail of 0 bytes is none, as in the bulk kernel.
        pieces.append(b" " + (b if len(b) <= limit else b[:head] + b" " + (b[-tail:] if tail else b"")) + b"\x00")
    buf = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    kept = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    starts = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum(kept, out=starts[1:])
    return _LOWER[buf], starts, full


def _bucket(h: np.ndarray, seed: np.uint64, bits: int) -> np.ndarray:
    h = (h ^ seed) * _MIX
    return (h >> np.uint64(64 - bits)).astype(np.int64)


def _char_ngrams(buf: np.ndarray, doc_of: np.ndarray, n: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Bucket and document of every char n-gram that lies inside one prompt."""
    b = buf.astype(np.uint64)
    m = len(b) - n + 1
    if m <= 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    h = b[:m].copy()
    for k in range(1, n):
        h += b[k : k + m] * _POW[k]
    # The separator byte 0 ends each prompt: an n-gram is valid when it does not reach it.
    valid = doc_of[:m] == doc_of[n - 1 : n - 1 + m]
    valid &= buf[n - 1 : n - 1 + m] != 0
    seed = _SEED_CHAR + np.uint64(n)
    return _bucket(h[valid], seed, bits), doc_of[:m][valid]


_POWERS: tuple[np.ndarray, np.ndarray] = (np.ones(1, np.uint64), np.ones(1, np.uint64))
_POWERS_CAP = 1 << 22  # cache at most 2 x 32 MiB; longer buffers compute their own powers


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``P**i`` and ``P**-i`` modulo 2**64 for ``i < n``, cached (they cost a third of a prediction)."""
    global _POWERS
    if len(_POWERS[0]) >= n:
        return _POWERS[0][:n], _POWERS[1][:n]
    size = min(max(n, 2 * len(_POWERS[0])), _POWERS_CAP) if n <= _POWERS_CAP else n
    pw = np.cumprod(np.full(size, _P, dtype=np.uint64)) * _P_INV
    pw_inv = np.cumprod(np.full(size, _P_INV, dtype=np.uint64)) * _P
    if size <= _POWERS_CAP:
        _POWERS = (pw, pw_inv)
    return pw[:n], pw_inv[:n]


def _words(buf: np.ndarray, doc_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hash and document of every word, in text order."""
    is_word = _WORD[buf]
    edge = np.diff(is_word.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts = np.flatnonzero(edge == 1)
    ends = np.flatnonzero(edge == -1)
    if len(starts) == 0:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    pw, pw_inv = _powers(len(buf))
    prefix = np.zeros(len(buf) + 1, dtype=np.uint64)
    np.cumsum(buf.astype(np.uint64) * pw, out=prefix[1:])
    h = (prefix[ends] - prefix[starts]) * pw_inv[starts]
    # Mix in the word length: keeps the polynomial hash of prefixes distinct.
    h ^= (ends - starts).astype(np.uint64) * _MIX
    return h, doc_of[starts]


def featurize(texts: Sequence[str], config: FeatureConfig) -> Features:
    """Hashed sparse features of each prompt plus a few dense length features.

    Each hashed family is scaled by ``1/sqrt(count)`` so that long and short
    prompts give feature vectors of similar norm and the length itself enters
    only through the dense features and a hashed length bin.
    """
    n = len(texts)
    bits = config.bits
    buf, starts, full_bytes = _encode(texts, config.head_bytes, config.tail_bytes)
    doc_of = np.repeat(np.arange(n, dtype=np.int64), np.diff(starts))

    cols: list[np.ndarray] = []
    docs: list[np.ndarray] = []
    vals: list[np.ndarray] = []

    def add(bucket: np.ndarray, doc: np.ndarray) -> None:
        count = np.bincount(doc, minlength=n)
        scale = 1.0 / np.sqrt(np.maximum(count, 1))
        cols.append(bucket)
        docs.append(doc)
        vals.append(scale[doc])

    wh, wdoc = _words(buf, doc_of)
    add(_bucket(wh, _SEED_WORD, bits), wdoc)
    if config.word_bigrams and len(wh) > 1:
        same = wdoc[1:] == wdoc[:-1]
        bh = wh[:-1][same] * _P + wh[1:][same]
        add(_bucket(bh, _SEED_BIGRAM, bits), wdoc[1:][same])
    for k in config.char_ngrams:
        add(*_char_ngrams(buf, doc_of, k, bits))
    # A coarse length bin as a hashed token lets the model bend the (log) length effect.
    lbin = np.minimum(pm.log2(full_bytes + 1.0) * 2.0, 40).astype(np.uint64)
    add(_bucket(lbin, _SEED_LENBIN, bits), np.arange(n, dtype=np.int64))

    n_words = np.bincount(wdoc, minlength=n).astype(np.float64)
    n_lines = np.fromiter((t.count("\n") for t in texts), dtype=np.float64, count=n)
    dense = _dense(full_bytes.astype(np.float64), n_words, n_lines)
    return Features(dense, np.concatenate(docs), np.concatenate(cols), np.concatenate(vals), 1 << bits)


COMPACT_CHUNK = 32768  # prompts featurized at a time by featurize_compact


def featurize_compact(texts: Sequence[str], config: FeatureConfig, chunk: int = COMPACT_CHUNK) -> Features:
    """``featurize(texts, config).compact()``, the same arrays, ``chunk`` prompts at a time.

    featurize holds eight bytes per text byte several times over (the n-gram
    hashes): 4 GB at 300,000 prompts, where the compacted matrix is a tenth
    of that. Compacted entries are sorted by row, so the chunks' matrices,
    their rows offset, are the whole one's.
    """
    if len(texts) <= chunk:
        return featurize(texts, config).compact()
    parts = [featurize(texts[i : i + chunk], config).compact() for i in range(0, len(texts), chunk)]
    offsets = np.cumsum([0] + [p.n_rows for p in parts[:-1]])
    return Features(
        np.concatenate([p.dense for p in parts]),
        np.concatenate([p.rows + o for p, o in zip(parts, offsets, strict=True)]),
        np.concatenate([p.cols for p in parts]),
        np.concatenate([p.vals for p in parts]),
        parts[0].n_hashed,
    )


def _dense(n_bytes: np.ndarray, n_words: np.ndarray, n_lines: np.ndarray) -> np.ndarray:
    lb = pm.log1p(n_bytes)
    lw = pm.log1p(n_words)
    ll = pm.log1p(n_lines)
    # Centred near typical prompt sizes so the intercept and slopes decouple (faster solves).
    out = np.stack(
        [
            np.ones_like(lb),
            (lb - 6.0) / 2.0,
            (lw - 4.5) / 2.0,
            ll / 2.0,
            ((lb - 6.0) / 2.0) ** 2,
            lw * ll / 4.0,
        ],
        axis=1,
    )
    return out
