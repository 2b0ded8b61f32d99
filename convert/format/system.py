"""Process-level helpers every package shares: the CPUs this process may use, lazy package exports, objects named
``module:attribute`` (the hooks and plug-ins an environment variable names), and the stop
signals (SIGINT, SIGTERM) held off while a child process starts.

A child shares its parent's process group, so Ctrl-C reaches it too, and a
Python child would print a KeyboardInterrupt traceback if the signal came
during its start-up, before it ignores the signal (its parent stops its
children itself). Used by the conversion job's children (its fork server, a
child started the ordinary way) and the shard verifier's checkers; each child
unblocks the signals once its own handling is set.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
from collections.abc import Callable, Iterator
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


_STOP = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Start a child within this: it starts with SIGINT and SIGTERM blocked, until it unblocks them.

    A child of the job shares its process group, so Ctrl-C reaches it too,
    and a Python child would otherwise print a KeyboardInterrupt traceback
    if the signal came during its start-up, before its own handling is in
    place. The mask is the calling thread's only (the job's other threads
    still take the signal) and is inherited through fork and exec; the
    child unblocks (``unblock_stop_signals``) once it ignores them.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def unblock_stop_signals() -> None:
    """In a child started by ``stop_signals_blocked``, once its handling of them is set: take them again."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP)
