"""Progress reporting protocol.

The library reports progress through this protocol and never touches the
terminal; the CLI passes a rich-backed implementation, tests and library users
get :class:`NullProgress`.
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def stage(self, name: str, total: int | None = None) -> None:
        """Start a named stage with an optional number of steps."""

    def advance(self, n: int = 1) -> None:
        """Advance the current stage by ``n`` steps."""

    def done(self) -> None:
        """Finish the current stage."""


class NullProgress:
    """A progress sink that ignores everything."""

    def stage(self, name: str, total: int | None = None) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def done(self) -> None:
        pass


NULL_PROGRESS = NullProgress()
