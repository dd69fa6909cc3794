"""Writing a run log as a run goes: parts, commits, compaction, resume (see :mod:`aspc.runtime.record.runlog`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from aspc import __version__, interrupt
from aspc.arrow_files import arrow_file
from aspc.atomic import atomic_path, atomic_write_bytes
from aspc.errors import AspcError, ConfigError, Interrupted, OutputError, RunError
from aspc.io.runlog_meta import RUNLOG_FORMAT, RUNLOG_VERSION, part_number, part_ranges
from aspc.io.table import arrow_array, column_numpy
from aspc.runtime.record.lock import LOCK_FILE, RunLogLock
from aspc.runtime.record.payloads import delete_payloads
from aspc.runtime.record.runlog import (
    CONSUMED,
    KINDS,
    META_FILE,
    SAMPLES,
    STATUS_COMPLETE,
    STATUS_FAILED,
    STATUS_INTERRUPTED,
    STATUS_RUNNING,
    is_run_log,
    join_consumed,
    live_tables,
    never_started,
    read_meta,
    to_table,
)


class RunLogWriter:
    """Writes a run log as it goes: ``start``, ``write_part``/``commit`` many times, then ``finish`` or ``fail``.

    Parameters
    ----------
    path
        The run directory. It must not exist or be empty; with ``overwrite``
        an existing aspc run log there is replaced (nothing else is deleted).
    resume
        Continue the aspc run log at ``path`` (see :meth:`start`); a path with
        no run log yet starts a fresh one.
    """

    def __init__(self, path: str | os.PathLike, *, overwrite: bool = False, resume: bool = False):
        self.path = Path(path)
        self.overwrite = overwrite
        self.resume = resume
        self._first = dict.fromkeys(KINDS, 0)  # first live part number per kind
        self._parts = dict.fromkeys(KINDS, 0)  # next part number per kind
        self._meta: dict[str, Any] = {}
        self._found: dict[str, Any] | None = None  # meta.json as a resume found it
        self.lock = RunLogLock(self.path)

    def acquire(self) -> None:
        """Take the log's writer lock (see :mod:`~aspc.runtime.record.lock`); call before reading its status."""
        self.check()
        self.lock.acquire()

    def release(self) -> None:
        self.lock.release()

    def _entries(self) -> list[Path]:
        """What the directory holds, the lock file aside."""
        return [e for e in self.path.iterdir() if e.name != LOCK_FILE] if self.path.is_dir() else []

    def check(self) -> None:
        """Raise :class:`ConfigError` if the log cannot be written there; writes nothing."""
        p = self.path
        if p.exists() and not p.is_dir():
            raise ConfigError(f"--log {p}: exists and is not a directory; pick a new run directory")
        if never_started(p):  # a writer's leftovers from before its first meta.json: start afresh
            return
        if self.resume:
            if p.is_dir() and self._entries() and not is_run_log(p):
                raise ConfigError(f"--log {p}: not an aspc run log, nothing to resume; pick the run's directory")
            return
        if p.is_dir() and self._entries():
            if not self.overwrite and not is_run_log(p):  # --overwrite and --resume both refuse it: not offered
                raise ConfigError(f"--log {p}: directory exists and is not empty, and holds no aspc run log; pick a new path")
            if not self.overwrite:
                raise ConfigError(
                    f"--log {p}: directory exists and is not empty; pick a new path, pass --overwrite, "
                    "or --resume to continue it"
                )
            if not is_run_log(p):
                raise ConfigError(
                    f"--log {p}: not an aspc run log, refusing to overwrite it; pick a new path"
                )

    @property
    def resuming(self) -> bool:
        """``start`` will continue an existing log (``resume`` and a run log at ``path``)."""
        return self.resume and is_run_log(self.path)

    @property
    def started(self) -> bool:
        """Whether :meth:`start` has marked the log ``running`` (what :meth:`abort` must then mark)."""
        return bool(self._meta)

    def start(self, meta: dict[str, Any]) -> None:
        """Create the directory and write ``meta.json`` with status ``running``.

        When :attr:`resuming`, keep the existing log: drop parts no commit
        covers, count the resume, and mark it ``running`` again (``meta`` is
        ignored: the caller checked it matches the log's).
        """
        self.check()
        if self.resuming:
            old = read_meta(self.path)
            if "parts" not in old:
                raise ConfigError(
                    f"--log {self.path}: run log format {old.get('format_version')} predates resume; "
                    "start a new run with --overwrite"
                )
            self._found = json.loads(json.dumps(old))  # as found: what a refused resume puts back
            self._meta = old
            ranges = part_ranges(old, self.path, RunError) or {}
            for kind in KINDS:
                self._first[kind], self._parts[kind] = ranges.get(kind, (0, 0))
            self.collect_garbage()
            self._meta.pop("error", None)
            self._meta.update(status=STATUS_RUNNING, resumes=int(old.get("resumes", 0)) + 1,
                              format_version=RUNLOG_VERSION, aspc_version=__version__)
            self._write_meta()
            return
        if self.path.is_dir() and self.overwrite and is_run_log(self.path):
            # Everything but the lock file we hold (removing it would let a
            # second writer lock a fresh one).
            for entry in self._entries():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        self.path.mkdir(parents=True, exist_ok=True)
        for kind in KINDS:
            (self.path / kind).mkdir(exist_ok=True)
        self._meta = {
            "format": RUNLOG_FORMAT,
            "format_version": RUNLOG_VERSION,
            "aspc_version": __version__,
            **meta,
            "status": STATUS_RUNNING,
        }
        self.commit()

    def write_part(self, kind: str, columns: dict[str, np.ndarray] | pa.Table) -> None:
        """Write one part of ``kind`` atomically (nothing if it has no rows); live after :meth:`commit`."""
        table = columns if isinstance(columns, pa.Table) else to_table(kind, columns)
        if table.num_rows == 0:
            return
        target = self.path / kind / f"part-{self._parts[kind]:06d}.parquet"
        with atomic_path(target) as tmp, arrow_file(tmp, "wb") as fh:  # tmp is not UTF-8 where no /proc reaches it
            pq.write_table(table, fh, compression="zstd")
        # Counted once written: a failed write (a full disk) must not enter the ranges a commit records,
        # which readers hold to (a committed part that is missing means a damaged log).
        self._parts[kind] += 1

    def commit(self, **meta: Any) -> None:
        """Make every part written so far live (one atomic ``meta.json`` write), with ``meta`` updates."""
        with interrupt.deferred():
            self._meta.update(meta)
            self._meta["parts"] = {k: [self._first[k], self._parts[k]] for k in KINDS}
            self._write_meta()

    def collect_garbage(self) -> None:
        """Delete parts outside the committed ranges and temporary files left by a crash."""
        # A crash mid-commit leaves the temporary meta.json sibling behind.
        for f in self.path.glob(f".{META_FILE}.*.tmp"):
            f.unlink(missing_ok=True)
        for kind in KINDS:
            d = self.path / kind
            if not d.is_dir():
                continue
            for f in d.iterdir():
                n = part_number(f)
                stale = n is None and f.name.startswith(".") and f.name.endswith(".tmp")
                if stale or (n is not None and not self._first[kind] <= n < self._parts[kind]):
                    f.unlink(missing_ok=True)

    def tidy(self) -> None:
        """Delete files a crash left outside the committed parts of the log at :attr:`path`.

        A crash between the final commit and its clean-up leaves the replaced
        sample parts on disk; readers that list the directory directly (such
        as ``pyarrow.dataset``) would see them, so ``--resume`` tidies even a
        complete log.
        """
        meta = read_meta(self.path)
        ranges = part_ranges(meta, self.path, RunError) or {}
        for kind in KINDS:
            self._first[kind], self._parts[kind] = ranges.get(kind, (0, 0))
        self.collect_garbage()
        if meta.get("status") == STATUS_COMPLETE:  # killed between the final commit and finish()'s clean-up
            self._after_complete()

    def _after_complete(self) -> None:
        delete_payloads(self.path)  # a complete run resumes nothing
        consumed = self.path / CONSUMED
        if consumed.is_dir() and not any(consumed.iterdir()):
            consumed.rmdir()

    def _compact(self, *, keep_consumed: bool = False) -> None:
        """Write the live samples, joined with their consumption, as one new (uncommitted) part.

        ``keep_consumed``: the ``consumed`` parts stay live too. A failed run
        keeps them: they alone hold the order each step took its samples in,
        which a resume that replays steps (:mod:`aspc.runtime.record.replay`) needs.
        """
        tables = live_tables(self.path, self._meta)
        samples = tables[SAMPLES]
        if samples.num_rows == 0:
            return
        joined = join_consumed(samples, tables[CONSUMED])
        order = np.argsort(column_numpy(joined.column("minibatch")), kind="stable")
        first = self._parts[SAMPLES]
        self.write_part(SAMPLES, joined.take(arrow_array(order, pa.int64())))  # pa.array imports pandas
        self._first[SAMPLES] = first
        if not keep_consumed:
            self._first[CONSUMED] = self._parts[CONSUMED]

    def finish(self, summary: dict[str, Any]) -> None:
        """Compact the samples, mark the run complete and store its summary."""
        self._compact()
        self.commit(status=STATUS_COMPLETE, summary=summary)
        self.collect_garbage()
        self._after_complete()

    def fail(self, message: str, *, status: str = STATUS_FAILED) -> None:
        """Compact what is committed and mark the run ``status`` (failed or interrupted); the log stays resumable."""
        try:
            self._compact(keep_consumed=True)
        finally:
            self.commit(status=status, error=message)
        self.collect_garbage()

    def put_back(self) -> None:
        """A resume refused before any new work (its trainer cannot restore): ``meta.json`` as :meth:`start` found it.

        Only parts no commit covered were dropped, so the log is the one the
        refused command was given, still resumable once the cause is fixed.
        """
        if self._found is None:
            return
        self._meta = self._found
        try:
            self._write_meta()
        except OSError:
            pass  # left "running", as a crash leaves it: still resumable

    def abort(self, exc: BaseException, flush: Any) -> None:
        """End a run that raised ``exc``: commit what ``flush`` can, mark the log, keep it resumable.

        ``Interrupted`` (SIGTERM/SIGINT) marks it ``interrupted``, anything
        else ``failed``. On a full disk the flush and the compaction cannot
        be written; their uncommitted parts are deleted (freeing the space
        they took) and only ``meta.json`` is rewritten. If even that fails
        the log is left as a crash leaves it: ``running`` on disk, every
        committed part intact, resumable.
        """
        status = STATUS_INTERRUPTED if isinstance(exc, Interrupted) else STATUS_FAILED
        message = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, Interrupted):
            message = f"interrupted by {interrupt.signal_name(exc.signum)}"
        with interrupt.deferred():
            if not isinstance(exc, OutputError):
                try:
                    flush()
                except (AspcError, OSError):
                    pass  # the parts it wrote are uncommitted; dropped below
            try:
                self.fail(message, status=status)
                return
            except (AspcError, OSError):
                pass
            self._first, self._parts = _committed_ranges(self.path, self._first, self._parts)
            try:
                self.collect_garbage()
                self.commit(status=status, error=message)
            except (AspcError, OSError):
                pass

    def _write_meta(self) -> None:
        data = json.dumps(self._meta, indent=2, sort_keys=True, default=_json_default) + "\n"
        atomic_write_bytes(self.path / META_FILE, data.encode())


def _committed_ranges(
    path: Path, first: dict[str, int], parts: dict[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """The part ranges ``meta.json`` last committed (the in-memory ones if it cannot be read)."""
    try:
        ranges = part_ranges(read_meta(path), path, RunError) or {}
    except AspcError:
        return first, parts
    f = {k: ranges.get(k, (0, 0))[0] for k in KINDS}
    e = {k: ranges.get(k, (0, 0))[1] for k in KINDS}
    return f, e


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (tuple, set)):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
