"""The path type of every file and directory option and argument."""

from __future__ import annotations

from typing import Any

import click


class PathArg(click.Path):
    """``click.Path`` that refuses an empty value.

    pathlib reads ``''`` as ``'.'``: an empty INPUT became the current
    directory, and an empty ``--predictor`` quietly meant the default.
    """

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value == "":
            self.fail("is empty; give a file or directory name", param, ctx)
        return super().convert(value, param, ctx)
