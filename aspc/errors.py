"""Typed errors raised by the aspc library.

The library never prints and never exits; it raises one of these. The CLI
turns each into a one-line message and a non-zero exit code, so a user never
sees a traceback for a mistake in their input.
"""


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


class RunError(AspcError):
    """A run failed (worker faults past the retry limit, inconsistent run log)."""
