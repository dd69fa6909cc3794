"""Training pairs (prompt text, observed lengths) from a dataset or an aspc run log.

``aspc predict train`` and ``aspc probe`` learn from what the policy being
trained generated. Two sources give the same :class:`TrainingPairs`:

- a **run log** directory (``aspc run --log RUN``, ``aspc probe --log RUN``):
  every *committed* sample row (prompt id, response length), joined by prompt
  id with the prompt text of the plan that was run (``RUN/plan.parquet``, which
  both commands store there, or a plan given explicitly);
- a **dataset** with a prompt, an id and a length field, the length being a
  number, a list of sampled lengths, or one row per sample (rows sharing an id
  and a prompt are pooled). Optionally a *target* field names the model that
  generated each row's lengths (one entry per prompt and target, one head per
  target in the predictor) and a *group* field names each prompt's source
  (e.g. verl's ``data_source``), whose held-out-source residuals calibrate the
  bands.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from aspc.arrow_files import read_parquet_parts
from aspc.choices import ON_BAD_LINE
from aspc.errors import InputError, short_reason
from aspc.io.lengths import committed_sample_parts
from aspc.io.rows import chat_messages
from aspc.io.runlog_meta import refuse_runlog_meta

PLAN_IN_LOG = "plan.parquet"
"""Where ``aspc run --log`` and ``aspc probe`` keep a copy of the plan they ran."""


@dataclass
class TrainingPairs:
    """One entry per distinct prompt (per prompt and target, when targets are named)."""

    ids: list[str]  # prompt ids, unique (within each target)
    texts: list[str]  # plain prompt text (chat flattened), what predictors read
    lengths: list[np.ndarray]  # observed response lengths of each prompt (tokens, float64, >= 1 value)
    input_hash: str  # sha256 of the dataset file, or of the run log's sample rows
    source: str  # "run log" or "dataset"
    targets: list[str] | None = None  # per entry, the model that generated its lengths
    groups: list[str] | None = None  # per entry, its prompt's source
    # Rows left out under on_bad_line="skip" (aspc.io.SkippedRow), for the command to report.
    skipped: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def n_samples(self) -> int:
        return int(sum(len(a) for a in self.lengths))


def keep_plan_in_log(plan_path: str | os.PathLike, log_dir: str | os.PathLike) -> None:
    """Copy the plan file into the run log (atomically), unless the same file is already there."""
    from aspc.atomic import atomic_path

    src, dst = Path(plan_path), Path(log_dir) / PLAN_IN_LOG
    data = src.read_bytes()
    if dst.is_file() and dst.read_bytes() == data:
        return
    with atomic_path(dst) as tmp:
        Path(tmp).write_bytes(data)


def plan_text(stored: str) -> str:
    """Plain text of a plan's ``prompt`` cell: the text itself, or chat messages joined."""
    msgs = chat_messages(stored)  # only aspc's stored form: text that looks like a chat list stays text
    return stored if msgs is None else "\n\n".join(m["content"] for m in msgs)


def read_run_log_pairs(
    path: str | os.PathLike, plan: str | os.PathLike | None = None, *, for_training: bool = True
) -> TrainingPairs:
    """Committed samples of run log ``path`` with their prompt texts.

    ``for_training`` only words the error for a log without samples
    (evaluating needs one pair, training a predictor's minimum).

    Raises
    ------
    InputError
        Not a run log, no committed samples, no plan to take prompt texts from,
        or samples whose prompt id the plan lacks.
    """
    import hashlib

    from aspc.emit import read_plan
    from aspc.emit import schema as S

    path = Path(path)
    samples = _committed_samples(path)
    if samples.num_rows == 0:
        need = f"training needs at least {_min_pairs()}" if for_training else "evaluating needs at least 1"
        raise InputError(
            f"{path}: the run log has 0 committed samples (0 pairs found); {need} "
            "(prompt, length) pairs: let the run commit samples, or give a dataset"
        )
    plan_path = Path(plan) if plan is not None else path / PLAN_IN_LOG
    if plan is not None and not plan_path.is_file():
        # What is missing is the plan the user named, not the log's own.
        what = "is a directory" if plan_path.is_dir() else "does not exist"
        drop = f", or drop --plan to use {path / PLAN_IN_LOG}" if (path / PLAN_IN_LOG).is_file() else ""
        raise InputError(f"--plan {plan}: {what}; give the plan file that was run{drop}")
    if not plan_path.is_file():
        raise InputError(
            f"{path}: no {PLAN_IN_LOG} in the run log to take prompt texts from; pass --plan PLAN "
            "(the plan that was run)"
        )
    read = read_plan(plan_path)
    _check_plan_of_log(path, plan_path, read)
    table = read.table
    text_of = dict(
        zip(
            table.column(S.PROMPT_ID).to_pylist(),
            (plan_text(p) for p in table.column(S.PROMPT).to_pylist()),
            strict=True,
        )
    )
    ids = np.asarray(samples.column("prompt_id").to_pylist(), dtype=object)
    lens = samples.column("response_len").to_numpy(zero_copy_only=False).astype(np.float64)
    order = np.lexsort((samples.column("sample_index").to_numpy(), ids.astype(str)))
    # A rolling scout's rows are no pairs: a cut response is truncated, and a kept one stands
    # under the scout's id beside its prompt's other samples (those are enough).
    order = order[[not str(p).endswith(S.SCOUT_ID_SUFFIX) for p in ids[order]]]
    ids, lens = ids[order], lens[order]
    if ids.size == 0:
        raise InputError(f"{path}: the run log has only a rolling scout's samples (0 pairs found); let the run "
                         "commit its groups' samples, or give a dataset")  # fmt: skip
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[starts[1:], len(ids)]
    uniq = [str(ids[s]) for s in starts]
    missing = [u for u in uniq if u not in text_of]
    if missing:
        raise InputError(
            f"{path}: {len(missing)} sampled prompt ids (e.g. {missing[0]!r}) are not in {plan_path.name}; "
            "pass --plan with the plan that was run"
        )
    h = hashlib.sha256()
    h.update("\x00".join(uniq).encode())
    h.update(lens.tobytes())
    return TrainingPairs(
        ids=uniq,
        texts=[text_of[u] for u in uniq],
        lengths=[lens[s:e].copy() for s, e in zip(starts, ends, strict=True)],
        input_hash=h.hexdigest(),
        source="run log",
    )


def _check_plan_of_log(path: Path, plan_path: Path, plan: object) -> None:
    """Refuse a plan the log did not run: the same prompt ids with other texts would train on the wrong pairs.

    The log's ``meta.json`` records the plan's rows hash (a plan read from a
    file) and input hash; each is compared where both sides have it.
    """
    try:
        ran = json.loads((path / "meta.json").read_text(encoding="utf-8")).get("plan")
    except (OSError, ValueError, AttributeError, RecursionError):  # RecursionError: nested too deep
        return  # the samples were read: a log without a readable record is checked by its ids alone
    if not isinstance(ran, dict):
        return
    for key, got in (("rows_hash", getattr(plan, "stored_rows_hash", "")), ("input_hash", getattr(plan, "input_hash", ""))):
        want = ran.get(key)
        if isinstance(want, str) and want and got and want != got:
            raise InputError(
                f"{plan_path}: not the plan run log {path} ran (its {key.replace('_', ' ')} {got[:12]}… differs "
                f"from the log's {want[:12]}…); pass --plan with the plan that was run"
            )


def _committed_samples(path: Path):
    """``prompt_id, sample_index, response_len`` of every committed sample part of a run log.

    Read here with pyarrow alone (the compile side never imports the runtime);
    which parts are live is :func:`aspc.io.lengths.committed_sample_parts`'s to say.
    """
    import pyarrow as pa

    files = committed_sample_parts(path, require_meta=True)
    cols = ["prompt_id", "sample_index", "response_len"]
    schema = pa.schema([("prompt_id", pa.string()), ("sample_index", pa.int32()), ("response_len", pa.int64())])
    if not files:
        return schema.empty_table()
    try:
        return read_parquet_parts(files, cols)
    except (pa.ArrowInvalid, OSError, KeyError) as exc:
        raise InputError(
            f"{path}: unreadable run log samples ({short_reason(exc, limit=120)}); the run log is damaged: "
            "run the plan again with a new --log"
        ) from None


def read_dataset_pairs(
    path: str | os.PathLike,
    *,
    length_field: str,
    prompt_field: str = "prompt",
    id_field: str = "id",
    on_bad_line: str = "error",
    target_field: str | None = None,
    group_field: str | None = None,
) -> TrainingPairs:
    """Prompts and lengths of a dataset; rows that repeat an id (one row per sample) are pooled.

    With ``target_field`` rows are pooled per (id, target): the same prompt
    answered by several models gives one entry per model. ``group_field``
    gives every entry its prompt's group.

    Raises
    ------
    InputError
        Malformed rows (unless ``on_bad_line="skip"``), a repeated id with a
        different prompt or another group, a missing or non-name target or
        group, no lengths.
    """
    from aspc.errors import ConfigError
    from aspc.io.prompts import file_hash
    from aspc.io.readers import BadRecord, detect_format, iter_numbered_records
    from aspc.io.rows import (
        _parse_prompt,
        _RowError,
        content_id,
        nulls_absent,
        parse_length,
        refuse_twice,
        required_id,
    )
    from aspc.io.table import SkippedRow

    if on_bad_line not in ON_BAD_LINE:
        raise ConfigError(f"--on-bad-line must be 'error' or 'skip', not {on_bad_line!r}")
    path = Path(path)
    from_text = detect_format(path) == "csv"
    absent = nulls_absent(detect_format(path))
    pos: dict[tuple[str, str | None], int] = {}
    stored_of: dict[str, str] = {}  # prompt id -> its stored prompt, whatever the target
    group_of: dict[str, str] = {}  # prompt id -> its group
    ids: list[str] = []
    texts: list[str] = []
    targets: list[str] = []
    lengths: list[list[np.ndarray]] = []
    skipped: list[SkippedRow] = []
    read = (prompt_field, id_field, length_field, target_field, group_field)
    keys = tuple(dict.fromkeys(f for f in (*read, "messages") if f is not None))
    # Only the fields read: a Parquet column no one reads (a date past Python's range, a struct naming a field
    # twice) refused the file, which compile's readers take.
    for row, line, rec in iter_numbered_records(path, keys, columns=keys):
        try:
            if isinstance(rec, BadRecord):
                raise _RowError(rec.reason)
            if not isinstance(rec, dict):
                raise _RowError(f"expected an object with a {prompt_field!r} field, got {type(rec).__name__}")
            refuse_twice(rec, read + (("messages",) if rec.get(prompt_field) is None else ()))
            stored, text = _parse_prompt(rec, prompt_field, null_is_absent=absent)
            pid = required_id(rec, id_field)
            pid = content_id(stored) if pid is None else pid
            lens = parse_length(rec.get(length_field), length_field, from_text, present=length_field in rec)
            target = None if target_field is None else _label(rec, target_field, "target")
            group = None if group_field is None else _label(rec, group_field, "group")
            if stored_of.get(pid, stored) != stored:
                raise _RowError(f"prompt id {pid!r} repeats with a different prompt; make ids unique")
            if group is not None and group_of.get(pid, group) != group:
                raise _RowError(
                    f"prompt id {pid!r} repeats in group {group!r}, earlier {group_of[pid]!r}; a prompt belongs "
                    f"to one {group_field!r}"
                )
        except _RowError as exc:
            if on_bad_line == "skip":
                skipped.append(SkippedRow(row, str(exc), line))
                continue
            raise InputError(f"{path.name}: line {line}: {exc}") from None
        key = (pid, target)
        if key not in pos:
            pos[key] = len(ids)
            stored_of[pid] = stored
            ids.append(pid)
            texts.append(text)
            targets.append("" if target is None else target)
            lengths.append([])
        if group is not None:
            group_of[pid] = group
        lengths[pos[key]].append(lens)
    if not ids:
        extra = f" ({len(skipped)} bad rows skipped)" if skipped else ""
        raise InputError(f"{path.name}: no rows with a prompt and a length found{extra}; check --length-field")
    return TrainingPairs(
        ids=ids,
        texts=texts,
        lengths=[np.concatenate(v).astype(np.float64) for v in lengths],
        input_hash=file_hash(path),
        source="dataset",
        targets=None if target_field is None else targets,
        groups=None if group_field is None else [group_of[i] for i in ids],
        skipped=skipped,
    )


def _label(rec: dict, field: str, what: str) -> str:
    """A row's target or group name: a non-empty string or an integer, as a string."""
    from aspc.io.rows import _RowError

    v = rec.get(field)
    if v is None:
        raise _RowError(f"missing {what} field {field!r}; give every row one, or drop --{what}-field")
    if isinstance(v, bool) or not isinstance(v, (str, int, np.integer)):
        raise _RowError(f"{what} field {field!r} must be a name (a string), got {type(v).__name__}")
    s = str(v).strip()
    if not s:
        raise _RowError(f"{what} field {field!r} is empty; give every row a name")
    return s


def read_training_pairs(
    path: str | os.PathLike,
    *,
    length_field: str = "length",
    prompt_field: str = "prompt",
    id_field: str = "id",
    on_bad_line: str = "error",
    plan: str | os.PathLike | None = None,
    for_training: bool = True,
    target_field: str | None = None,
    group_field: str | None = None,
) -> TrainingPairs:
    """Pairs from a run log directory or a dataset file (see the module notes)."""
    from aspc.errors import ConfigError

    p = Path(path)
    if p.is_dir():
        if target_field is not None or group_field is not None:
            raise ConfigError(
                f"--target-field and --group-field read fields of a dataset, and {p} is a run log (one policy's "
                "samples: prompt ids and lengths); drop them, or give a dataset"
            )
        return read_run_log_pairs(p, plan=plan, for_training=for_training)
    if plan is not None:
        raise ConfigError("--plan applies to a run log directory, not to a dataset file")
    refuse_runlog_meta(p)
    return read_dataset_pairs(
        p, length_field=length_field, prompt_field=prompt_field, id_field=id_field, on_bad_line=on_bad_line,
        target_field=target_field, group_field=group_field,
    )  # fmt: skip


def check_pair_count(pairs: TrainingPairs | Sequence[np.ndarray], needed: int, where: str) -> None:
    """One-line error when there are fewer pairs than a predictor needs, or all lengths are equal."""
    lengths = pairs.lengths if isinstance(pairs, TrainingPairs) else pairs
    n = len(lengths)
    if n < needed:
        raise InputError(
            f"{where}: {n} (prompt, length) pairs found, training needs at least {needed}; "
            "give more prompts (e.g. a larger --prompts for a probe)"
        )
    flat = np.concatenate([np.asarray(a, dtype=np.float64) for a in lengths])
    if np.all(flat == flat[0]):
        raise InputError(
            f"{where}: all {len(flat)} observed lengths equal {flat[0]:g} in {n} pairs; a length predictor "
            "needs varying lengths (were responses cut at --max-new-tokens?)"
        )


def _min_pairs() -> int:
    from aspc.predict.base import MIN_PAIRS

    return MIN_PAIRS
