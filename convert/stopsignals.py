"""The job's stop signals (SIGINT, SIGTERM) held off while a child of the job starts.

A child of the job shares its process group, so Ctrl-C reaches it too, and a
Python child would print a KeyboardInterrupt traceback if the signal came
during its start-up, before it ignores the signal (the job stops its
children itself). Used by ``convert.forkserver`` (the server) and
``convert.childproc`` (a child started the ordinary way); the children
unblock once their own handling is set.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

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


__all__ = ["stop_signals_blocked", "unblock_stop_signals"]
