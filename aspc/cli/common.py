"""Pieces every command shares: error handling, console, progress, options.

Rich lives only in this layer. Diagnostics and progress go to stderr; stdout
carries only the command's result (a table, or JSON with ``--json``).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from aspc.cli.error_line import LineError
from aspc.cli.result_stream import real_stdout, results_only_on_stdout  # noqa: F401 - re-exported for the commands
from aspc.errors import AspcError, Interrupted, OutputError


class StdoutError(OutputError):
    """The command's result could not be written to stdout (closed, full disk, a reader gone)."""

    pipe_closed = False  # the reader stopped reading (`aspc inspect P | head`): exit as a killed writer would


class _Stdout:
    """``sys.stdout`` as the commands write their results to it: a failed write is one line, not a traceback.

    Once a write failed, descriptor 1 points at /dev/null so that the
    interpreter's own flush at exit neither fails again (exit 120, "Exception
    ignored") nor prints half a result later.
    """

    def write(self, text: str) -> int:
        return self._call("write", text)

    def flush(self) -> None:
        self._call("flush")

    def isatty(self) -> bool:
        return real_stdout() is not None and real_stdout().isatty()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, ...: the real stream's
        return getattr(real_stdout(), name)

    @staticmethod
    def _call(name: str, *args: Any) -> Any:
        stream = real_stdout()
        if stream is None:  # started with stdout closed (>&-)
            raise StdoutError("stdout is closed; give the command somewhere to write its result (> FILE, or "
                              "> /dev/null)")  # fmt: skip
        try:
            return getattr(stream, name)(*args)
        except UnicodeEncodeError:
            if name != "write":
                raise
            # A stdout whose encoding cannot hold the text (PYTHONIOENCODING=ascii, a C locale on an old Python)
            # and a file name beyond it: escaped, as Python writes such text to stderr, not a traceback.
            enc = stream.encoding or "utf-8"
            args = (args[0].encode(enc, "backslashreplace").decode(enc),)
        except OSError as exc:
            raise stdout_failure(exc) from None
        try:
            return stream.write(*args)
        except OSError as exc:
            raise stdout_failure(exc) from None


def stdout_failure(exc: OSError, what: str = "the result") -> StdoutError:
    """The one-line error for a failed write of ``what`` to stdout; stdout is silenced so the exit's flush cannot fail."""
    _silence_stdout()
    if exc.errno == errno.EPIPE:
        err = StdoutError("stdout: the reader closed the pipe")
        err.pipe_closed = True
        return err
    why = exc.strerror or type(exc).__name__
    fix = "free space, or send the output elsewhere" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else (
        "send the output elsewhere")  # fmt: skip
    return StdoutError(f"cannot write {what} to stdout: {why}; {fix}")


def _silence_stdout() -> None:
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, real_stdout().fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):  # no descriptor behind it (a test's capture): nothing to flush
        pass


stdout = _Stdout()
# Diagnostics and bars go to stderr so ``--json`` output stays parseable.
err_console = Console(stderr=True, highlight=False)
# Piped output (make, CI logs) gets a wide fixed width so tables are not cut
# to 80 columns; a terminal keeps its own width.
out_console = Console(file=stdout, highlight=False, width=None if stdout.isatty() else 160)  # type: ignore[arg-type]


class CliError(LineError):
    """A ClickException that carries the library error's exit code."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn aspc's typed errors (and a few OS errors) into one-line CLI errors."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from aspc import interrupt

        try:
            with interrupt.handlers():
                return fn(*args, **kwargs)
        except Interrupted as exc:
            # Temporary files are gone (atomic writes clean up on the way out).
            raise CliError(
                f"interrupted by {interrupt.signal_name(exc.signum)}; {interrupt.outcome()}", exc.exit_code
            ) from None
        except StdoutError as exc:
            if exc.pipe_closed:  # silent, as `cat` or `grep` ended by SIGPIPE: the reader took what it wanted
                sys.exit(128 + 13)
            # Only the summary was lost: a script that sees the exit code must not think the output was too.
            # A run log's parts are many: the first few are named.
            names = interrupt.written()
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            msg = f"{exc} ({', '.join(names[:3])}{more} had already been written in full)" if names else str(exc)
            raise CliError(_one_line(msg), exc.exit_code) from None
        except AspcError as exc:
            raise CliError(_one_line(str(exc)), exc.exit_code) from None
        except FileNotFoundError as exc:
            raise CliError(f"file not found: {exc.filename}; check the path", 2) from None
        except PermissionError as exc:
            raise CliError(f"permission denied: {exc.filename}; check file permissions", 2) from None
        except IsADirectoryError as exc:
            raise CliError(f"expected a file but got a directory: {exc.filename}", 2) from None
        except MemoryError:
            from aspc.address_space import out_of_memory

            raise CliError(out_of_memory(), 2) from None
        except OSError as exc:
            if _in_numba_cache(exc):
                raise CliError(_numba_cache_line(exc), 2) from None
            # Errors about the path itself, whatever call met them first.
            fix = _PATH_FIXES.get(exc.errno) or (_DEVICE_FIX if exc.errno in _DEVICE_ERRNOS else None)
            if fix is None or exc.filename is None or exc.strerror is None:
                raise  # not known to be about the file it names (EMFILE names whatever was opened): a traceback
            raise CliError(_one_line(f"{exc.filename}: {exc.strerror}; {fix}"), 2) from None

    return wrapper


def _in_numba_cache(exc: OSError) -> bool:
    """Whether ``exc`` came from Numba saving a compiled kernel to its cache (it names no file)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") == "numba.core.caching":
            return True
        tb = tb.tb_next
    return False


def _numba_cache_line(exc: OSError) -> str:
    import numba

    where = numba.config.CACHE_DIR or "the package's __pycache__ or ~/.cache/numba"
    if exc.errno == errno.EFBIG:  # the process's limit: another directory would not help
        fix = "raise the file-size limit (ulimit -f; a cached kernel takes up to a few MB)"
    else:
        fix = "free space there, or set NUMBA_CACHE_DIR to a writable directory with room"
    return f"Numba could not save a compiled kernel to its cache ({where}): {exc.strerror or exc}; {fix}"


_PATH_FIXES = {
    errno.ENAMETOOLONG: "use a shorter path",
    errno.ELOOP: "the path has a symlink loop: fix or remove the link",
    errno.EROFS: "the file system is read-only: choose a writable path",
    errno.ENOTDIR: "a part of the path is a file, not a directory: check the path",
    errno.ENOSPC: "the disk is full: free space or choose another path",
    errno.EDQUOT: "the disk quota is used up: free space or choose another path",
}


# Errors of the device or mount a named file is on (a failing disk, a network mount gone stale, a removed
# device): what aspc can say is which file and what the system said; the file may read fine from another copy.
# Only these: others that name a file (EMFILE, EEXIST from a rename, ...) are not about the file's device.
_DEVICE_FIX = "the system could not read or write it: check the file and the device or mount it is on, or use a copy"
_DEVICE_ERRNOS = frozenset(
    getattr(errno, name) for name in ("EIO", "ESTALE", "ENXIO", "ENODEV", "ENOMEDIUM", "ENOLINK", "ECOMM", "EREMOTEIO")
    if hasattr(errno, name)
)


def _one_line(msg: str) -> str:
    return " ".join(msg.split())


class RichProgress:
    """Implements :class:`aspc.progress.Progress` with a rich bar on stderr.

    Disabled (a no-op) when stderr is not a terminal or ``quiet`` is set, so
    logs and CI output carry no bar noise.
    """

    def __init__(self, quiet: bool = False) -> None:
        self.enabled = not quiet and err_console.is_terminal
        self._progress: Progress | None = None
        self._task: Any = None

    def __enter__(self) -> RichProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=err_console,
                transient=True,
            )
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
            self._progress = None

    def stage(self, name: str, total: int | None = None) -> None:
        if self._progress is not None:
            if self._task is not None:
                self._progress.update(self._task, visible=False)
            self._task = self._progress.add_task(name, total=total)

    def advance(self, n: int = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)

    def done(self) -> None:
        if self._progress is not None and self._task is not None:
            task = self._progress.tasks[-1]
            if task.total is not None:
                self._progress.update(self._task, completed=task.total)


def emit_json(obj: Any) -> None:
    """Print one strict JSON object on stdout (and nothing else); a NaN or infinite number is null.

    Python writes them as NaN and Infinity, which strict parsers (jq, JSON.parse) refuse: the
    whole output was lost to a hand-edited metric. null is how aspc's --json says "no figure"
    elsewhere (aspc.predict.metrics), and allow_nan=False makes sure none slips through.
    """
    text = json.dumps(_finite(obj), sort_keys=True, default=_json_default, allow_nan=False)
    click.echo(text, file=stdout)  # type: ignore[arg-type]


def _finite(obj: Any) -> Any:
    """``obj`` with every non-finite float (NumPy's too) replaced by None, containers rebuilt.

    A loop over a stack, not a call per level: plan metadata nested 900 deep (read by json.loads,
    printed by check and by inspect's table) ran out of Python frames here. Refusing such metadata
    in read_plan instead would refuse plans that every other command reads.
    """
    import math

    root: list[Any] = [None]
    on_path: set[int] = set()  # containers being rebuilt: one met again inside itself is a cycle
    todo: list[tuple[Any, Any, Any]] = [(obj, root, 0)]  # (value, container to put it in, its key there)
    while todo:
        o, parent, key = todo.pop()
        if parent is None:  # all of container o's values are done
            on_path.discard(id(o))
        elif isinstance(o, float):
            parent[key] = o if math.isfinite(o) else None
        elif isinstance(o, (dict, list, tuple)):
            if id(o) in on_path:
                raise ValueError("Circular reference detected")  # as json.dumps says it
            on_path.add(id(o))
            items = list(o.items()) if isinstance(o, dict) else list(enumerate(o))
            new: Any = dict.fromkeys(k for k, _ in items) if isinstance(o, dict) else [None] * len(items)
            parent[key] = new
            todo.append((o, None, None))  # o itself, kept alive: a freed list's id is reused by the next
            todo.extend((v, new, k) for k, v in reversed(items))
        elif type(o).__module__ == "numpy":  # a NumPy scalar or array: as _json_default gives it, then checked
            todo.append((_json_default(o), parent, key))
        else:
            parent[key] = o
    return root[0]


def _json_default(o: Any) -> Any:
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")(fn)


def quiet_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--quiet", "-q", is_flag=True, help="No progress bars or diagnostics.")(fn)


def note(msg: str, quiet: bool = False) -> None:
    """A diagnostic line on stderr."""
    if not quiet:
        err_console.print(msg)



_SHOWN_SKIPPED = 10  # skipped rows the note names (the first one's reason); --json lists up to _LISTED_SKIPPED
_LISTED_SKIPPED = 1000


def skipped_note(skipped: list[Any], quiet: bool = False) -> None:
    """Under --on-bad-line skip, which rows were left out and why (``aspc.io.SkippedRow``s): the help promises
    "skip it and report it", and a count alone left the user to find them. Shared by compile and predict."""
    if not skipped:
        return
    from rich.markup import escape

    lines = ", ".join(str(s.line) for s in skipped[:_SHOWN_SKIPPED])
    more = f" and {len(skipped) - _SHOWN_SKIPPED} more" if len(skipped) > _SHOWN_SKIPPED else ""
    first = skipped[0]
    note(f"[yellow]skipped {len(skipped)} bad rows[/] (--on-bad-line skip): lines {lines}{more}; "
         f"line {first.line}: {escape(first.reason)} (--json lists every reason)", quiet)  # fmt: skip


def skipped_json(skipped: list[Any]) -> dict[str, Any]:
    """The ``--json`` keys of rows left out under --on-bad-line skip: ``skipped_rows`` only when there are any."""
    listed = [{"line": s.line, "reason": s.reason} for s in skipped[:_LISTED_SKIPPED]]
    return {"skipped_rows": listed} if listed else {}


def rerun_command(command: str, flag: str) -> str | None:
    """This process's own ``aspc COMMAND ...`` line with ``flag`` for ``--overwrite``/``--resume``, quoted for a shell.

    None when the process is not that command (a library call, a test runner): the caller says it in words.
    """
    argv = [a for a in sys.argv[1:] if a not in ("--overwrite", "--resume")]
    return " ".join(shell_word(a) for a in ["aspc", *argv, flag]) if command in argv else None


def shell_word(arg: str) -> str:
    """``arg`` quoted for bash or zsh, bytes that are not UTF-8 included.

    Python holds such bytes of ``sys.argv`` as lone surrogates, which ``shlex.quote`` printed as the
    text ``\\udcff``: the pasted command then named another file. ANSI-C quoting (``$'\\xff'``) gives
    the shell the very bytes back.
    """
    import shlex

    try:
        arg.encode()
        return shlex.quote(arg)
    except UnicodeEncodeError:
        pass
    out = []
    for b in os.fsencode(arg):
        c = chr(b)
        out.append(c if 0x20 <= b < 0x7F and c not in "'\\" else f"\\x{b:02x}")
    return "$'" + "".join(out) + "'"
