"""Work items: a plan's rows expanded into minibatches and samples.

A *sample* is one response to generate: prompt row ``r``, sample index
``i < n_samples[r]``. Samples get global ids 0..N-1 in dispatch order
(minibatch by minibatch, row by row, then sample index), so minibatch ``m``
owns the contiguous id range ``sample_offsets[m]:sample_offsets[m+1]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from aspc.emit import schema as S
from aspc.errors import PlanError
from aspc.io.table import column_numpy


@dataclass(frozen=True)
class MinibatchWork:
    """One generation minibatch, as handed to a worker."""

    index: int  # minibatch id == dispatch position, 0..M-1
    row_start: int  # first plan row (inclusive)
    row_end: int  # last plan row (exclusive); row_end > row_start
    sample_start: int  # first global sample id (inclusive)
    sample_end: int  # last global sample id (exclusive)

    @property
    def n_samples(self) -> int:
        """Sequences to generate: the sum of the rows' n_samples."""
        return self.sample_end - self.sample_start


@dataclass(frozen=True)
class Holds:
    """Held scout samples and the minibatches waiting for a revision (:mod:`aspc.runtime.hold` builds them)."""

    held: np.ndarray  # bool per sample id: a scout's response, never queued on its own
    release_with: np.ndarray  # int64 per sample id: the held sample queued just before it (-1: none)
    pending: np.ndarray  # bool per minibatch: planned from the prior, not dispatched before a revision replaces it
    scout_tokens: int | None = None  # the scout's cut: a model backend stops a scout minibatch's responses here
    keeps: bool = True  # False: no held sample is ever released (under --max-staleness), so none counts as cut

    @property
    def n_released(self) -> int:
        """Held samples that join a group (the rest are cut scouts, never consumed)."""
        return int(np.count_nonzero(self.release_with >= 0))


@dataclass
class WorkPlan:
    """A plan as the runtime sees it: arrays only, in dispatch order."""

    table: pa.Table  # the plan rows (prompt text for real backends), PLAN_SCHEMA
    prompt_tokens: np.ndarray  # int64 per row, tokens of the prompt
    n_samples: np.ndarray  # int64 per row, >= 1 (after any --samples-per-prompt override)
    row_offsets: np.ndarray  # int64, M+1 entries: minibatch m = rows row_offsets[m]:row_offsets[m+1]
    sample_offsets: np.ndarray  # int64, M+1 entries: minibatch m = samples sample_offsets[m]:[m+1]
    sample_row: np.ndarray  # int64 per sample: its plan row
    sample_index: np.ndarray  # int32 per sample: 0..n_samples[row]-1
    group: np.ndarray  # int32 per minibatch: its dispatch group
    # bool per sample, or None: responses generated before the run by the weights it starts
    # from (a length scout's kept responses, :func:`carry`); nothing generates them again.
    carried: np.ndarray | None = None
    carried_len: np.ndarray | None = None  # int64 per sample: a carried response's tokens (where carried)
    # The newest weights version that may dispatch a minibatch and keep its carried samples;
    # a later dispatch generates them afresh (:func:`drop_stale_carries`). None: any version.
    carry_through: int | None = None
    # Scout samples generated inside the run and held for their groups (the rolling scout,
    # :mod:`aspc.runtime.hold`), or None.
    holds: Holds | None = None
    _bounds: tuple[list[int], list[int]] | None = field(default=None, repr=False)  # offsets as lists (cache)
    _prompt_ids: np.ndarray | None = field(default=None, repr=False)  # cache of prompt_ids

    @property
    def prompt_ids(self) -> np.ndarray:
        """Object array of str, one per row (the table's ``prompt_id``).

        Built on first use: a million Python strings cost a quarter of a
        second, and a simulated run without a log never needs them.
        """
        if self._prompt_ids is None:
            self._prompt_ids = np.asarray(self.table.column(S.PROMPT_ID).to_pylist(), dtype=object)
        return self._prompt_ids

    @prompt_ids.setter
    def prompt_ids(self, value: np.ndarray) -> None:
        self._prompt_ids = value

    @property
    def n_minibatches(self) -> int:
        return int(self.row_offsets.size - 1)

    @property
    def n_total_samples(self) -> int:
        return int(self.sample_offsets[-1])

    @property
    def minibatch_sizes(self) -> np.ndarray:
        """Samples per minibatch (int64, length M)."""
        return np.diff(self.sample_offsets)

    def minibatch(self, m: int) -> MinibatchWork:
        """The work item of minibatch ``m``."""
        if self._bounds is None:
            # Python ints: indexing NumPy scalars once per dispatch adds up on large plans.
            self._bounds = (self.row_offsets.tolist(), self.sample_offsets.tolist())
        rows, samples = self._bounds
        return MinibatchWork(m, rows[m], rows[m + 1], samples[m], samples[m + 1])

    def row_first_samples(self) -> np.ndarray:
        """The sample id of each row's first sample (int64, one per row)."""
        return np.r_[0, np.cumsum(self.n_samples)[:-1]].astype(np.int64)

    def sample_prompt_tokens(self) -> np.ndarray:
        """Prompt tokens of every sample (int64, length N)."""
        return self.prompt_tokens[self.sample_row]

    def count_prompt_tokens(self, counts: dict[str, int]) -> None:
        """Take each row's prompt tokens from ``counts`` (by prompt id; a scout row by its prompt's).

        A model backend counts them with the model's own tokenizer on the prompt as it renders it;
        the plan's column is compile time's estimate (bytes / 4 without ``--tokenizer``). The run log,
        the trainer's batches and ``aspc calibrate`` then see the tokens the model prefilled.
        """
        self.prompt_tokens = np.fromiter(
            (counts[S.prompt_of(str(pid))] for pid in self.prompt_ids), dtype=np.int64, count=len(self.prompt_ids)
        )


def work_from_table(table: pa.Table, *, samples_per_prompt: int | None = None) -> WorkPlan:
    """Expand plan rows (PLAN_SCHEMA columns, dispatch order) into a :class:`WorkPlan`.

    Parameters
    ----------
    table
        The plan rows; :func:`aspc.emit.read_plan` has already validated a plan
        read from disk, hand-built tables are checked for the invariants the
        runtime relies on.
    samples_per_prompt
        If given, every prompt gets this many samples instead of its ``n_samples``.

    Raises
    ------
    PlanError
        Empty plan, or minibatch ids that are not 0..M-1 in dispatch order.
    """
    n = table.num_rows
    if n == 0:
        raise PlanError("plan has no rows; recompile from a non-empty dataset")
    _check_columns(table, samples_per_prompt is None)
    mb = column_numpy(table.column(S.MINIBATCH)).astype(np.int64)
    d = np.diff(mb)
    if mb[0] != 0 or np.any((d != 0) & (d != 1)):
        raise PlanError("plan minibatch ids are not 0..M-1 in dispatch order; recompile the plan")
    if samples_per_prompt is not None:
        n_samples = np.full(n, int(samples_per_prompt), dtype=np.int64)
    else:
        n_samples = column_numpy(table.column(S.N_SAMPLES)).astype(np.int64)
    if np.any(n_samples < 1):
        raise PlanError("plan has rows with n_samples < 1; recompile the plan")
    starts = np.flatnonzero(np.r_[True, d != 0])
    row_offsets = np.r_[starts, n].astype(np.int64)
    cum = np.r_[0, np.cumsum(n_samples)].astype(np.int64)
    sample_offsets = cum[row_offsets]
    sample_row = np.repeat(np.arange(n, dtype=np.int64), n_samples)
    # Index within the prompt: position minus the prompt's first sample id.
    sample_index = (np.arange(cum[-1], dtype=np.int64) - cum[:-1][sample_row]).astype(np.int32)
    group = column_numpy(table.column(S.GROUP)).astype(np.int32)[starts]
    return WorkPlan(
        table=table,
        prompt_tokens=column_numpy(table.column(S.PROMPT_TOKENS)).astype(np.int64),
        n_samples=n_samples,
        row_offsets=row_offsets,
        sample_offsets=sample_offsets,
        sample_row=sample_row,
        sample_index=sample_index,
        group=group,
    )



def _check_columns(table: pa.Table, need_n_samples: bool) -> None:
    """The columns the runtime reads, present, whole and in range (a hand-built table broke deep in the run)."""
    import pyarrow.compute as pc

    wanted = [S.PROMPT_ID, S.MINIBATCH, S.GROUP, S.PROMPT_TOKENS] + ([S.N_SAMPLES] if need_n_samples else [])
    for name in wanted:
        if name not in table.column_names:
            raise PlanError(f"plan has no {name!r} column; compile the plan with 'aspc compile' (or keep every "
                            "column of aspc.emit.schema)")  # fmt: skip
        col = table.column(name)
        if col.null_count:
            raise PlanError(f"plan column {name!r} holds nulls; every row needs a value")
        if name != S.PROMPT_ID and not pa.types.is_integer(col.type):
            raise PlanError(f"plan column {name!r} is {col.type}, not integers; recompile the plan")
        if pa.types.is_unsigned_integer(col.type) and len(col) and pc.max(col).as_py() > 2**31 - 1:
            # The runtime reads these as int64/int32: a uint64 of 2**64-1 wrapped to -1 deep in the run.
            raise PlanError(f"plan column {name!r} holds a value over 2**31-1; recompile the plan")
    if pc.min(table.column(S.PROMPT_TOKENS)).as_py() < 0:
        raise PlanError(f"plan column {S.PROMPT_TOKENS!r} holds a negative count; recompile the plan")
