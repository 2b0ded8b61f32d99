"""Process-level helpers every package shares: the CPUs this process may use, and lazy package exports."""

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
    ``package`` (``"dataset"``) or a module path (``"convert.format.store"``).
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
