"""Response lengths for simulated runs: observed ones, or drawn from the plan.

The simulator never uses a plan's predictions as the truth when real lengths
exist: those come from the data (``--actual-lengths``). With none given, each
sample's length is drawn, seeded, from the plan's predictive distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from aspc import portable_math as pm
from aspc.costs.kernel import Z90
from aspc.emit import schema as S
from aspc.errors import InputError
from aspc.guards import MAX_LENGTH
from aspc.io.lengths_by_id import LengthsById
from aspc.io.table import column_numpy
from aspc.runtime.work import WorkPlan


@dataclass
class SampleLengths:
    """Response length of every sample of a run, and where it came from."""

    response_len: np.ndarray  # int64 per global sample id, tokens, >= 0
    source: str  # "actual" (joined from data) or "sampled" (drawn from predictions)
    notes: list[str] = field(default_factory=list)  # things the user should know (stderr)


def _cap(lengths: np.ndarray, max_new_tokens: int | None) -> np.ndarray:
    return lengths if max_new_tokens is None else np.minimum(lengths, max_new_tokens)


def _same_ids(a: pa.Array | pa.ChunkedArray, b: pa.Array | pa.ChunkedArray) -> bool:
    """Whether two id columns hold the same strings in the same order (a buffer compare, no hashing)."""
    a, b = (x if isinstance(x, pa.ChunkedArray) else pa.chunked_array([x]) for x in (a, b))
    return len(a) == len(b) and a.type == b.type and a.equals(b)


def join_actual_lengths(
    work: WorkPlan,
    lengths_by_id: dict[str, np.ndarray],
    *,
    max_new_tokens: int | None = None,
    source_name: str = "",
) -> SampleLengths:
    """Per-sample lengths from observed data keyed by prompt id.

    Sample ``i`` of a prompt takes the prompt's ``i``-th observed value; with
    fewer values than samples the list is reused cyclically (and a note says so).

    Raises
    ------
    InputError
        Some plan prompts have no observed length (names how many and one id),
        or a length is negative or not finite.
    """
    where = f" in {source_name}" if source_name else ""
    columnar = isinstance(lengths_by_id, LengthsById)  # joined by id in one C++ call, not row by row
    if columnar and _same_ids(lengths_by_id.ids, work.table.column(S.PROMPT_ID)):
        # Keyed by the plan's own ids in plan order (aspc simulate): nothing to join.
        missing, joined = [], lengths_by_id.lengths
    elif columnar:
        absent, joined = lengths_by_id.join(work.table.column(S.PROMPT_ID))
        missing = [work.prompt_ids[i] for i in absent.tolist()]
    else:
        missing = [pid for pid in work.prompt_ids if pid not in lengths_by_id]
    if missing:
        raise InputError(
            f"{len(missing)} of {work.table.num_rows} plan prompts have no length{where}, e.g. id {missing[0]!r}; "
            "check --length-field and --id-field, or compile and run from the same dataset"
        )
    if columnar:
        counts, flat = joined.sizes(), joined.values
    else:
        per_row = [np.asarray(lengths_by_id[pid], dtype=np.float64).ravel() for pid in work.prompt_ids]
        counts = np.fromiter((v.size for v in per_row), dtype=np.int64, count=len(per_row))
    if np.any(counts == 0):
        bad = work.prompt_ids[int(np.flatnonzero(counts == 0)[0])]
        raise InputError(f"prompt {bad!r} has an empty list of lengths{where}; give at least one length")
    if not columnar:
        flat = np.concatenate(per_row)
    if not np.all(np.isfinite(flat)) or np.any(flat < 0):
        raise InputError(f"lengths{where} must be finite and >= 0; fix the length field")
    first = np.r_[0, np.cumsum(counts)[:-1]]
    rows = work.sample_row
    pick = first[rows] + work.sample_index.astype(np.int64) % counts[rows]
    lengths = np.rint(flat[pick]).astype(np.int64)
    notes = []
    short = int(np.count_nonzero(counts < work.n_samples))
    if short:
        notes.append(
            f"{short} prompts have fewer observed lengths than samples; their lengths are reused cyclically"
        )
    return SampleLengths(_cap(lengths, max_new_tokens), "actual", notes)


def sample_predicted_lengths(
    work: WorkPlan, *, seed: int = 0, max_new_tokens: int | None = None
) -> SampleLengths:
    """Draw each sample's length from a split lognormal that honours the plan's three quantiles.

    Median ``predicted_q50``; below it the log-spread that puts ``predicted_q10``
    at the 10th percentile, above it the one that puts ``predicted_q90`` at the
    90th. One spread from q10..q90 (the compiler's ``expected-max`` model) put
    them there only when q50 is their geometric middle: with the default
    predictor's q50 a quarter of a log unit above it, draws came out near
    1.3 x q10 and 1.3 x q90 at those percentiles.
    """
    t = work.table
    q10 = np.maximum(column_numpy(t.column(S.PREDICTED_Q10)), 1.0)
    q50 = np.maximum(column_numpy(t.column(S.PREDICTED_Q50)), 1.0)
    q90 = np.maximum(column_numpy(t.column(S.PREDICTED_Q90)), 1.0)
    mu = pm.log(q50)  # the C library's log and exp: the same draws on every machine (aspc.portable_math)
    below = np.maximum(mu - pm.log(q10), 0.0) / Z90
    above = np.maximum(pm.log(q90) - mu, 0.0) / Z90
    rows = work.sample_row
    z = np.random.default_rng(seed).standard_normal(rows.size)
    sigma = np.where(z < 0.0, below[rows], above[rows])
    # At most the longest length a plan may hold: a wide upper half (q90 / q50 up to 1e9) drew past
    # int64's range, and the cast made those samples negative.
    log_len = np.minimum(mu[rows] + sigma * z, float(pm.log(np.array([MAX_LENGTH]))[0]))
    lengths = np.maximum(np.rint(pm.exp(log_len)), 1.0).astype(np.int64)
    note = (
        f"no --actual-lengths: each sample's length is drawn (seed {seed}) from a lognormal fitted to the "
        "plan's predicted_q10..q90"
    )
    return SampleLengths(_cap(lengths, max_new_tokens), "sampled", [note])


def lengths_info(
    actual: dict[str, np.ndarray] | None, lengths: SampleLengths | None, name: str, source: dict[str, Any] | None
) -> dict[str, Any]:
    """Identity of the lengths a run replays, for the log and ``--resume``."""
    import hashlib

    info: dict[str, Any] = {"lengths_name": name or None}
    if actual is None:
        return info
    h = hashlib.sha256()
    if lengths is not None:
        h.update(np.ascontiguousarray(lengths.response_len, dtype=np.int64).tobytes())
    else:
        for pid in sorted(actual):
            h.update(str(pid).encode() + b"\x00")
            h.update(np.ascontiguousarray(actual[pid], dtype=np.float64).tobytes())
    info["lengths_hash"] = h.hexdigest()
    if source:
        info["lengths_file"] = dict(source)
    return info
