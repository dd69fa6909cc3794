"""Guards every command runs on its options and its output path.

Two families, each in one place so no command forgets a case:

* **Range guards** for numeric options. A value outside its range never
  reaches a kernel: Numba kernels do not check bounds, so an overflowing cost
  (``--minibatch-overhead 1e305`` makes every DP cost ``inf``) used to index
  out of range and crash the process with no message.
* **The output-path guard**: an output must not be one of the command's
  inputs (by real path or by inode, so symlinks and hard links are caught),
  must not be a device, FIFO or socket, and a trailing slash names a
  directory, never a file.

Symlink policy: an output path that is a symlink is written *through*, as a
shell redirection would: the link is kept and the file it points to is
replaced atomically. A dangling link, or a link to a non-regular file, is
refused. The input checks compare real paths, so ``-o link-to-input`` is
refused like ``-o input``.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from aspc.errors import ConfigError, OutputError

# Seeds feed numpy's SeedSequence and the annealer's 64-bit state; a
# non-negative value that fits a signed 64-bit integer works everywhere.
SEED_MAX = 2**63 - 1
# κ is in sequence-equivalents (a minibatch costs (|b| + κ)·max). A million is
# far past any useful value (κ ≫ B already means "fewest minibatches") and
# keeps every DP cost finite for lengths up to MAX_LENGTH and 10^8 prompts.
MINIBATCH_OVERHEAD_MAX = 1e6
# Annealing proposals: the kernel runs them in one compiled call that no
# signal interrupts (10^8 take ~8 s on 2 cores; 2**62 ran for hours, deaf to
# SIGTERM). 250 times the largest default, far past where the balance settles.
MAX_ANNEAL_ITERATIONS = 10**8
# Generation workers: the simulator and the dispatcher keep state per worker
# (2**31 of them ran out of memory with no message); no RL deployment runs
# anywhere near 65,536 generation engines.
MAX_WORKERS = 2**16
# Samples per trainer step: a trillion is far past any; the queue's auto
# capacity (one batch plus a minibatch per worker) then stays in range.
MAX_GLOBAL_BATCH = 2**40
# Response lengths in tokens: no model generates 10^9 tokens, and the largest
# cost (prompts × samples × length) then stays far below float64 overflow.
MAX_LENGTH = 1e9


def check_number(
    name: str,
    value: float | int | None,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    integer: bool = False,
) -> None:
    """Raise :class:`ConfigError` unless ``value`` is a finite number in range.

    ``None`` (an option left at its default) passes. ``lo`` is inclusive
    unless ``lo_open``; ``hi`` is inclusive.
    """
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__index__"):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if integer and not isinstance(value, int) and not hasattr(value, "__index__"):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if not integer and not math.isfinite(float(value)):
        raise ConfigError(f"{name} must be a finite number, got {value}")
    below = lo is not None and (value <= lo if lo_open else value < lo)
    above = hi is not None and value > hi
    if below or above:
        # Integer bounds print exactly (2147483647, not 2.14748e+09).
        fmt = (lambda x: f"{int(x)}") if integer else (lambda x: f"{x:g}")
        lo_txt = "" if lo is None else (f"> {fmt(lo)}" if lo_open else f">= {fmt(lo)}")
        hi_txt = "" if hi is None else f"<= {fmt(hi)}"
        rng = " and ".join(t for t in (lo_txt, hi_txt) if t)
        shown = value if integer or abs(float(value)) < 1e15 else f"{float(value):.3g}"
        raise ConfigError(f"{name} must be {rng}, got {shown}")


def check_seed(value: int | None, name: str = "--seed") -> None:
    """Seeds are integers in [0, 2**63 - 1] (numpy refuses negative seeds)."""
    if value is None:
        return
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ConfigError(f"{name} must be an integer in [0, 2**63-1], got {value!r}")
    if not 0 <= int(value) <= SEED_MAX:
        raise ConfigError(f"{name} must be an integer in [0, 2**63-1], got {value}")


def check_compile_config(config: object) -> None:
    """Range-check a :class:`aspc.compiler.CompileConfig` (duck-typed: no import cycle)."""
    g = getattr
    check_number("--batch-size", g(config, "batch_size"), lo=1, hi=2**31 - 1, integer=True)
    check_number("--slack", g(config, "slack"), lo=0, hi=2**31 - 1, integer=True)
    check_number("--minibatch-overhead", g(config, "minibatch_overhead"), lo=0, hi=MINIBATCH_OVERHEAD_MAX)
    check_number("--groups", g(config, "groups"), lo=1, hi=2**31 - 1, integer=True)
    check_number("--group-size", g(config, "group_size"), lo=1, hi=2**31 - 1, integer=True)
    check_number("--samples-per-prompt", g(config, "samples_per_prompt"), lo=1, hi=2**31 - 1, integer=True)
    check_number("--anneal-iterations", g(config, "anneal_iterations"), lo=0, hi=MAX_ANNEAL_ITERATIONS, integer=True)
    check_number("--max-response-length", g(config, "max_response_length", None), lo=1, hi=MAX_LENGTH, integer=True)
    check_number("--max-prompt-length", g(config, "max_prompt_length", None), lo=1, hi=MAX_LENGTH, integer=True)
    check_number("--workers", g(config, "workers", None), lo=1, hi=2**31 - 1, integer=True)
    check_seed(g(config, "seed"))
    history = g(config, "history", ())
    # One path given as a str was iterated character by character ("a: no such file").
    if isinstance(history, (str, bytes, os.PathLike)) or not all(isinstance(h, (str, os.PathLike)) for h in history):
        raise ConfigError(f"--history takes a list of paths, one per earlier epoch (history=('RUN',)), got {history!r}")


def check_run_config(config: object) -> None:
    """Range-check the numeric fields of a :class:`aspc.runtime.RunConfig`."""
    g = getattr
    check_number("--workers", g(config, "workers"), lo=1, hi=MAX_WORKERS, integer=True)
    check_number("--global-batch", g(config, "global_batch"), lo=1, hi=MAX_GLOBAL_BATCH, integer=True)
    check_number("--reload-time", g(config, "reload_time"), lo=0, hi=1e12)
    # The simulator's kernels hold K in an int64 and add it to a step count.
    check_number("--max-staleness", g(config, "max_staleness"), lo=1, hi=2**31 - 1, integer=True)
    check_number("--max-new-tokens", g(config, "max_new_tokens"), lo=1, hi=MAX_LENGTH, integer=True)
    check_number("--samples-per-prompt", g(config, "samples_per_prompt"), lo=1, hi=2**31 - 1, integer=True)
    check_number("--max-retries", g(config, "max_retries"), lo=0, hi=2**31 - 1, integer=True)
    check_number("--worker-timeout", g(config, "worker_timeout"), lo=0, lo_open=True, hi=1e12)
    check_number("--log-flush-seconds", g(config, "log_flush_seconds"), lo=0, hi=1e12)
    check_seed(g(config, "seed"))


def check_lengths(name: str, *arrays: object) -> None:
    """Lengths (predicted or known) must be finite and in [0, MAX_LENGTH] tokens."""
    import numpy as np

    for arr in arrays:
        a = np.asarray(arr, dtype=np.float64)
        if a.size == 0:
            continue
        bad = ~np.isfinite(a) | (a < 0) | (a > MAX_LENGTH)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ConfigError(
                f"{name}: length {a.flat[i]:.6g} (row {i}) is outside [0, {MAX_LENGTH:.0e}] tokens; "
                "fix the length field or the predictor"
            )


# --------------------------------------------------------------------------- output paths


def _identity(path: str | os.PathLike) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _input_files(inputs: Iterable[str | os.PathLike | None]) -> list[tuple[Path, tuple[int, int] | None, bool]]:
    """(real path, (dev, ino), is_dir) of every input that exists."""
    out = []
    for p in inputs:
        if p is None or str(p) == "":
            continue
        try:
            real = Path(os.path.realpath(p))
            out.append((real, _identity(real), real.is_dir()))
        except OSError:
            continue  # a name the OS refuses (too long, a loop) is no file; its reader words the error
    return out


def _is_within(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def check_not_cwd(target: str | os.PathLike, shown: str, option: str = "-o") -> None:
    """Refuse a directory output that is the current directory or holds it (symlinks resolved).

    Replacing it renames it aside (EBUSY for ``.``), or swaps the directory out from under the shell.
    """
    try:
        cwd = Path(os.path.realpath(os.getcwd()))
        real = Path(os.path.realpath(target))
    except OSError:
        return  # no current directory (removed): nothing to protect
    if real == cwd or _is_within(cwd, real):
        what = "the current directory" if real == cwd else "a directory holding the current directory"
        raise OutputError(f"{option} {shown}: {what} cannot be replaced; name a new directory, e.g. {option} out/")


def check_output(
    target: str | os.PathLike,
    *,
    inputs: Iterable[str | os.PathLike | None] = (),
    kind: str = "file",
    option: str = "-o",
    others: dict[str, str | os.PathLike] | None = None,
    resume: bool = False,
    example: str = "plan.parquet",
) -> Path:
    """Validate an output path before any work is done; return the path to write.

    Parameters
    ----------
    target
        The path the user named (a ``str`` keeps a trailing slash visible).
    inputs
        Every file or directory the command reads: the output may be none of
        them, nor (for a directory output) contain one or lie inside one.
    kind
        ``"file"`` or ``"dir"``: what the command writes at ``target``.
    option
        The option's name for the message.
    others
        The command's other outputs by option name: ``target`` may be none of
        them, nor lie inside one or contain one.
    resume
        ``target`` is a run log continued in place (``--resume``), which
        replaces nothing: the plan copy it keeps may be the input.
    example
        A file name of what the command writes, for the advice to a path
        ending in ``/``.

    Returns
    -------
    Path
        The path to write: ``target`` with symlinks resolved (so the link is
        kept and its target replaced atomically).

    Raises
    ------
    OutputError
        Output equal to an input, a device/FIFO/socket, a dangling symlink, a
        directory where a file is written (or the reverse), or a trailing slash
        on a file output.
    """
    raw = os.fspath(target)
    if raw == "":
        raise OutputError(f"{option} is empty; give a path to write")
    if kind == "file" and raw.endswith(("/", os.sep)):
        raise OutputError(
            f"{option} {raw} ends with '/', which names a directory; give a file path, e.g. {raw}{example}"
        )
    path = Path(raw)
    try:
        link = path.is_symlink()
        if link and not path.exists():
            want = "a directory" if kind == "dir" else "a regular file"
            raise OutputError(f"{option} {raw} is a dangling symlink; remove it or point it at {want}")
        real = Path(os.path.realpath(path))
    except OSError as exc:
        # ENAMETOOLONG, ELOOP: the OS refuses the name itself.
        raise OutputError(f"{option} {raw}: cannot use this path ({exc.strerror}); choose another path") from None
    try:
        # stat the named path, following links: /dev/stdout -> /proc/self/fd/1
        # is a magic link whose realpath is no real file, but stat sees the pipe.
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"{option} {raw}: cannot inspect the path ({exc.strerror}); choose another path") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            if kind == "file":
                # A file inside an input directory would be refused next: name the way out instead.
                read = next((i for i, _, d in _input_files(inputs) if d and (i == real or _is_within(real, i))), None)
                if read is not None:
                    what = "the input directory" if read == real else "a directory inside the input"
                    raise OutputError(f"{option} {raw} is {what} {read.name}; give a file path outside it")
                raise OutputError(f"{option} {raw} is a directory; give a file path inside it")
        elif not stat.S_ISREG(st.st_mode):
            what = (
                "a character device" if stat.S_ISCHR(st.st_mode)
                else "a block device" if stat.S_ISBLK(st.st_mode)
                else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "not a regular file"
            )
            raise OutputError(f"{option} {raw} is {what}; aspc writes only regular files, choose another path")
        elif kind == "dir":
            raise OutputError(f"{option} {raw} is a file; give a directory path")
    if kind == "dir" and not resume and option != "--log":  # a run log is written in place, never renamed aside
        check_not_cwd(real, raw, option)
    ident = None if st is None else (st.st_dev, st.st_ino)
    for other_option, other in (others or {}).items():
        # Another output of the same command (probe's -o beside its --log): one written over or
        # inside the other would be replaced with it.
        o_real = Path(os.path.realpath(other))
        if o_real == real or _is_within(real, o_real) or _is_within(o_real, real):
            clash = (
                "is the same path as" if o_real == real else "lies inside" if _is_within(real, o_real) else "contains"
            )
            raise OutputError(
                f"{option} {raw} {clash} {other_option} {os.fspath(other)}; give each output its own path"
            )
    for in_real, in_ident, in_dir in _input_files(inputs):
        same = real == in_real or (ident is not None and ident == in_ident)
        if same:
            raise OutputError(
                f"{option} {raw} is also an input ({in_real.name}); writing it would replace your data: "
                "choose another output path"
            )
        if kind == "dir" and _is_within(in_real, real) and not (resume and _plan_copy(in_real, real)):
            raise OutputError(
                f"{option} {raw} contains the input {in_real.name}; replacing the directory would delete it: "
                "choose another output directory"
            )
        if in_dir and _is_within(real, in_real):
            # A predictor or run log is read as a whole: a file written into it
            # (over metadata.json, the run's plan) would corrupt it for later commands.
            raise OutputError(
                f"{option} {raw} lies inside the input directory {in_real.name}; writing there would change "
                "that input: choose a path outside it"
            )
    return real if link else path


# aspc.predict.pairs.PLAN_IN_LOG, which imports the readers that import this module.
PLAN_IN_LOG = "plan.parquet"


def _plan_copy(path: Path, log: Path) -> bool:
    """Whether ``path`` is a plan copy ``aspc run`` keeps in run log ``log`` (``plan.parquet``, or an epoch's).

    Resuming reads it and leaves it be: the copy it keeps is the same bytes,
    which :func:`aspc.predict.pairs.keep_plan_in_log` does not write again.
    """
    if not path.is_file():
        return False
    if path.name == PLAN_IN_LOG:
        return log in (path.parent, path.parent.parent)
    # An --epochs/--scout run's RUN/plans/epoch-K.parquet: a resume checks it against the plan it compiles
    # and writes it only where missing (a log copied without its plan is resumed from that copy).
    return re.fullmatch(r"epoch-[1-9][0-9]*\.parquet", path.name) is not None and path.parent == log / "plans"


def check_replaceable(target: Path, kind: str = "file") -> None:
    """At write time: refuse to replace anything but a regular file (or directory), links followed."""
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return
    except OSError:
        return
    ok = stat.S_ISREG(st.st_mode) if kind == "file" else stat.S_ISDIR(st.st_mode)
    if not ok:
        want = "regular file" if kind == "file" else "directory"
        raise OutputError(f"{target} exists and is not a {want}; aspc will not replace it: choose another path")


# Names of data formats: an output written under one replaced a dataset (other.jsonl) or passed for one.
DATA_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".txt", ".gz", ".bz2", ".xz", ".zst", ".zip",
                 ".arrow", ".feather", ".html", ".md", ".yaml", ".yml", ".parquet", ".pq", ".parq")  # fmt: skip


def check_output_suffix(given: str | os.PathLike, what: str, fmt: str, suffix: str) -> None:
    """Refuse ``-o given`` named as data of another format than ``fmt`` (``what`` is written as ``suffix``)."""
    own = (".parquet", ".pq", ".parq") if suffix == ".parquet" else (suffix,)
    got = Path(os.fspath(given)).suffix
    if got.lower() in DATA_SUFFIXES and got.lower() not in own:
        raise ConfigError(f"-o {os.fspath(given)}: {what} is {fmt}, not {got} data; name it {suffix}, "
                          f"e.g. -o {Path(os.fspath(given)).with_suffix(suffix)}")  # fmt: skip
