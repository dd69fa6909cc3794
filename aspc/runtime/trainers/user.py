"""User trainers: ``--trainer module:factory``.

``--trainer module:factory`` is the **only place aspc imports user code**.
It imports ``module`` (the current directory is searched first, as
``python -m`` and ASGI servers do), takes its attribute ``factory`` and calls
``factory(context, **trainer_args)`` with the run's
:class:`~aspc.runtime.contracts.BackendContext` (``context.options`` holds the
resolved ``model`` path, ``device``, ...) and the ``--trainer-arg KEY=VALUE``
pairs. The factory must return a :class:`~aspc.runtime.contracts.Trainer`.
Nothing in a dataset, plan or run log can name code to import.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from aspc.errors import ConfigError, short_reason

_SPEC_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


def is_factory_spec(name: str) -> bool:
    """True if ``name`` looks like ``module.path:attribute``."""
    return ":" in name


def load_factory(spec: str) -> Callable[..., Any]:
    """Import the callable ``spec`` (``package.module:factory``) names.

    Raises
    ------
    ConfigError
        A malformed spec, a module that fails to import (its error named), a
        missing attribute, or one that is not callable.
    """
    if not _SPEC_RE.match(spec):
        raise ConfigError(f"--trainer {spec!r}: expected 'package.module:factory' (dotted names, one colon)")
    module_name, attr = spec.split(":", 1)
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    from aspc import interrupt, interrupt_libraries
    from aspc.runtime.contracts import raised_by_code

    try:
        # A Ctrl-C lands in the module's own code (it may import torch for many seconds), and leaves even
        # through a bare except there.
        with interrupt_libraries.must_escape(), interrupt.raising_in_imports():
            module = importlib.import_module(module_name)
    except SystemExit as exc:  # a script's sys.exit() at import: it ended aspc with its code and no word
        raise ConfigError(f"--trainer {spec}: importing {module_name!r} called sys.exit({exc.code!r}); "
                          "keep the script part of the module under 'if __name__ == \"__main__\":'") from None
    except BaseException as exc:  # any error while importing user code is the user's to fix (its own BaseException too)
        if isinstance(exc, KeyboardInterrupt) and not raised_by_code(exc):
            raise  # a real Ctrl-C (aspc.interrupt's Interrupted) stays an interrupt
        raise ConfigError(f"--trainer {spec}: cannot import {module_name!r} ({short_reason(exc, limit=200, with_type=True)})") from None
    finally:
        if added:
            sys.path.remove(cwd)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"--trainer {spec}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"--trainer {spec}: {attr!r} is not callable; point at a factory function or class")
    return obj


def make_user_trainer(spec: str, context: Any, trainer_args: dict[str, Any] | None = None) -> Any:
    """Build the trainer ``--trainer spec`` names; see the module docstring for the protocol."""
    from aspc.runtime.contracts import Trainer, signals_kept

    with signals_kept():  # the module or factory may install signal handlers of its own (torch.distributed, Ray)
        trainer = _built(spec, load_factory(spec), context, trainer_args)
    if not isinstance(trainer, Trainer):
        raise ConfigError(
            f"--trainer {spec}: the factory returned {type(trainer).__name__}, not an aspc.runtime.Trainer; "
            "subclass aspc.runtime.Trainer and implement step()"
        )
    return trainer


def _built(spec: str, factory: Callable[..., Any], context: Any, trainer_args: dict[str, Any] | None) -> Any:
    """``factory(context, **trainer_args)``, its failure one line."""
    from aspc.errors import AspcError
    from aspc.runtime.contracts import raised_by_code

    try:
        return factory(context, **(trainer_args or {}))
    except AspcError:
        raise
    except SystemExit as exc:
        raise ConfigError(f"--trainer {spec}: the factory called sys.exit({exc.code!r}); return a Trainer instead") from None
    except BaseException as exc:  # a Ctrl-C (aspc.interrupt's Interrupted) stays an interrupt
        if not raised_by_code(exc):
            raise
        raise ConfigError(f"--trainer {spec}: the factory failed ({short_reason(exc, limit=200, with_type=True)})") from None


def parse_trainer_args(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings as keyword arguments; values parse as JSON when they can (``lr=1e-3`` is a float)."""
    import json

    out: dict[str, Any] = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key.isidentifier():
            raise ConfigError(f"--trainer-arg {p!r}: expected KEY=VALUE with KEY a Python identifier")
        if key in out:  # last-wins dropped the first value unsaid
            raise ConfigError(f"--trainer-arg {key} is given twice; keep one value per key")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
        except RecursionError:  # valid JSON, deeper than Python's parser goes: a traceback before
            raise ConfigError(f"--trainer-arg {key}: its JSON value nests too deeply to read; pass a flatter value, "
                              "or a path to a file the trainer reads") from None
        if not _finite(out[key]):
            raise ConfigError(f"--trainer-arg {p!r}: JSON reads a number in it as NaN or infinity; pass finite "
                              f"numbers, or quote it as a JSON string ('{key}=\"{value}\"') if text is meant")  # fmt: skip
    return out


def _finite(value: Any) -> bool:
    """Whether no float in a parsed JSON value is NaN or infinite (json reads 1e999 as inf, and NaN)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True
