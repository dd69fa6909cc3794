"""Read observed response lengths keyed by prompt id.

Sources: any dataset with an id field and a length field (a number or a list
of sampled lengths), or an aspc run log directory, whose ``samples/`` parts
hold one row per generated sample with ``prompt_id`` and ``response_len``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from aspc.errors import InputError
from aspc.io.prompts import check_field_names
from aspc.io.readers import BadRecord, detect_format, iter_numbered_records
from aspc.io.rows import _RowError, parse_length


def _read_run_log(path: Path) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.dataset as ds

    samples = path / "samples"
    if not samples.is_dir():
        raise InputError(f"{path}: a directory but not an aspc run log (no samples/); pass a run log or a dataset")
    try:
        table = ds.dataset(samples, format="parquet").to_table(columns=["prompt_id", "response_len"])
    except (pa.ArrowInvalid, OSError, KeyError) as exc:
        raise InputError(f"{path}: unreadable run log samples ({' '.join(str(exc).split())[:120]})") from None
    if table.num_rows == 0:
        return {}
    ids = np.asarray(table.column("prompt_id").to_pylist(), dtype=object)
    lens = table.column("response_len").to_numpy(zero_copy_only=False).astype(np.float64)
    order = np.argsort(ids, kind="stable")
    ids, lens = ids[order], lens[order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[starts[1:], len(ids)]
    return {str(ids[s]): lens[s:e].copy() for s, e in zip(starts, ends, strict=True)}


def read_lengths(
    path: str | os.PathLike, *, id_field: str = "id", length_field: str = "length"
) -> dict[str, np.ndarray]:
    """Map prompt id -> observed lengths (float64 array, one or more values).

    A prompt id seen on several rows accumulates all its lengths.
    """
    check_field_names(length_field)
    path = Path(path)
    if path.is_dir():
        return _read_run_log(path)
    from_text = detect_format(path) == "csv"
    out: dict[str, list[np.ndarray]] = {}
    for _row, line, rec in iter_numbered_records(path):
        where = f"{path.name}: line {line}"
        if isinstance(rec, BadRecord):
            raise InputError(f"{where}: {rec.reason}")
        if not isinstance(rec, dict):
            raise InputError(f"{where}: expected an object with {id_field!r} and {length_field!r}")
        pid = rec.get(id_field)
        if pid is None or isinstance(pid, bool) or not isinstance(pid, (str, int)):
            raise InputError(f"{where}: missing id field {id_field!r}; pass --id-field NAME")
        try:
            lens = parse_length(rec.get(length_field), length_field, from_text)
        except _RowError as exc:
            raise InputError(f"{where}: {exc}") from None
        out.setdefault(str(pid), []).append(lens)
    if not out:
        raise InputError(f"{path.name}: no rows; give a file with at least one id and length")
    return {k: np.concatenate(v) for k, v in out.items()}
