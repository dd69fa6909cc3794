"""The one line a failing command writes last: whole, on stderr only, whatever the signals or the stream do."""

from __future__ import annotations

import contextlib
import sys

import click


def error_line(text: str) -> None:
    """Write ``text`` and a newline to stderr, as the command's last words before it exits.

    Signals are held while it is written and one that comes then is dropped: the
    process exits with this line's own code right after (a second Ctrl-C cut the
    line before a byte was written, and the run ended with no message). A closed
    stderr drops the line rather than put it on stdout, which may carry a JSON
    result; a full one (``2>/dev/full``) leaves the exit code the error's own
    (it became 1, which ``aspc check`` gives a violated bound).
    """
    from aspc import interrupt

    stream = sys.stderr
    if stream is None:
        return
    with interrupt.deferred(drop=True), contextlib.suppress(OSError, ValueError):  # ValueError: a closed file object
        stream.write(text + "\n")
        stream.flush()


class LineError(click.ClickException):
    """A click error shown as ``Error: MESSAGE`` through :func:`error_line`."""

    def show(self, file=None) -> None:  # noqa: ANN001, ARG002 - click's signature; always stderr
        error_line(f"Error: {self.format_message()}")
