"""Run configuration: how many workers, how big a trainer step, how deep a queue.

One :class:`RunConfig` drives every backend; options that only a backend
understands (model paths, devices) belong to that backend, not here.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass
from enum import Enum

from aspc.errors import ConfigError


class ReturnMode(str, Enum):
    """When a worker hands a minibatch's samples to the queue."""

    # The preprint's mode: every sample of a minibatch is returned when its
    # longest sequence finishes (what one batched ``generate`` call does).
    STATIC = "static"
    # Each sequence is returned the moment it finishes, as continuous-batching
    # engines stream them; the worker is still busy until the longest ends.
    CONTINUOUS = "continuous"


RETURN_MODES = tuple(m.value for m in ReturnMode)


def parse_return_mode(name: str | ReturnMode) -> ReturnMode:
    """The :class:`ReturnMode` called ``name``; :class:`ConfigError` if unknown."""
    try:
        return ReturnMode(name)
    except ValueError:
        raise ConfigError(f"unknown return mode {name!r}; use one of {', '.join(RETURN_MODES)}") from None


# "auto", a sample count ("512") or a number of trainer batches ("4b").
_CAPACITY_RE = re.compile(r"^\s*(?:(auto)|(\d+)|(\d+(?:\.\d+)?)\s*b)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class RunConfig:
    """Options shared by every backend and engine.

    The defaults make ``aspc run plan.parquet`` meaningful on its own: a small
    pipeline of eight workers feeding a trainer that steps every 64 samples.
    """

    workers: int = 8  # generation workers W; >= 1
    global_batch: int = 64  # samples per trainer step; >= 1
    # Bounded-queue high-water mark: samples ("512"), trainer batches ("4b"), or
    # "auto" = one global batch plus one largest minibatch per worker, the least
    # that lets every worker keep generating while the trainer has a batch ready.
    queue_capacity: str = "auto"
    reload_time: float = 0.5  # seconds a worker spends loading new weights (sim); >= 0
    return_mode: ReturnMode = ReturnMode.STATIC  # when samples reach the queue
    seed: int = 0  # seeds lengths drawn from the plan's predictions (no --actual-lengths)
    max_new_tokens: int | None = None  # cap on every response length, tokens; None = no cap
    # K: the dispatcher starts no minibatch whose samples could be consumed more
    # than K weight versions after the one generating them (AReaL's
    # max_head_offpolicyness); None = unbounded lag.
    max_staleness: int | None = None
    samples_per_prompt: int | None = None  # override the plan's n_samples for every prompt
    backend: str = "sim"  # generation backend: sim | hf | vllm
    engine: str = "local"  # where workers run: local | ray
    # Run-log parts are flushed at least this often (wall seconds), so a crash
    # loses little finished work; sim runs finish faster and write one part.
    log_flush_seconds: float = 10.0
    # Worker faults: a minibatch whose worker raised, hung or died is handed out
    # again, at most this many times before the run stops.
    max_retries: int = 3
    # Wall seconds a generation call may run before it is abandoned as hung
    # (wall-clock engines); None = no limit.
    worker_timeout: float | None = None
    # Time a fixed reference minibatch on every worker before the first
    # dispatch and after the last (real backends, local engine): the log then
    # says how fast the machine was, apart from the plan.
    speed_probe: bool = False

    def validate(self) -> None:
        """Raise :class:`ConfigError` for a value no run could use.

        Types first, then the ranges this method always checked (their words unchanged), then the
        command line's upper bounds (:func:`aspc.guards.check_run_config`): a Python caller's
        ``global_batch=64.5`` or ``'64'`` failed deep in the engine, not here.
        """
        from aspc.guards import check_number, check_run_config

        for name in ("workers", "global_batch", "reload_time", "max_retries", "log_flush_seconds", "seed"):
            if getattr(self, name) is None:
                raise ConfigError(f"--{name.replace('_', '-')} must be given, got None (RunConfig.{name})")
        for name, integer in _NUMERIC_FIELDS:
            check_number(f"--{name.replace('_', '-')}", getattr(self, name), integer=integer)  # no bounds: the type
        if not isinstance(self.workers, numbers.Integral) or self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.global_batch < 1:
            raise ConfigError(f"--global-batch must be >= 1 sample, got {self.global_batch}")
        if not math.isfinite(self.reload_time) or self.reload_time < 0:
            raise ConfigError(
                f"--reload-time must be a finite number of seconds >= 0, got {self.reload_time}"
            )
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_staleness is not None and (
            isinstance(self.max_staleness, bool) or not isinstance(self.max_staleness, numbers.Integral) or self.max_staleness < 1
        ):
            raise ConfigError(f"--max-staleness must be an integer >= 1, got {self.max_staleness!r}")
        if self.samples_per_prompt is not None and self.samples_per_prompt < 1:
            raise ConfigError(f"--samples-per-prompt must be >= 1, got {self.samples_per_prompt}")
        if _CAPACITY_RE.match(str(self.queue_capacity)) is None:
            raise ConfigError(
                f"--queue-capacity {self.queue_capacity!r} is not a sample count (512), "
                "a number of trainer batches (4b) or 'auto'"
            )
        parse_return_mode(self.return_mode)
        if not isinstance(self.max_retries, numbers.Integral) or self.max_retries < 0:
            raise ConfigError(f"--max-retries must be >= 0, got {self.max_retries}")
        if self.worker_timeout is not None and not (math.isfinite(self.worker_timeout) and self.worker_timeout > 0):
            raise ConfigError(f"--worker-timeout must be a finite number of seconds > 0, got {self.worker_timeout}")
        if not math.isfinite(self.log_flush_seconds) or self.log_flush_seconds < 0:
            raise ConfigError(f"--log-flush-seconds must be >= 0, got {self.log_flush_seconds}")
        check_run_config(self)


# RunConfig's numeric fields and whether each is an integer (validate checks their types first).
_NUMERIC_FIELDS = (("workers", True), ("global_batch", True), ("reload_time", False), ("max_new_tokens", True),
                   ("max_staleness", True), ("samples_per_prompt", True), ("max_retries", True),
                   ("worker_timeout", False), ("log_flush_seconds", False))  # fmt: skip


# Options that change how a run copes, not what it computes: a resumed run may change them.
OPERATIONAL_KEYS = ("log_flush_seconds", "max_retries", "worker_timeout", "speed_probe")


# The simulator's kernels count samples in int64; no queue holds 2**62 samples.
_MAX_CAPACITY = 2**62


def capacity_spelling(value: object) -> object:
    """``--queue-capacity`` as one spelling ("AUTO " and "auto", "064" and "64", "4.0b" and "4b" alike).

    For comparing a resume's options with a log's; a value that is not a capacity comes back as given.
    """
    m = _CAPACITY_RE.match(str(value))
    if m is None:
        return value
    auto, samples, batches = m.groups()
    return "auto" if auto else str(int(samples)) if samples is not None else f"{float(batches)!r}b"


def resolve_queue_capacity(config: RunConfig, largest_minibatch: int) -> int:
    """The queue's high-water mark in samples.

    Parameters
    ----------
    config
        The run configuration (``queue_capacity`` and ``global_batch``).
    largest_minibatch
        Samples in the plan's largest minibatch.

    Raises
    ------
    ConfigError
        A malformed value, or a capacity below one global batch: the trainer
        could never gather a step's samples and the run would deadlock.
    """
    m = _CAPACITY_RE.match(str(config.queue_capacity))
    if m is None:
        config.validate()  # raises with the message
        raise AssertionError("unreachable")
    auto, samples, batches = m.groups()
    if auto:
        cap = config.global_batch + config.workers * int(largest_minibatch)
    elif samples is not None:
        cap = int(samples)
    else:
        cap = int(math.floor(float(batches) * config.global_batch))
    if cap > _MAX_CAPACITY:
        raise ConfigError(
            f"--queue-capacity {config.queue_capacity} ({cap} samples) is more than {_MAX_CAPACITY:,} samples; "
            "give a smaller count, or 'auto'"
        )
    if cap < config.global_batch:
        raise ConfigError(
            f"--queue-capacity {config.queue_capacity} ({cap} samples) is smaller than one global batch "
            f"({config.global_batch} samples); the trainer could never start: use at least "
            f"{config.global_batch} or '1b'"
        )
    return cap


def global_batch_note(config: RunConfig, plan_table: object) -> list[str]:
    """A note when the global batch is larger than the whole plan: the trainer will take no step.

    Not an error: a smoke test of generation on a few prompts with the default
    batch is legitimate; but a run that exits 0 with no trainer step, no
    iteration time and every sample left over must not read as a result.
    """
    import pyarrow.compute as pc

    from aspc.emit import schema as S

    rows = plan_table.num_rows  # type: ignore[attr-defined]
    per = config.samples_per_prompt
    n_samples = rows * per if per else int(pc.sum(plan_table.column(S.N_SAMPLES)).as_py() or 0)  # type: ignore[attr-defined]
    if config.global_batch <= n_samples:
        return []
    return [
        f"--global-batch {config.global_batch} is more than the plan's {n_samples} samples: the trainer takes no "
        f"step and every sample is left over; pass --global-batch {n_samples} or less for trainer metrics"
    ]


def revised_minibatch_bound(rows: int, slack: int | None, samples: int, largest: int) -> int:
    """Samples a minibatch of a ``--replan`` revision can hold, at most.

    A revision cuts the remainder into as many minibatches as it had, of ``b``
    prompts on average, kept at most the plan's largest (``rows`` prompts), and
    each holds at most ``b`` plus the slack (:func:`aspc.compiler.resolve_sizes`),
    of at most ``samples`` samples each; ``largest`` is the plan's own largest.
    """
    d = slack if slack is not None and slack < rows else rows // 4
    return max(int(largest), (rows + max(d, rows // 4)) * int(samples))


def staleness_notes(config: RunConfig, plan: object, *, check: bool = True, replan: bool = False) -> list[str]:
    """Under ``--max-staleness``: refuse a bound no minibatch of ``plan`` can meet, else note an unbounded order.

    The refusal (``check``: the plan runs as it is, not replaced by a scout's)
    comes here, before the command prints any note, as well as in
    :func:`aspc.runtime.run`. Under ``replan`` it is sized by the largest
    revision, as the run sizes it, so the K it suggests is one the run accepts.
    The note is not an error: the bound holds whatever the order; but asp's
    interleaving of long and short minibatches costs the most under a bound,
    where equal minibatches shortest first (``--order ascending``) cost the least.
    """
    if config.max_staleness is None:
        return []
    import numpy as np

    from aspc.emit import schema as S
    from aspc.io.table import column_numpy

    table = plan.table  # type: ignore[attr-defined]
    if check and table.num_rows:
        per = config.samples_per_prompt
        n = np.full(table.num_rows, per) if per else column_numpy(table.column(S.N_SAMPLES))  # to_numpy imports pandas
        mb = column_numpy(table.column(S.MINIBATCH))
        largest = int(np.bincount(mb, weights=n).max())
        if replan:
            slack = (plan.config or {}).get("slack")  # type: ignore[attr-defined]
            largest = revised_minibatch_bound(int(np.bincount(mb).max()), slack, int(n.max()), largest)
        check_staleness(config, largest, revised=replan)
    cfg = plan.config or {}  # type: ignore[attr-defined]
    if cfg.get("strategy", "asp") != "asp" or cfg.get("order", "lpt") == "ascending":
        return []
    return [
        f"the plan's {cfg.get('order', 'lpt')} order interleaves long and short minibatches, which a staleness "
        "bound makes wait on each other (reference scenario, K = 2: 1.10 x random under the same bound); "
        "for a bounded run compile it with --order ascending (0.95)"
    ]


def check_staleness(config: RunConfig, largest_minibatch: int, *, revised: bool = False) -> None:
    """Refuse a staleness bound that no dispatch could meet (the run would deadlock).

    With nothing in flight and up to one global batch minus one sample queued,
    a minibatch of ``s`` samples is consumed by step ``(B - 1 + s - 1) // B``
    steps ahead, so ``s <= K * B`` is needed for it ever to start.
    """
    k = config.max_staleness
    what = "a re-planned minibatch (up to " if revised else "the plan's largest minibatch ("
    if k is not None and largest_minibatch > k * config.global_batch:
        raise ConfigError(
            f"--max-staleness {k}: {what}{largest_minibatch} samples) is more than "
            f"{k} global batch{'es' if k != 1 else ''} ({k * config.global_batch} samples), so it could never start; raise "
            f"--max-staleness to {-(-largest_minibatch // config.global_batch)} or --global-batch to "
            f"{-(-largest_minibatch // k)}, or compile smaller minibatches"
        )


# Here, not in record.resume, so a command can check its options before loading the runtime.
def check_log_options(log_dir: str | os.PathLike | None, *, overwrite: bool, resume: bool) -> None:
    """Raise :class:`ConfigError` for ``--resume`` or ``--overwrite`` without ``--log``, or the two together."""
    if resume and log_dir is None:
        raise ConfigError("--resume continues a run log: pass the run's --log directory")
    if overwrite and log_dir is None:  # it was silently ignored
        raise ConfigError("--overwrite replaces a run log: pass its --log directory, or drop --overwrite")
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; pass one of them")
