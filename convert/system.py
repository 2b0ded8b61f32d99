"""Process-level helpers every package shares: the CPUs this process may use, and lazy package exports."""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable


def cpu_count() -> int:
    """CPUs this process may run on (a SLURM or container limit), else all of the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def lazy_exports(package: str, table: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``table[name]`` (a submodule) on first use.

    Why: ``import loaders`` and ``import convert.format`` must not import torch
    or PyAV, which only some of their submodules need.
    """

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f".{module}", package), name)

    return __getattr__
