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
        import os

        if isinstance(value, str) and value == "":
            self.fail("is empty; give a file or directory name", param, ctx)
        # click's own words ("Directory 'x' is a file.") say what is wrong but not what to give.
        if isinstance(value, (str, os.PathLike)):
            name = os.fspath(value)
            if not self.file_okay and os.path.isfile(name):
                self.fail(f"{name!r} is a file; give {_what(param, 'a directory')}", param, ctx)
            if not self.dir_okay and os.path.isdir(name):
                self.fail(f"{name!r} is a directory; give {_what(param, 'a file')}", param, ctx)
        return super().convert(value, param, ctx)


def _what(param: click.Parameter | None, default: str) -> str:
    """What the parameter takes, by its metavar where that names a kind of input (RUN, PLAN)."""
    hints = {"RUN": "an aspc run log directory", "PLAN": "a plan .parquet file", "PREDICTOR": "a predictor directory"}
    meta = getattr(param, "metavar", None) or ""
    return hints.get(meta.strip("[].").upper(), default)
