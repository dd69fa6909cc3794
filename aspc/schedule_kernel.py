"""Numba kernel of the schedule: seeded 64-bit keys of prompt ids (no validation here; see aspc.schedule).

A key is FNV-1a over the id's UTF-8 bytes, started from a seed-dependent basis
and finished with SplitMix64's mixer, so a seed reorders ties as a whole and
nearby ids get unrelated keys. It depends on the id alone: never on where
its row stands in the input.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from aspc.numba_config import NJIT_FLAGS

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)


@njit(**NJIT_FLAGS)
def mix64(h: np.uint64) -> np.uint64:
    """SplitMix64's finalizer (all arithmetic in uint64: a mixed int64 operand would promote to float)."""
    h = h ^ (h >> np.uint64(30))
    h = h * MIX1
    h = h ^ (h >> np.uint64(27))
    h = h * MIX2
    return h ^ (h >> np.uint64(31))


@njit(**NJIT_FLAGS)
def id_keys(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, seed: np.uint64) -> np.ndarray:
    """The key of each id ``buf[starts[i]:ends[i]]``."""
    basis = FNV_OFFSET ^ mix64(seed * GOLDEN + GOLDEN)
    out = np.empty(starts.size, dtype=np.uint64)
    for i in range(starts.size):
        h = basis
        for j in range(starts[i], ends[i]):
            h = (h ^ np.uint64(buf[j])) * FNV_PRIME
        out[i] = mix64(h)
    return out
