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

from collections.abc import Sequence

import numpy as np
from numba import njit, prange

from aspc.numba_config import NJIT_FLAGS, NJIT_PARALLEL_FLAGS
from aspc.predict.features import _LOWER, _MIX, _P, _SEED_BIGRAM, _SEED_LENBIN, _SEED_WORD, _WORD, FeatureConfig

_CHUNK = 65536  # prompts encoded at once: bounds the byte buffer (~ 64k x 4 KiB worst case)


@njit(**NJIT_FLAGS)
def _bucket(h, seed, shift):  # pragma: no cover - compiled
    return np.int64(((h ^ seed) * _MIX) >> shift)


@njit(**NJIT_PARALLEL_FLAGS)
def _score_kernel(buf, starts, ends, lbins, lower, is_word, beta, head, tail, bits, bigrams, out, n_words, n_lines):  # noqa: E501  # pragma: no cover - compiled
    shift = np.uint64(64 - bits)
    # Prompts are independent (each writes only its own outputs): results do not depend on threads.
    for d in prange(len(starts)):
        s, e = starts[d], ends[d]
        lines = 0
        for i in range(s, e):
            if buf[i] == 10:
                lines += 1
        # Segments the n-grams come from: the whole text, or its head and tail.
        if e - s <= head + tail:
            seg = ((s, e), (e, e))
        else:
            seg = ((s, s + head), (e - tail, e))
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
                c = lower[buf[i]] if i < b else np.uint8(32)
                if is_word[c]:
                    h += np.uint64(c) * pj
                    pj *= _P
                    length += 1
                elif length > 0:
                    h ^= np.uint64(length) * _MIX
                    word_sum += beta[_bucket(h, _SEED_WORD, shift)]
                    if bigrams and n_w > 0:
                        pair_sum += beta[_bucket(prev * _P + h, _SEED_BIGRAM, shift)]
                        n_pair += 1
                    prev = h
                    n_w += 1
                    h = np.uint64(0)
                    pj = np.uint64(1)
                    length = 0
        total = beta[_bucket(lbins[d], _SEED_LENBIN, shift)]
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


def hashed_scores(
    texts: Sequence[str], config: FeatureConfig, beta: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(H @ beta, dense)`` for prompts ``texts``: the hashed score and the dense features.

    Equal (to rounding) to ``featurize(texts).hashed_matvec(beta)`` and
    ``featurize(texts).dense`` for configurations without char n-grams.

    Raises
    ------
    ValueError
        ``config`` uses char n-grams (use :func:`featurize`), or ``beta`` does
        not have ``2**bits`` float entries.
    """
    from aspc.predict.features import _dense

    if config.char_ngrams:
        raise ValueError("the bulk kernel covers word and bigram features only; use featurize()")
    beta = np.ascontiguousarray(beta, dtype=np.float64)
    if beta.shape != (1 << config.bits,):
        raise ValueError(f"beta has shape {beta.shape}, expected ({1 << config.bits},)")
    n = len(texts)
    score = np.empty(n)
    dense = np.empty((n, 6))
    if n == 0:
        return score, dense
    for lo in range(0, n, _CHUNK):
        chunk = list(texts[lo : lo + _CHUNK])
        buf, starts, ends = _encode_all(chunk)
        full = (ends - starts).astype(np.float64)
        lbins = np.minimum(np.log2(full + 1.0) * 2.0, 40).astype(np.uint64)
        out = np.empty(len(chunk))
        n_words = np.empty(len(chunk), dtype=np.int64)
        n_lines = np.empty(len(chunk), dtype=np.int64)
        _score_kernel(
            buf, starts, ends, lbins, _LOWER, _WORD, beta, config.head_bytes, config.tail_bytes,
            config.bits, config.word_bigrams, out, n_words, n_lines,
        )  # fmt: skip
        score[lo : lo + len(chunk)] = out
        dense[lo : lo + len(chunk)] = _dense(full, n_words.astype(np.float64), n_lines.astype(np.float64))
    return score, dense
