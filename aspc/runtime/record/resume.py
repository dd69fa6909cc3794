"""What makes a run log resumable: the run's identity in ``meta.json``, and the checks before continuing it.

``aspc run --resume`` continues a log only with the plan and configuration
that wrote it (all but the operational options, which change how a run copes,
not what it computes). The identity is a hash of what the run generates
(:func:`work_hash`), the plan's hashes, the configuration record and the
simulator's cost model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from aspc.emit import schema as S
from aspc.errors import ConfigError, RunError
from aspc.runtime.backends.models import model_fingerprint, tokenizer_fingerprint
from aspc.runtime.config import (  # noqa: F401 - check_log_options: its old home
    OPERATIONAL_KEYS,
    ReturnMode,
    RunConfig,
    capacity_spelling,
    check_log_options,
)
from aspc.runtime.record.metrics import RunSummary, summarize_log
from aspc.runtime.record.runlog import read_run_log, to_columns
from aspc.runtime.work import WorkPlan


def work_hash(work: WorkPlan) -> str:
    """Hash of what a run generates: prompt ids, minibatch boundaries, samples per prompt."""
    h = hashlib.sha256()
    h.update(_joined_ids(work))
    h.update(np.ascontiguousarray(work.row_offsets, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(work.n_samples, dtype=np.int64).tobytes())
    return h.hexdigest()


def _joined_ids(work: WorkPlan) -> bytes:
    """``"\\x00".join(prompt ids).encode()`` from the id column's UTF-8 buffer (no Python string per id).

    NumPy inserts the separators; Arrow's ``binary_join`` would do it too, but
    converting its separator argument imports pandas (~0.5 s) on first use.
    """
    col = work.table.column(S.PROMPT_ID)
    if col.null_count or not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return "\x00".join(str(p) for p in work.prompt_ids.tolist()).encode()
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n = len(arr)
    off_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    offsets = np.frombuffer(arr.buffers()[1], dtype=off_type)[arr.offset : arr.offset + n + 1].astype(np.int64)
    data = arr.buffers()[2]
    body = np.frombuffer(data, dtype=np.uint8)[offsets[0] : offsets[-1]] if data is not None else np.empty(0, np.uint8)
    return np.insert(body, offsets[1:-1] - offsets[0], 0).tobytes()


def config_record(config: RunConfig) -> dict[str, Any]:
    """``config`` as ``meta.json`` stores it."""
    d = dataclasses.asdict(config)
    d["return_mode"] = ReturnMode(config.return_mode).value
    return d


# What a model backend samples with; --device and the engine may change between a run and its resume.
_SAMPLING = ("model", "dtype", "temperature", "top_p", "top_k", "replay")


def sampling_record(backend: Any) -> dict[str, Any] | None:
    """The model and sampling options of a real backend (``None`` for the sim's), as ``meta.json`` stores them.

    The model is its directory's name: a resume on another machine may find
    the same model at another path; and its contents' fingerprint
    (:func:`~aspc.runtime.backends.models.model_fingerprint`): another model
    may have the same name.
    """
    opts = getattr(backend, "options", None)
    if opts is None or not hasattr(opts, "temperature") or not getattr(opts, "model", None):
        return None
    record = {k: getattr(opts, k) for k in _SAMPLING}
    record["model"] = Path(os.path.realpath(str(opts.model))).name  # "--model ." is the directory's own name
    record["model_fingerprint"] = model_fingerprint(opts.model)  # its contents: many models share a name
    # Its tokenizer and chat template: another template renders the remaining prompts otherwise.
    record["tokenizer_fingerprint"] = tokenizer_fingerprint(opts.model)
    from aspc.runtime.backends.vllm_args import generation_engine_args

    # --engine-arg dtype=..., quantization=...: another engine samples otherwise. Always recorded ({} without
    # any), so a log without the key is one from before it, and is not compared.
    record["engine_args"] = generation_engine_args(getattr(opts, "engine_args", None))
    return record


def trainer_record(trainer: Any) -> str:
    """The trainer's class, as ``meta.json`` stores it: a resume without the run's ``--trainer`` would mix trainers."""
    cls = type(trainer)
    return f"{cls.__module__}.{cls.__qualname__}"


def check_resumable(path: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` unless the log at ``path`` ran this plan with this configuration.

    A ``meta.json`` section that is not an object (a damaged or hand-edited log) is a :class:`RunError`.
    """
    for key in ("run", "plan", "config"):
        if old.get(key) is not None and not isinstance(old[key], dict):
            raise RunError(f"{path}: meta.json {key} must be an object, got {json.dumps(old[key])[:40]}; "
                           "the run log is damaged: start a new run with --overwrite or a new --log")  # fmt: skip
    diffs = []
    if (old.get("run") or {}).get("work_hash") != new["run"]["work_hash"]:
        diffs.append("the plan (prompts, minibatches or samples per prompt)")
    for key in ("input_hash", "rows_hash"):
        a, b = (old.get("plan") or {}).get(key), new["plan"].get(key)
        if a and b and a != b:
            diffs.append(f"the plan's {key}")
            break
    oc, nc = old.get("config") or {}, new["config"]
    old_run = old.get("run") or {}
    diffs += [
        f"--{k.replace('_', '-')} ({oc.get(k)!r} in the log, {nc.get(k)!r} now)"
        for k in sorted(set(oc) | set(nc))
        if k not in OPERATIONAL_KEYS and oc.get(k) != nc.get(k) and not _same_capacity(k, oc, nc, old_run, new["run"])
    ]
    if "replan_every" in old_run and old_run["replan_every"] != new["run"].get("replan_every"):
        # Logs written before the key existed carry none and are not compared.
        def said(every: int | None) -> str:
            return "off" if every is None else f"--replan-every {every}"

        diffs.append(f"--replan ({said(old_run['replan_every'])} in the log, {said(new['run'].get('replan_every'))} now)")
    if old_run.get("carried") != new["run"].get("carried"):
        diffs.append(f"--scout-keep ({_kept(old_run.get('carried'))} in the log, {_kept(new['run'].get('carried'))} now)")
    if old_run.get("held") != new["run"].get("held"):
        diffs.append(f"the rolling scout ({_held(old_run.get('held'))} in the log, {_held(new['run'].get('held'))} now)")
    # The class's name, not its module: the same trainer imported by another path (`__main__.T`, `train.T`;
    # --trainer trainer:f or examples.x.trainer:f) is the same trainer. Logs before the record carry none.
    was_trainer, now_trainer = old_run.get("trainer"), new["run"]["trainer"]
    if was_trainer is not None and was_trainer.rsplit(".", 1)[-1] != now_trainer.rsplit(".", 1)[-1]:
        diffs.append(f"the trainer ({was_trainer} in the log, {now_trainer} now: resume with the run's --trainer)")
    was, now = old_run.get("sampling"), new["run"].get("sampling")
    if was is not None and now is not None:  # logs before the record carry none and are not compared
        flag = {"replay": "--replay-lengths"}
        diffs += [f"{flag.get(k, '--' + k.replace('_', '-'))} ({was.get(k)!r} in the log, {now.get(k)!r} now)"
                  for k in _SAMPLING if was.get(k) != now.get(k)]  # fmt: skip
        ea, eb = was.get("engine_args"), now.get("engine_args") or {}
        if isinstance(ea, dict):
            diffs += [f"--engine-arg {k} ({ea.get(k)!r} in the log, {eb.get(k)!r} now)"
                      for k in sorted(set(ea) | set(eb)) if ea.get(k) != eb.get(k)]  # fmt: skip
        a, b = was.get("model_fingerprint"), now.get("model_fingerprint")  # logs before the key carry none
        if a and b and a != b and was.get("model") == now.get("model"):
            diffs.append(f"--model ({was.get('model')!r} with contents {a[:12]}… in the log, another "
                         f"{now.get('model')!r} with contents {b[:12]}… now: its config.json or weights differ)")
        a, b = was.get("tokenizer_fingerprint"), now.get("tokenizer_fingerprint")  # logs before the key carry none
        if a and b and a != b and was.get("model") == now.get("model"):
            diffs.append(f"--model ({was.get('model')!r} with tokenizer files {a[:12]}… in the log, "
                         f"{b[:12]}… now: its tokenizer, chat template or generation_config.json differ)")
    if (old.get("cost_model") or {}) != new["cost_model"]:
        diffs.append(_cost_model_diff(old.get("cost_model"), new["cost_model"]))
    old_len = (old.get("run") or {}).get("lengths_name")
    if old_len != new["run"]["lengths_name"] and not _same_contents(old.get("run") or {}, new["run"]):
        diffs.append(f"--actual-lengths ({old_len!r} in the log, {new['run']['lengths_name']!r} now)")
    else:
        diffs += _lengths_diffs(old.get("run") or {}, new["run"], named=bool(diffs))
    if diffs:
        raise ConfigError(
            f"--resume {path}: this run differs from the logged one in {'; '.join(diffs)}; "
            "resume with the original options, or start a new run"
        )


def _cost_model_diff(old: Any, new: dict[str, Any]) -> str:
    """The cost model's differing coefficients, and how to resume with the logged ones (an older aspc's
    defaults differ: ``train_per_token`` was 2.5e-05)."""
    if not isinstance(old, dict):
        return "the cost model"
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    said = ", ".join(f"{k} {old.get(k)!r} in the log, {new.get(k)!r} now" for k in keys[:3])
    return (f"the cost model ({said}{', ...' if len(keys) > 3 else ''}; to resume, pass --cost-model FILE holding "
            "the log's meta.json cost_model)")


def _same_capacity(key: str, oc: dict, nc: dict, old_run: dict, new_run: dict) -> bool:
    """``--queue-capacity`` given otherwise but the same queue: "AUTO" for a logged "auto", or "1b" for a logged
    "64" that came to the same samples (the run records them). Not "64" for an "auto" that came to 64: an
    ``--epochs`` run resolves "auto" again for each epoch's plan, so the later epochs' queues would differ."""
    if key != "queue_capacity":
        return False
    a, b = capacity_spelling(oc.get(key)), capacity_spelling(nc.get(key))
    if a == b:
        return True
    if "auto" in (a, b):
        return False
    was, now = old_run.get("queue_capacity"), new_run.get("queue_capacity")
    return type(was) is int and type(now) is int and was == now


def _held(record: dict[str, Any] | None) -> str:
    return "off" if not record else f"{record['kept']} responses held for their groups"


def _kept(record: dict[str, Any] | None) -> str:
    if record is None:
        return "off"
    through = "" if record.get("through") is None else f" through version {record['through']}"
    return f"{record.get('samples')} scout responses kept{through}"


def _same_contents(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Both runs read lengths files with the same sha256: a copy or a link under another name is the same input."""
    a, b = (old.get("lengths_file") or {}).get("sha256"), (new.get("lengths_file") or {}).get("sha256")
    return bool(old.get("lengths_name")) and bool(new.get("lengths_name")) and a is not None and a == b


def _lengths_diffs(old: dict[str, Any], new: dict[str, Any], *, named: bool = False) -> list[str]:
    """Same-named actual lengths that are not the same: other contents, field or values.

    Logs written before these keys existed carry none of them and are not compared. ``lengths_hash``
    is of the values replayed (in the plan's order, under the cap), so another plan or cap changes it
    too: the values are named only where nothing else is (``named``: another difference was found).
    """
    diffs = []
    of, nf = old.get("lengths_file") or {}, new.get("lengths_file") or {}
    for key, flag in (("length_field", "--length-field"), ("id_field", "--id-field")):
        if key in of and key in nf and of[key] != nf[key]:
            diffs.append(f"{flag} ({of[key]!r} in the log, {nf[key]!r} now)")
    if "sha256" in of and "sha256" in nf and of["sha256"] != nf["sha256"]:
        diffs.append(
            f"the contents of --actual-lengths {new.get('lengths_name')} (sha256 {of['sha256'][:12]}… in the log, "
            f"{nf['sha256'][:12]}… now)"
        )
    elif "lengths_hash" in old and old.get("lengths_hash") != new.get("lengths_hash") and not diffs and not named:
        diffs.append("the actual lengths' values")
    return diffs


def completed_run(path: Path) -> tuple[RunSummary, dict[str, dict[str, np.ndarray]]]:
    """The summary and every column of the complete run log at ``path``."""
    log = read_run_log(path)
    return summarize_log(log), {k: to_columns(t) for k, t in log.tables.items()}
