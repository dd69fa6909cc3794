"""Bulk scoring of the lexical predictor: one Numba pass per prompt, no feature matrix.

:func:`aspc.predict.features.featurize` builds the sparse matrix that training
needs. Prediction only needs ``H @ beta``, so this kernel walks each prompt's
bytes once, hashes words and word bigrams exactly as ``featurize`` does (same
polynomial hash, same multiply-shift buckets, same head/tail truncation) and
adds up the weights of their buckets; nothing per n-gram is stored. The
checked wrapper :func:`hashed_scores` validates inputs; the kernel does not.

A test checks the two paths agree to 1e-9 on random text (ASCII, Unicode,
truncated, empty of words).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
from numba import njit, prange

from aspc import portable_math as pm
from aspc.numba_config import NJIT_FLAGS, parallel_njit
from aspc.predict.features import _LOWER, _MIX, _P, _SEED_BIGRAM, _SEED_LENBIN, _SEED_WORD, _WORD, FeatureConfig

_CHUNK = 65536  # prompts encoded at once: bounds the byte buffer (~ 64k x 4 KiB worst case)


@njit(**NJIT_FLAGS)
def _bucket(h, seed, shift):  # pragma: no cover - compiled
    return np.int64(((h ^ seed) * _MIX) >> shift)


# Byte -> its lowercase form when it is a word character, else 0 (NUL is no word character):
# one table lookup per byte instead of two (_LOWER, then _WORD).
_WORD_CHAR = np.where(_WORD[_LOWER], _LOWER, 0).astype(np.uint8)


@parallel_njit
def _score_kernel(buf, starts, ends, lbins, word_char, beta, head, tail, bits, bigrams, out, n_words, n_lines):  # noqa: E501  # pragma: no cover - compiled
    shift = np.uint64(64 - bits)
    # Prompts are independent (each writes only its own outputs): results do not depend on threads.
    for d in prange(len(starts)):
        s, e = starts[d], ends[d]
        whole = e - s <= head + tail
        lines = 0
        # Segments the n-grams come from: the whole text (its newlines counted on the way),
        # or its head and tail (newlines counted over the whole text first).
        if whole:
            seg = ((s, e), (e, e))
        else:
            seg = ((s, s + head), (e - tail, e))
            for i in range(s, e):
                if buf[i] == 10:
                    lines += 1
        word_sum = 0.0
        n_w = 0
        pair_sum = 0.0
        n_pair = 0
        prev = np.uint64(0)
        for g in range(2):
            a, b = seg[g]
            h = np.uint64(0)
            pj = np.uint64(1)
            length = 0
            for i in range(a, b + 1):
                c = np.uint8(0)  # past the end: a word ends here
                if i < b:
                    x = buf[i]
                    c = word_char[x]
                    if whole and x == 10:
                        lines += 1
                if c != 0:
                    h += np.uint64(c) * pj
                    pj *= _P
                    length += 1
                elif length > 0:
                    h ^= np.uint64(length) * _MIX
                    # beta may be float32 (the shipped weights): widening is exact.
                    word_sum += np.float64(beta[_bucket(h, _SEED_WORD, shift)])
                    if bigrams and n_w > 0:
                        pair_sum += np.float64(beta[_bucket(prev * _P + h, _SEED_BIGRAM, shift)])
                        n_pair += 1
                    prev = h
                    n_w += 1
                    h = np.uint64(0)
                    pj = np.uint64(1)
                    length = 0
        total = np.float64(beta[_bucket(lbins[d], _SEED_LENBIN, shift)])
        if n_w > 0:
            total += word_sum / np.sqrt(n_w)
        if n_pair > 0:
            total += pair_sum / np.sqrt(n_pair)
        out[d] = total
        n_words[d] = n_w
        n_lines[d] = lines


def _encode_all(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """UTF-8 bytes of all texts in one buffer, with each text's [start, end) byte range."""
    joined = "\x00".join(texts).encode("utf-8", "replace")
    buf = np.frombuffer(joined, dtype=np.uint8)
    seps = np.flatnonzero(buf == 0)
    if len(seps) == len(texts) - 1:
        starts = np.concatenate([[0], seps + 1]).astype(np.int64)
        ends = np.concatenate([seps, [len(buf)]]).astype(np.int64)
        return buf, starts, ends
    # Some text holds a NUL byte itself: measure each text (slower, rare).
    sizes = np.fromiter((len(t.encode("utf-8", "replace")) for t in texts), dtype=np.int64, count=len(texts))
    starts = np.concatenate([[0], np.cumsum(sizes + 1)[:-1]]).astype(np.int64)
    return buf, starts, starts + sizes


def _arrow_chunks(texts: pa.Array | pa.ChunkedArray) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each chunk of an Arrow string column as (UTF-8 bytes, starts, ends): its own buffers, no copy."""
    chunks = texts.chunks if isinstance(texts, pa.ChunkedArray) else [texts]
    for arr in chunks:
        if len(arr) == 0:
            continue
        off_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
        offsets = np.frombuffer(arr.buffers()[1], dtype=off_type)[arr.offset : arr.offset + len(arr) + 1]
        data = arr.buffers()[2]
        buf = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(1, dtype=np.uint8)
        offsets = offsets.astype(np.int64)
        yield buf, offsets[:-1], offsets[1:]


def _python_chunks(texts: Sequence[str]) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    for lo in range(0, len(texts), _CHUNK):
        yield _encode_all(list(texts[lo : lo + _CHUNK]))


def hashed_scores(
    texts: Sequence[str] | pa.Array | pa.ChunkedArray, config: FeatureConfig, beta: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(H @ beta, dense)`` for prompts ``texts``: the hashed score and the dense features.

    Equal (to rounding) to ``featurize(texts).hashed_matvec(beta)`` and
    ``featurize(texts).dense`` for configurations without char n-grams.
    ``texts`` may be an Arrow string column (no nulls), read from its UTF-8
    buffers as they are: the same bytes as its strings encoded, without a
    Python string per prompt. ``beta`` float32 (as the lexical predictor
    stores its weights) is summed exactly as its float64 widening, with half
    the cache footprint.

    Raises
    ------
    ValueError
        ``config`` uses char n-grams (use :func:`featurize`), ``beta`` does
        not have ``2**bits`` float entries, or an Arrow column has nulls or is
        not of strings.
    """
    from aspc.predict.features import _dense

    if config.char_ngrams:
        raise ValueError("the bulk kernel covers word and bigram features only; use featurize()")
    dtype = np.float32 if np.asarray(beta).dtype == np.float32 else np.float64
    beta = np.ascontiguousarray(beta, dtype=dtype)
    if beta.shape != (1 << config.bits,):
        raise ValueError(f"beta has shape {beta.shape}, expected ({1 << config.bits},)")
    arrow = isinstance(texts, (pa.Array, pa.ChunkedArray))
    if arrow and (texts.null_count or not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type))):
        raise ValueError("texts as an Arrow column must be strings without nulls")
    n = len(texts)
    score = np.empty(n)
    dense = np.empty((n, 6))
    lo = 0
    for buf, starts, ends in _arrow_chunks(texts) if arrow else _python_chunks(texts):
        k = starts.size
        full = (ends - starts).astype(np.float64)
        lbins = np.minimum(pm.log2(full + 1.0) * 2.0, 40).astype(np.uint64)
        out = np.empty(k)
        n_words = np.empty(k, dtype=np.int64)
        n_lines = np.empty(k, dtype=np.int64)
        # The hashes wrap modulo 2**64 on purpose; interpreted (NUMBA_DISABLE_JIT=1), NumPy
        # scalars would warn at each wrap. Compiled code ignores NumPy's error state.
        with np.errstate(over="ignore"):
            _score_kernel(
                buf, starts, ends, lbins, _WORD_CHAR, beta, config.head_bytes, config.tail_bytes,
                config.bits, config.word_bigrams, out, n_words, n_lines,
            )  # fmt: skip
        score[lo : lo + k] = out
        dense[lo : lo + k] = _dense(full, n_words.astype(np.float64), n_lines.astype(np.float64))
        lo += k
    return score, dense
