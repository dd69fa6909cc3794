"""Checked wrapper of the partition DP: validates, solves for the nominal count, checks the result.

:mod:`aspc.partition.kernel` holds the Numba DP; this module is what callers use
(through :mod:`aspc.partition`).
"""


from __future__ import annotations

import numbers

import numpy as np

from aspc import portable_math as pm
from aspc.errors import ConfigError, InputError
from aspc.partition.kernel import _partition_tables

__all__ = ["partition", "padded_cost"]


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an integer, got {value!r}; pass a whole number")
    return int(value)


def _check_lengths(lengths: object) -> np.ndarray:
    try:
        arr = np.ascontiguousarray(lengths, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"lengths must be real numbers ({exc}); pass a 1-D numeric array") from None
    if arr.ndim != 1:
        raise InputError(f"lengths must be 1-D, got shape {arr.shape}; pass one length per prompt")
    if arr.size == 0:
        raise InputError("lengths is empty; pass at least one prompt length")
    if not np.all(np.isfinite(arr)):
        raise InputError("lengths contain NaN or infinity; fix or drop those predictions")
    if arr.min() < 0:
        raise InputError("lengths contain negative values; response lengths must be >= 0")
    if np.any(arr[1:] < arr[:-1]):
        raise InputError("lengths are not sorted; sort them ascending (np.sort) before partition")
    return arr


def padded_cost(sorted_lengths: np.ndarray, boundaries: np.ndarray, overhead: float = 0.0) -> float:
    """Padded tokens ``sum_k (|b_k| + overhead) * max(b_k)`` of a partition of sorted lengths.

    Parameters
    ----------
    sorted_lengths : array_like of float, shape (n,)
        Non-decreasing lengths, as given to :func:`partition`.
    boundaries : array_like of int, shape (M + 1,)
        Boundaries as returned by :func:`partition`.

    Returns
    -------
    float
        The objective :func:`partition` minimises (one sample per prompt).
    """
    a = np.asarray(sorted_lengths, dtype=np.float64)
    b = np.asarray(boundaries, dtype=np.int64)
    return float(np.sum((np.diff(b) + overhead) * a[b[1:] - 1]))


# Root-finding on the Lagrange multiplier lambda (tokens per minibatch): the
# count falls monotonically as lambda grows, roughly linearly in log(lambda),
# so regula falsi on log(lambda) (Illinois variant) needs a handful of DPs.
_MAX_SOLVES = 40
_COUNT_TOL = 0.002


class _Unsolved(Exception):
    """The search needs the DP's count at ``lam``, which is not known yet."""

    def __init__(self, lam: float) -> None:
        super().__init__(lam)
        self.lam = lam


def _search(excess: dict[float, int], f0: int, scale: float, tol: float) -> float:
    """The lambda whose DP the nominal-count search returns, replayed from the counts known so far.

    ``excess`` maps each lambda solved so far to its excess minibatch count
    (decreasing in lambda); ``f0`` is the count's excess at lambda 0. Raises
    :class:`_Unsolved` at the first lambda it needs that is not in ``excess``.
    The search itself never looks at anything but these counts, so replaying
    it with more of them known walks the same lambdas to the same answer.
    """

    def solve(lam: float) -> int:
        if lam not in excess:
            raise _Unsolved(lam)
        return excess[lam]

    best = 0.0
    x_lo, f_lo = pm.log(scale * 1e-9), float(f0)  # lambda ~ 0: too many minibatches
    x_hi = pm.log(scale)
    f_hi = solve(scale)
    lam_hi = scale
    solves = 2
    while f_hi > 0 and solves < _MAX_SOLVES:
        x_lo, f_lo = x_hi, float(f_hi)
        x_hi += pm.log(16.0)
        lam_hi = float(pm.exp(x_hi))
        f_hi = solve(lam_hi)
        solves += 1
    best_err = abs(f0)
    if abs(f_hi) < best_err:
        best, best_err = lam_hi, abs(f_hi)
    side = 0
    while best_err > tol and solves < _MAX_SOLVES:
        # Interpolate the crossing in (log lambda, excess); fall back to
        # bisection when the bracket collapses onto equal counts.
        if f_lo != f_hi:
            x = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo)
        else:
            x = 0.5 * (x_lo + x_hi)
        if not x_lo < x < x_hi:
            x = 0.5 * (x_lo + x_hi)
        lam = float(pm.exp(x))
        f = solve(lam)
        solves += 1
        if abs(f) < best_err:
            best, best_err = lam, abs(f)
        if f > 0:
            x_lo, f_lo = x, float(f)
            if side == -1:
                f_hi /= 2.0
            side = -1
        else:
            x_hi, f_hi = x, float(f)
            if side == 1:
                f_lo /= 2.0
            side = 1
    return best


# From this many prompts a solve (~40 ms per million) is worth a thread.
_SPECULATE_ROWS = 100_000


def _nominal_count(arr: np.ndarray, b: int, d: int) -> tuple[np.ndarray, bool]:
    """DP boundaries with a per-minibatch penalty chosen so the count is about ``round(n / B)``.

    Each solve waits on the last one's count, so on a large input the DP for
    the lambda the search would ask next *if the count did not change* (the
    common case once the bracket is tight, and lambda = ``scale`` beside
    lambda 0, and the search's floor beside its first interpolation) runs on
    a second thread beside it. A guess that proves wrong only costs that
    thread's work. A lambda between two solved ones with the same count has
    that count (:func:`_between_equal`) and is not solved; the search walks
    the same lambdas to the same answer as the one-at-a-time search
    (:func:`_search`; ``tests/test_search_exact.py`` keeps that search as the
    oracle).
    """
    target = max(1, round(arr.size / b))
    tol = max(1.0, _COUNT_TOL * target)
    results: dict[float, tuple] = {}

    def run(lam: float, tables: tuple) -> None:
        results[lam] = _partition_tables(arr, b, b - d, b + d, 0.0, lam, *tables)

    def excess_of(lam: float) -> int:
        return results[lam][0].size - 1 - target

    scale = max(1.0, pm.mean(arr))  # np.mean's NumPy 2.3 bits on any NumPy
    threaded = arr.size >= _SPECULATE_ROWS and d != 0
    _solve_pair(run, 0.0, scale if threaded else None, arr.size, b - d, b + d)
    f0 = excess_of(0.0)
    if d == 0 or f0 <= tol:
        return results[0.0]
    excess = {lam: excess_of(lam) for lam in results}
    # The lowest lambda the search can ask for (it interpolates strictly inside its bracket, whose low
    # end starts here): solved beside the first interpolation, it anchors the inference below.
    floor = float(pm.exp(pm.log(scale * 1e-9)))
    last = f0
    while True:
        try:
            best = _search(excess, f0, scale, tol)
            if best not in results:  # known by inference only: the answer itself is solved
                _solve_pair(run, best, None, arr.size, b - d, b + d)
            return results[best]
        except _Unsolved as need:
            lam = need.lam
        if (known := _between_equal(lam, results, excess_of)) is not None:
            excess[lam] = known
            continue
        guess = None
        if threaded:
            if floor not in results and f0 > 0:
                guess = floor
            else:
                try:
                    _search({**excess, lam: last}, f0, scale, tol)
                except _Unsolved as ahead:
                    guess = ahead.lam if ahead.lam not in results else None
        _solve_pair(run, lam, guess, arr.size, b - d, b + d)
        excess.update({k: excess_of(k) for k in (lam, guess) if k is not None})
        last = excess[lam]


def _between_equal(lam: float, results: dict, excess_of) -> int | None:
    """The excess at ``lam`` when two solved lambdas around it have the same one, else None.

    The optimal count is non-increasing in lambda (for lambda1 < lambda2 the two
    optimality inequalities add up to (lambda2 - lambda1)(k2 - k1) <= 0), so an
    integer equal at both ends of an interval is that value inside it: the DP
    there would only repeat it. With tie-heavy lengths (lists of samples) the
    count drops at lambda = 0+ and stays flat down to the search's floor, which
    would otherwise cost ~20 solves that all return the same count.
    """
    below = [k for k in results if k <= lam]
    above = [k for k in results if k >= lam]
    if not below or not above:
        return None
    lo, hi = excess_of(max(below)), excess_of(min(above))
    return lo if lo == hi else None


def _tables(n: int, lo: int, hi: int) -> tuple:
    """The DP's tables for ``n`` prompts and its stop flag (see ``_partition_tables``), allocated by the calling thread.

    A kernel that allocated its ~30 MB of tables on a second thread would take
    them from that thread's malloc arena, which keeps them after they are
    freed (+50 MB peak at a million prompts).
    """
    def triple(size: int) -> tuple:
        return np.empty(size), np.empty(size, np.int64), np.empty(size, np.int64)

    band_reaches_n = -(-n // hi) <= n // lo  # some count k of minibatches has k*lo <= n <= k*hi
    return triple(n + 1), triple(0 if band_reaches_n else n + 1), np.empty(n, np.int64), np.zeros(1, np.int64)


def _solve_pair(run, lam: float, other: float | None, n: int = 0, lo: int = 1, hi: int = 1) -> None:
    """``run(lam, tables)``, and ``run(other, tables)`` beside it, each on a thread of its own (the kernel
    releases the GIL), in tables allocated here.

    The calling thread only waits. One solve is O(n (B + slack)): minutes at a large B. A signal's handler
    runs in the main thread, and in a compiled kernel that waits for the kernel's end (Ctrl-C did nothing for
    a minute); waiting in ``join``, it runs at once and raises, and the daemon threads end with the process.
    """
    import threading

    errors: list[BaseException] = []

    def solve(at: float, tables: tuple) -> None:
        try:
            run(at, tables)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the caller's thread
            errors.append(exc)

    jobs = [(at, _tables(n, lo, hi)) for at in (lam, other) if at is not None]
    threads = [threading.Thread(target=solve, args=job, daemon=True) for job in jobs]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except BaseException:
        # Interrupted (a library caller's KeyboardInterrupt; the CLI exits anyway): the solves stop at their
        # next prefix instead of running on for minutes beside whatever the caller does next.
        for _, tables in jobs:
            tables[-1][0] = 1
        raise
    if errors:
        raise errors[0]


def partition(
    sorted_lengths: np.ndarray, batch_size: int, slack: int, overhead: float | None = 0.0
) -> np.ndarray:
    """Choose minibatch boundaries over sorted lengths that minimise padding.

    Parameters
    ----------
    sorted_lengths : array_like of real, shape (n,)
        Predicted response lengths, non-decreasing, finite, ``>= 0``. Converted
        to float64.
    batch_size : int
        Nominal minibatch size ``B >= 1`` (prompts per minibatch).
    slack : int
        Allowed deviation ``0 <= delta < B``: sizes lie in ``[B - delta, B + delta]``.
    overhead : float or None, optional
        Per-decode-step fixed cost of a minibatch, in sequence-equivalents
        (``kappa >= 0``): each minibatch costs ``(|b| + kappa) * max(b)``.
        ``None``: no ``kappa``; a per-minibatch penalty is bisected so that the
        number of minibatches is the nominal ``round(n / B)`` (see Notes).

    Returns
    -------
    numpy.ndarray of int64, shape (M + 1,)
        Boundaries ``0 = b_0 < b_1 < ... < b_M = n``; minibatch ``k`` holds
        rows ``[b_k, b_{k+1})``.

    Raises
    ------
    InputError
        If the lengths are empty, not 1-D, not finite, negative or unsorted.
    ConfigError
        If ``batch_size < 1`` or ``slack`` is outside ``[0, batch_size)``.

    Notes
    -----
    Minimises the padded tokens ``sum_k (|b_k| + kappa) * max(b_k)``; because
    the input is sorted, ``max(b_k)`` is the minibatch's last length. With
    ``kappa = 0`` (pure padding) splitting a minibatch never adds padding, so
    sizes drift to ``B - delta``; ``kappa > 0`` charges each minibatch a fixed
    cost per decode step (``a / b`` of the linear step model ``a + b*active``:
    kernel launches and weight reads that a decode step pays whatever its
    batch), so the DP cuts only at jumps in length that pay for the extra
    minibatch. ``overhead=None`` adds instead a constant ``lambda`` per
    minibatch, the Lagrange multiplier of "use ``round(n / B)`` minibatches",
    and bisects it until the DP's count is within max(1, 0.2%) of that target
    (one minibatch either way below 500 minibatches): the result is padding-optimal among partitions with its count, sizes average ``B``
    while the slack moves boundaries to jumps in predicted length (the ASP
    preprint's intent) rather than shrinking every minibatch. The compile layer
    multiplies by samples per prompt, a constant factor that leaves the
    argmin unchanged.

    Size rule. Every minibatch has a size in the band ``[B - delta, B + delta]``
    whenever ``n`` can be written as such a sum. Only when it cannot (for
    example ``delta = 0`` and ``B`` does not divide ``n``, or ``n < B - delta``)
    exactly one *remainder* minibatch of size ``1 .. B - delta - 1`` is allowed,
    anywhere in the order; the DP places it where it costs least. Such an
    ``n`` always has a solution with one remainder, so the function is total.
    ``n < B - delta`` gives a single minibatch of all ``n`` prompts.

    Ties. Among boundary sets of equal padded cost (float64, compared
    exactly) the one with the least total deviation ``sum_k |size_k - B|``
    wins (a remainder of size ``r`` counts ``B - r``), so equal lengths give
    minibatches of size ``B`` where possible. Remaining ties go to the
    smallest last minibatch, then the smallest one before it, and so on
    (the size sequence read from the end, lexicographically smallest).

    A dynamic program over prefixes, ``O(n (2 delta + 1))`` time; the
    remainder table is built only when the band alone cannot reach ``n``
    (``O(n (B + delta))``). Partition DP for padding-minimal batching follows
    the ASP preprint (Chikhi et al., arXiv 2611.08864), where minibatch sizes
    may vary by a slack so boundaries fall at jumps in predicted length.
    """
    b = _check_int("batch_size", batch_size)
    d = _check_int("slack", slack)
    if b < 1:
        raise ConfigError(f"batch_size must be >= 1, got {b}; use --batch-size 1 or more")
    if not 0 <= d < b:
        raise ConfigError(f"slack must be in [0, batch_size), got {d} with batch_size {b}; lower --slack")
    arr = _check_lengths(sorted_lengths)
    # Every cost the DP sums is at most (n + overhead * n + a penalty of about the mean per minibatch) * max;
    # past float64 they are all inf and no partition is found (the walk back once looped writing out of bounds).
    worst = float(arr[-1]) * (arr.size + b + d) * (2.0 + (float(overhead) if overhead is not None else 0.0))
    if arr.size and not np.isfinite(worst):
        raise ConfigError(f"lengths up to {float(arr[-1]):.3g} overflow the partition's float64 costs with "
                          f"{arr.size} lengths; give lengths in tokens")  # fmt: skip
    if overhead is None:
        boundaries, used_remainder = _nominal_count(arr, b, d)
    else:
        kappa = float(overhead)
        if not np.isfinite(kappa) or kappa < 0:
            raise ConfigError(f"minibatch overhead must be a finite number >= 0, got {overhead}")
        solved: dict[float, tuple] = {}

        def run(lam: float, tables: tuple) -> None:
            solved[lam] = _partition_tables(arr, b, b - d, b + d, kappa, lam, *tables)

        _solve_pair(run, 0.0, None, arr.size, b - d, b + d)
        boundaries, used_remainder = solved[0.0]

    sizes = np.diff(boundaries)
    off_band = int(np.count_nonzero((sizes < b - d) | (sizes > b + d)))
    if (
        boundaries[0] != 0
        or boundaries[-1] != arr.size
        or sizes.min() < 1
        or off_band > int(used_remainder)
        or (used_remainder and sizes.min() >= b - d)
    ):
        raise AssertionError("partition kernel broke its size invariants; please report this bug")
    return boundaries
