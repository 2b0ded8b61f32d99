"""Process-level helpers every package shares: the CPUs this process may use, lazy package exports, and objects
named ``module:attribute`` (the hooks and plug-ins an environment variable names).

The stop signals held off while a child process starts are ``convert.signals``'s
(``stop_signals_blocked``), beside the one definition of the pair: that module
imports the standard library only, and importing anything of this package
imports numpy (``convert/format/__init__.py``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any


def cpu_count() -> int:
    """CPUs this process may run on (a SLURM or container limit), else all of the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def lazy_exports(package: str, table: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``table[name]`` on first use.

    ``table`` maps a name to the module that defines it: a submodule of
    ``package`` (``"dataset"``) or a module path (``"convert.store.store"``).
    Why: ``import loaders`` and ``import convert`` must not import torch or
    PyAV, which only some of their submodules need.
    """

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        path = module if "." in module else f"{package}.{module}"
        return getattr(importlib.import_module(path), name)

    return __getattr__


def import_named(spec: str) -> Any:
    """The object ``module:attribute`` names, its module imported now; ValueError when ``spec`` is not of that form
    (ImportError and AttributeError as they come)."""
    module, colon, name = spec.partition(":")
    if not (module and colon and name):
        raise ValueError(f"{spec!r} is not of the form module:attribute")
    return getattr(importlib.import_module(module), name)
