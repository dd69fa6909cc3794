"""Where ``simulate`` finds each prompt's actual lengths: one read, joined by input row, drawn per repeat.

The prompts and their known lengths come from one read of the input
(:class:`ReadOnce`); a plan's rows then find their lengths by the input row
they came from (:class:`RowAligned`), not by a hash join of their ids. Both
fall back to the general paths (a second read, a join by id) wherever the
fast one cannot be sure, so errors and results are the same either way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from aspc.emit import schema as S
from aspc.errors import ConfigError, InputError
from aspc.io.lengths_by_id import LengthsById
from aspc.io.ragged import RaggedLengths
from aspc.io.table import PromptTable, column_numpy


class RowAligned:
    """Known lengths of the rows of one read, found by input row instead of by id.

    Every prompt simulate compiles is a row of the read that gave these
    lengths, so a plan row's lengths are those of its ``source_row``: a binary
    search over the read's (increasing) rows, not a hash join of a million ids.
    """

    def __init__(self, by_id: LengthsById, source_rows: np.ndarray) -> None:
        self.by_id = by_id
        self.source_rows = np.asarray(source_rows, dtype=np.int64)
        self._row_of: np.ndarray | None = None  # input row -> row here (-1: none), built on first use

    def rows_of(self, source_rows: np.ndarray) -> np.ndarray | None:
        """Rows here of the prompts at input rows ``source_rows``; None if some is not one of them."""
        want = np.asarray(source_rows, dtype=np.int64)
        have = self.source_rows
        if self._row_of is None:
            if have.size == 0 or have.min() < 0 or int(have.max()) > 4 * have.size + 1024:
                return None  # rows too sparse for a lookup table (never for a reader's own rows)
            row_of = np.full(int(have.max()) + 1, -1, dtype=np.int64)
            row_of[have] = np.arange(have.size, dtype=np.int64)
            if not np.array_equal(row_of[have], np.arange(have.size)):
                return None  # a row twice: only ids can tell them apart
            self._row_of = row_of
        if want.size and (want.min() < 0 or want.max() >= self._row_of.size):
            return None
        rows = self._row_of[want]
        return rows if want.size == 0 or rows.min() >= 0 else None

    def for_plan(self, plan_table: Any) -> LengthsById:
        """The lengths keyed by the plan's own id column, in plan order (the run then joins nothing)."""
        rows = self.rows_of(column_numpy(plan_table.column(S.SOURCE_ROW)))
        if rows is None:
            return self.by_id
        return LengthsById(plan_table.column(S.PROMPT_ID), self.by_id.lengths.take(rows))


def unaligned(actual: Any) -> Any:
    return actual.by_id if isinstance(actual, RowAligned) else actual


class ReadOnce:
    """Input options (``no_lengths``'s) whose ``read`` also keeps the known lengths: one read, not two.

    The prompts are read with the length field. When that succeeds, the
    table without its lengths is what a read without the field returns, less
    the rows ``--on-bad-line skip`` dropped for a bad length (the field only
    adds checks; the bulk and row readers agree), and :attr:`with_lengths`
    spares the second read. When it fails (a bad row) it reads without the
    field as before, and the lengths are read again later, so every error
    comes at the same point with the same words.
    """

    def __init__(self, inputs: Any, no_lengths: Any) -> None:
        self._inputs = inputs
        self._no_lengths = no_lengths
        self.with_lengths: PromptTable | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._no_lengths, name)

    def read(self, path: str | os.PathLike, **changes: Any) -> PromptTable:
        if changes:
            return self._no_lengths.read(path, **changes)
        try:
            full = self._inputs.read(path)
        except (InputError, ConfigError):
            return self._no_lengths.read(path)
        # Under --on-bad-line skip this read is the one to keep: a read without the field would keep a row
        # whose lengths are bad (negative, NaN, empty), and the run then found no lengths for it.
        self.with_lengths = full
        return PromptTable(
            ids=full.id_array,
            prompts=full.prompt_array,
            texts=full.text_array,
            source_rows=full.source_rows,
            prompt_tokens=full.prompt_tokens,
            lengths=None,
            input_hash=full.input_hash,
            skipped=list(full.skipped),
            token_counter=full.token_counter,
            ids_unique=True,  # full's, checked when it was read
        )


def draw_lengths(actual: Mapping[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """Each prompt's recorded lengths in a seeded random order: sample ``i`` replays the ``i``-th drawn."""
    rng = np.random.default_rng(seed)
    return {pid: np.asarray(v)[rng.permutation(len(v))] for pid, v in sorted(actual.items())}


def known_lengths(actual: Any, table: PromptTable) -> RaggedLengths:
    """Every prompt's actual lengths, in table order (simulate_strategies checked that all have some)."""
    rows = actual.rows_of(table.source_rows) if isinstance(actual, RowAligned) else None
    if rows is not None:
        return actual.by_id.lengths.take(rows)
    actual = unaligned(actual)
    if isinstance(actual, LengthsById):
        return actual.lengths.take(actual.rows_of(table.id_array))
    return RaggedLengths.from_arrays(np.asarray(actual[pid], dtype=np.float64) for pid in table.ids)
