"""Typed errors raised by the aspc library.

The library never prints and never exits; it raises one of these. The CLI
turns each into a one-line message and a non-zero exit code, so a user never
sees a traceback for a mistake in their input.
"""

import re

# Arrow names the file again and adds a generic sentence; the message already
# names the file and says what to do, so both are dropped.
_ARROW_NOISE = re.compile(
    r"Could not open Parquet input source '[^']*': |\s*Either the file is corrupted or this is not a parquet file\.?"
)


def short_reason(exc: BaseException, *, limit: int = 160, with_type: bool = False) -> str:
    """A library's error text cut to fit one line of an aspc message, at a word, marked when cut."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a user's exception whose __str__ fails: its type still says something
        text = ""
    msg = _ARROW_NOISE.sub("", " ".join(text.split())).strip().rstrip(".")
    if len(msg) > limit:
        msg = msg[:limit].rsplit(" ", 1)[0] + " …"
    if with_type:
        return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    return msg or type(exc).__name__


def finding(exc: BaseException) -> str:
    """An aspc error's finding without its advice: its text before the first ``"; "``.

    For a message re-worded where the reader's advice does not apply (a plan that a
    run, not the user, compiled: "compile it again" would be wrong there).
    """
    return str(exc).split("; ")[0]


def epochs_root_hint(path: object) -> str:
    """How to name one epoch's log when ``path`` is the root of an ``aspc run --epochs`` run, else "".

    ``--epochs N`` writes one run log per pass under ``RUN/epoch-K``; the root
    itself has no ``meta.json``, so a command given it would say only "not a run log".
    """
    from pathlib import Path

    root = Path(str(path))
    try:
        ks = sorted(int(m.parent.name[6:]) for m in root.glob("epoch-*/meta.json") if m.parent.name[6:].isdigit())
    except OSError:
        return ""
    if not ks:
        return ""
    last = f" … {root / f'epoch-{ks[-1]}'}" if len(ks) > 1 else ""
    if (root / "scout" / "meta.json").is_file():  # 'aspc run --scout': its scout's log beside the epochs'
        return (f"; it holds the logs of 'aspc run --scout': the scout's, {root / 'scout'}, and {len(ks)} "
                f"epoch log{'s' if len(ks) > 1 else ''}: pass one, {root / f'epoch-{ks[0]}'}{last}")  # fmt: skip
    return f"; it holds the {len(ks)} epoch logs of 'aspc run --epochs': pass one, {root / f'epoch-{ks[0]}'}{last}"


class AspcError(Exception):
    """Base class for every error aspc raises on purpose.

    The message must say what is wrong and how to fix it, on one line.
    """

    exit_code = 2


class InputError(AspcError):
    """A dataset, length file or other user input is malformed."""


class ConfigError(AspcError):
    """An option or option combination is invalid."""


class PlanError(AspcError):
    """A plan file is unreadable, not an aspc plan, or internally inconsistent."""


class SchemaVersionError(PlanError):
    """A file was written by an aspc with an incompatible format version."""


class PredictorError(AspcError):
    """A predictor directory is missing, corrupt, or of the wrong kind/version."""


class BackendError(AspcError):
    """A runtime backend or engine cannot be used (missing extra, bad model)."""


class WorkerLostError(BackendError):
    """A worker's engine is gone for good (its process died): another try on it would fail the same way."""


class RunError(AspcError):
    """A run failed (worker faults past the retry limit, inconsistent run log)."""


class OutputError(AspcError):
    """An output cannot be written where asked: it is an input, a device, or the disk is full."""


class LockError(RunError):
    """Another process holds the run log's writer lock."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT arrived; raised in the main thread by :mod:`aspc.interrupt`.

    A ``KeyboardInterrupt`` subclass so that ``except Exception`` handlers do
    not swallow it, while ``finally`` blocks and ``except BaseException``
    cleanups (temporary files, the run log's last commit) still run.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        # The shell convention for a process ended by a signal.
        return 128 + self.signum
