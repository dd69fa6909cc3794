"""The :class:`Plan` object and its Parquet reader/writer.

Writes are atomic and deterministic: no timestamps or paths are stored, so the
same input, config and seed give a byte-identical file.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from aspc import __version__
from aspc.arrow_files import arrow_file
from aspc.atomic import atomic_path
from aspc.emit import schema as S
from aspc.errors import PlanError, SchemaVersionError, short_reason
from aspc.io.table import column_numpy
from aspc.memory import release_free_memory


@dataclass
class Plan:
    """A compiled plan: rows in dispatch order plus provenance and metrics."""

    table: pa.Table  # PLAN_SCHEMA, one row per prompt, row i has dispatch_rank i
    config: dict[str, Any] = field(default_factory=dict)  # full compile configuration
    predictor: dict[str, Any] = field(default_factory=dict)  # predictor identity (kind, version, hash)
    input_hash: str = ""  # sha256 of the input file
    metrics: dict[str, Any] = field(default_factory=dict)  # plan metrics (aspc.emit.metrics)
    schema_version: str = S.SCHEMA_VERSION  # version the plan was written with
    stored_rows_hash: str = ""  # rows hash found in the file; "" for a plan not read from disk
    from_file: bool = False  # read by read_plan: then its rows hash and metrics must be present
    # Tokenizer that counted prompt_tokens (kind, name, hash); {} = estimated from bytes.
    token_counter: dict[str, Any] = field(default_factory=dict)
    # Input rows left out under --on-bad-line skip (aspc.io.table.SkippedRow), for the command to
    # name; not stored (the metrics keep their count).
    skipped: list[Any] = field(default_factory=list)

    @property
    def n_rows(self) -> int:
        return self.table.num_rows

    def column(self, name: str) -> np.ndarray:
        """A column as a NumPy array (strings come back as an object array)."""
        # Not to_numpy: on any column it imports pandas (~0.4 s of check, inspect, run, export).
        return column_numpy(self.table.column(name))


# NumPy dtypes of the plan's numeric columns (DataType.to_pandas_dtype would
# import pandas, half a second of every compile).
_NUMPY_TYPES = {pa.int32(): np.int32, pa.int64(): np.int64, pa.float64(): np.float64}


def rows_hash(table: pa.Table) -> str:
    """sha256 over every plan column's values, in schema order.

    Stored in the file so ``aspc check`` detects rows edited by hand.
    """
    h = hashlib.sha256()
    for f in S.PLAN_SCHEMA:
        col = table.column(f.name)
        h.update(f.name.encode())
        if pa.types.is_string(f.type):
            # Offsets (rebased to 0) plus the character data identify the
            # strings exactly, without a Python loop over a million rows.
            if isinstance(col, pa.ChunkedArray):
                # combine_chunks copies even a single chunk: 200+ MB of prompts at 1M rows.
                arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
            else:
                arr = col
            bufs = arr.buffers()
            offsets = np.frombuffer(bufs[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]
            offsets = offsets.astype(np.int64)
            h.update((offsets - offsets[0]).tobytes())
            data = bufs[2]
            if data is not None:
                h.update(memoryview(data)[offsets[0] : offsets[-1]])
        else:
            arr = np.ascontiguousarray(column_numpy(col).astype(_NUMPY_TYPES[f.type]))
            h.update(arr.tobytes())
    return h.hexdigest()


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default).encode("utf-8")


def as_stored(obj: Any) -> Any:
    """``obj`` (a config, metrics or predictor record) as a plan file stores and reads it back."""
    return json.loads(_dumps(obj))


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, (tuple, set)):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# From this many rows the rows hash is computed on a thread while the file is
# written (both run in C++ without the GIL), then set in the footer.
HASH_BESIDE_WRITE_ROWS = 100_000


# From this many rows the prompt column is encoded on a thread beside the
# others and the file stitched from the two (aspc.emit.stitch): same bytes.
# From aspc.emit.halves.HALVES_ROWS on, that thread encodes it in two halves.
SPLIT_WRITE_ROWS = 100_000

_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    # Statistics and page indexes carry no timestamps; keep the defaults
    # fixed here so a pyarrow upgrade does not silently change bytes.
    "write_statistics": True,
    "use_dictionary": True,
    "row_group_size": 1 << 20,
}


def _write(table: pa.Table, meta: dict[bytes, bytes], where: Path) -> None:
    table = table.replace_schema_metadata(meta)
    parts = None
    if table.num_rows >= SPLIT_WRITE_ROWS:
        from aspc.emit.halves import encode_in_halves
        from aspc.emit.stitch import split_write

        parts = split_write(table, S.PROMPT, _WRITE_OPTIONS, encode_in_halves)
    if parts is None:
        with arrow_file(where, "wb") as fh:
            pq.write_table(table, fh, **_WRITE_OPTIONS)
        return
    with open(where, "wb") as fh:
        for part in parts:
            fh.write(part)


def write_plan(plan: Plan, path: str | os.PathLike) -> None:
    """Write ``plan`` to ``path`` atomically (whole file or nothing)."""
    table = plan.table.cast(S.PLAN_SCHEMA)
    release_free_memory()  # the compile's temporaries, before the writer's buffers
    meta = {
        S.META_SCHEMA_VERSION: S.SCHEMA_VERSION.encode(),
        S.META_ASPC_VERSION: __version__.encode(),
        S.META_CONFIG: _dumps(plan.config),
        S.META_PREDICTOR: _dumps(plan.predictor),
        S.META_INPUT_HASH: plan.input_hash.encode(),
        S.META_METRICS: _dumps(plan.metrics),
        S.META_ROWS_HASH: b"",
    }
    if plan.token_counter:
        meta[S.META_PROMPT_TOKENS] = _dumps(plan.token_counter)
    beside = table.num_rows >= HASH_BESIDE_WRITE_ROWS
    hasher = _RowsHasher(table) if beside else None
    # A placeholder of the digest's length: the file is then the same bytes as
    # one written with the digest, once the footer's two copies are replaced.
    meta[S.META_ROWS_HASH] = secrets.token_hex(32).encode() if beside else rows_hash(table).encode()
    with atomic_path(path) as tmp:
        try:
            _write(table, meta, tmp)
        except BaseException:
            if hasher is not None:
                hasher.join()  # no thread left running when the error goes up
            raise
        if hasher is not None:
            digest = hasher.result().encode()
            if not _set_rows_hash(tmp, meta[S.META_ROWS_HASH], digest):
                meta[S.META_ROWS_HASH] = digest
                _write(table, meta, tmp)


class _RowsHasher:
    def __init__(self, table: pa.Table) -> None:
        self._digest = ""
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(table,), daemon=True)
        self._thread.start()

    def _run(self, table: pa.Table) -> None:
        try:
            self._digest = rows_hash(table)
        except BaseException as exc:  # noqa: BLE001 - re-raised by result()
            self._error = exc

    def join(self) -> None:
        self._thread.join()

    def result(self) -> str:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._digest


def _set_rows_hash(path: Path, old: bytes, new: bytes) -> bool:
    """Replace the rows hash ``old`` by ``new`` (same length) in a written plan file's footer.

    The value sits in the footer twice: as a key-value entry, and inside the
    base64 Arrow schema (``ARROW:schema``). Neither changes any length or
    offset, so the result is byte for byte the file written with ``new``.
    Returns False, leaving the file as it was, unless every copy is found
    exactly once and the patched footer reads back with ``new``.
    """
    if len(old) != len(new) or not old:
        return False
    with open(path, "r+b") as fh:
        fh.seek(-8, os.SEEK_END)
        tail = fh.read(8)
        if tail[4:] != b"PAR1":
            return False
        size = int.from_bytes(tail[:4], "little")
        fh.seek(-8 - size, os.SEEK_END)
        start = fh.tell()
        footer = fh.read(size)
        with arrow_file(path) as f:
            schema_b64 = (pq.read_metadata(f).metadata or {}).get(b"ARROW:schema", b"")
        ipc = base64.b64decode(schema_b64)
        if base64.b64encode(ipc) != schema_b64 or ipc.count(old) != 1 or footer.count(schema_b64) != 1:
            return False
        patched = footer.replace(schema_b64, base64.b64encode(ipc.replace(old, new)))
        if patched.count(old) != 1:
            return False
        patched = patched.replace(old, new)
        fh.seek(start)
        fh.write(patched)
    with arrow_file(path) as f:
        meta = pq.read_metadata(f).metadata or {}
    with arrow_file(path) as f:
        schema_meta = pq.read_schema(f).metadata or {}
    if meta.get(S.META_ROWS_HASH) == new and schema_meta.get(S.META_ROWS_HASH) == new:
        return True
    with open(path, "r+b") as fh:  # not as expected: put the original back; the caller rewrites
        fh.seek(start)
        fh.write(footer)
    return False


def _version_ok(version: str, path: Path) -> None:
    try:
        major = int(version.split(".")[0])
    except ValueError:
        raise PlanError(f"{path.name}: invalid aspc.schema_version {version!r}; recompile the plan") from None
    if major > S.SCHEMA_MAJOR:
        raise SchemaVersionError(
            f"{path.name}: plan schema {version} is newer than this aspc {__version__} reads "
            f"(schema {S.SCHEMA_VERSION}); upgrade aspc to a release that reads schema {major}.x"
        )
    if major < S.SCHEMA_MAJOR:
        raise SchemaVersionError(
            f"{path.name}: plan schema {version} is older than this aspc {__version__} reads "
            f"(schema {S.SCHEMA_VERSION}); recompile the plan with this aspc"
        )


def read_plan(path: str | os.PathLike, *, verify: bool = True) -> Plan:
    """Read a plan file, check its version and structure.

    Raises
    ------
    PlanError
        Missing, unreadable or non-aspc file, or rows that break the plan's
        invariants (see :func:`aspc.emit.validate.validate_table`).
    SchemaVersionError
        A plan written with another major schema version.
    """
    path = Path(path)
    if not path.exists():
        raise PlanError(f"{path}: no such plan file; run 'aspc compile' first")
    if path.is_dir():
        raise PlanError(f"{path}: is a directory, expected a plan .parquet file")
    try:
        with arrow_file(path) as fh:
            # ParquetFile, not read_table: read_table imports pyarrow.dataset, which imports pandas
            # (0.3 s of every plan-reading command). One chunk a column, not read_table's 131,072-row ones.
            table = pq.ParquetFile(fh).read()
        meta = table.schema.metadata or {}
        table.column_names  # noqa: B018 - decodes field names; corrupt bytes fail here, not later
    except MemoryError:  # pyarrow's ArrowMemoryError too: the file is not to blame, "recompile it" misled
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        # ValueError covers UnicodeDecodeError from corrupt field names.
        raise PlanError(
            f"{path.name}: not a readable Parquet file ({short_reason(exc)}); "
            "it is truncated or not a plan: compile it again with 'aspc compile'"
        ) from None
    if S.META_SCHEMA_VERSION not in meta:
        raise PlanError(f"{path.name}: not an aspc plan (no aspc.schema_version); compile one with 'aspc compile'")
    version = meta[S.META_SCHEMA_VERSION].decode(errors="replace")
    _version_ok(version, path)

    def _json(key: bytes) -> dict[str, Any]:
        try:
            value = json.loads(meta.get(key, b"{}"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
            value = None
        if not isinstance(value, dict):
            raise PlanError(f"{path.name}: corrupt metadata {key.decode()}; recompile the plan")
        return value

    missing = [f.name for f in S.PLAN_SCHEMA if f.name not in table.column_names]
    if missing:
        raise PlanError(f"{path.name}: plan lacks columns {missing}; recompile the plan")
    # table.select raised KeyError on a name the schema holds twice (a column appended by hand).
    repeated = [f.name for f in S.PLAN_SCHEMA if table.column_names.count(f.name) > 1]
    if repeated:
        raise PlanError(f"{path.name}: plan has column {repeated[0]!r} more than once; recompile the plan")
    try:
        table = table.select([f.name for f in S.PLAN_SCHEMA]).cast(S.PLAN_SCHEMA)
    except MemoryError:
        raise
    except (pa.ArrowException, ValueError):
        raise PlanError(f"{path.name}: plan columns have wrong types or nulls; recompile the plan") from None
    plan = Plan(
        table=table,
        config=_json(S.META_CONFIG),
        predictor=_json(S.META_PREDICTOR),
        input_hash=meta.get(S.META_INPUT_HASH, b"").decode(errors="replace"),
        metrics=_json(S.META_METRICS),
        schema_version=version,
        stored_rows_hash=meta.get(S.META_ROWS_HASH, b"").decode(errors="replace"),
        from_file=True,
        token_counter=_json(S.META_PROMPT_TOKENS),
    )
    _check_metadata(plan, path.name)
    if verify:
        from aspc.emit.validate import validate_table

        validate_table(plan.table, name=path.name)
    return plan


def _check_metadata(plan: Plan, name: str) -> None:
    """Refuse metadata values of the wrong type that commands read (the rows hash covers only the rows).

    A hand-edited ``response_cap: "x"`` made check, inspect, report and
    export fail with a traceback; export after writing its output.
    """
    from aspc.choices import MINIBATCH_COSTS, ON_BAD_LINE
    from aspc.guards import MAX_LENGTH

    def bad(where: str, what: str) -> PlanError:
        return PlanError(f"{name}: plan metadata {where} must be {what} (edited by hand?); recompile the plan")

    for where, d, key in (("aspc.metrics", plan.metrics, "response_cap"),
                          ("aspc.config", plan.config, "max_response_length"),
                          ("aspc.config", plan.config, "max_prompt_length")):  # fmt: skip
        v = d.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_LENGTH):
            raise bad(f"{where} {key}", f"null or an integer in 1..{MAX_LENGTH:.0e}")
    for where, d, key in (("aspc.metrics", plan.metrics, "cost_model"), ("aspc.config", plan.config, "minibatch_cost"),
                          ("aspc.config", plan.config, "cost_model")):  # fmt: skip
        if d.get(key) is not None and not isinstance(d[key], str):
            raise bad(f"{where} {key}", "a string")
        if d.get(key) is not None and d[key] not in MINIBATCH_COSTS:  # said without the file or a fix before
            raise bad(f"{where} {key}", f"one of {', '.join(MINIBATCH_COSTS)}")
    # export hands these to verl (data.max_prompt_length): 'abc' made int() raise after the output was written,
    # and -5, 1e30 or true went into the settings as they were.
    tokens, exact = plan.metrics.get("prompt_tokens_max"), plan.metrics.get("prompt_tokens_exact")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 <= tokens <= MAX_LENGTH):
        raise bad("aspc.metrics prompt_tokens_max", f"null or an integer in 0..{MAX_LENGTH:.0e}")
    if exact is not None and not isinstance(exact, bool):
        raise bad("aspc.metrics prompt_tokens_exact", "true, false or null")
    for key in ("n_excluded_overlong", "n_excluded_remainder"):  # counted in export's note
        v = plan.metrics.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise bad(f"aspc.metrics {key}", "null or an integer >= 0")
    inputs = plan.config.get("inputs")
    if inputs is not None and not (
        isinstance(inputs, dict) and all(v is None or isinstance(v, (str, bool, int)) for v in inputs.values())
        and all(inputs.get(k) is None or isinstance(inputs[k], str)
                for k in ("prompt_field", "id_field", "length_field", "on_bad_line"))
    ):  # fmt: skip
        raise bad("aspc.config inputs", "an object of field names")
    # Compile always writes these (only length_field may be null): a null read the source with field None,
    # a traceback, and on_bad_line 'bogus' was blamed on an --on-bad-line option export does not have.
    for key in ("prompt_field", "id_field", "on_bad_line"):
        if inputs is not None and key in inputs and inputs[key] is None:
            raise bad(f"aspc.config inputs {key}", "a string" if key != "on_bad_line" else "'error' or 'skip'")
    if inputs is not None and inputs.get("on_bad_line") is not None and inputs["on_bad_line"] not in ON_BAD_LINE:
        raise bad("aspc.config inputs on_bad_line", "'error' or 'skip'")
    # Compile stores finite numbers only; a NaN or Infinity (JSON reads both) made inspect --json print
    # invalid JSON and would pass through every comparison unnoticed.
    for where, d in (("aspc.metrics", plan.metrics), ("aspc.config", plan.config)):
        at = _non_finite(d)
        if at is not None:
            raise bad(f"{where} {at}", "a finite number")


def _non_finite(value: Any, at: str = "") -> str | None:
    """The dotted key of the first NaN or infinite float in ``value`` (nested dicts and lists), else None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else at
    if isinstance(value, dict):
        items: Any = ((f"{at}.{k}" if at else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{at}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for key, v in items:
        found = _non_finite(v, key)
        if found is not None:
            return found
    return None


def plan_cost_model(plan: Plan) -> str:
    """The minibatch cost model of ``plan``'s metrics and group loads.

    Plans record it as ``metrics["cost_model"]``; older ones only in their
    config (``minibatch_cost``, before that ``cost_model``). check, inspect
    and report all read it here: inspect and report once fell back to
    "padded" on such a plan, and showed loads ~4x off from check's.
    """
    m, cfg = plan.metrics, plan.config
    return str(m.get("cost_model") or cfg.get("minibatch_cost") or cfg.get("cost_model") or "padded")
