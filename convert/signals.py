"""The commands' stop signals (SIGINT, SIGTERM, SIGHUP), defined once: taken one way everywhere, one line while a
command starts, and held off while a child process starts.

``python -m convert`` and ``python -m train`` spend their first second or
more importing (numpy, PyAV, torch) before their own handling of the
signals is in place. Without ``stop_while_starting``, a Ctrl-C there
printed a KeyboardInterrupt traceback from the middle of an import and a
SIGTERM ended the process without a word. Their ``__main__`` modules call
it before any heavy import, so this module imports the standard library
only (and ``import convert``, which runs first, imports nothing). Nothing
has been written yet in that time, so the stop only has to say its line and
end the process.

SIGHUP is a stop like SIGTERM: a closed terminal window or a dropped SSH
session sends it, and a command killed by it lost a training run's work
since its last checkpoint and said nothing. A process started under
``nohup`` ignores it, and keeps ignoring it (``take_stop_signals``): that is
what ``nohup`` asks for. Its line goes to a terminal that may be gone, so
it is written where a failed write cannot stop the stop (``say``).

A child shares its parent's process group, so Ctrl-C reaches it too, and a
Python child would print a KeyboardInterrupt traceback if the signal came
during its start-up, before it ignores the signal (its parent stops its
children itself): ``stop_signals_blocked`` holds them off until the child
unblocks them (``unblock_stop_signals``) once its own handling is set. Used
by the conversion job's children (its fork server, a child started the
ordinary way) and the shard verifier's checkers, so this module is of the
shard-access layer (``convert.store``) for the layering test, though it
stays at the top level beside the commands that take the signals.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

# The signals that stop a command from outside: Ctrl-C, a polite kill (a scheduler, docker stop), and a closed
# terminal or a dropped SSH session.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def take_stop_signals(handler: Callable[[int, Any], None],
                      signals: tuple[int, ...] = STOP_SIGNALS) -> dict[int, Any]:
    """``handler`` for ``signals`` (the stop signals unless told), but for one this process was started ignoring
    (``nohup``, a script's background job), which stays ignored as in every well-behaved program. Returns the
    handlers replaced, for ``put_back``. In the main thread only (where Python sets handlers)."""
    previous: dict[int, Any] = {}
    for sig in signals:
        current = signal.getsignal(sig)
        if current is not signal.SIG_IGN:
            previous[sig] = current
            signal.signal(sig, handler)
    return previous


def put_back(previous: dict[int, Any]) -> None:
    """The handlers ``take_stop_signals`` replaced, back in place."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def say(line: str) -> None:
    """``line`` (no newline) on stderr from a signal handler: not print, as the signal may have come in the middle
    of one; and a terminal that hung up (SIGHUP) fails the write, which must not keep the stop from ending the
    process."""
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass  # nobody is there to read it


def stop_while_starting(line: str) -> dict[int, Any]:
    """The stop signals end the process at once, writing ``line`` (one line, no newline) to stderr, with
    status 128 + the signal's number (``take_stop_signals``: one ignored stays ignored). Returns the handlers
    replaced, for ``put_back``."""

    def stopped(signum: int, frame: object) -> None:
        say(line)
        os._exit(128 + signum)

    return take_stop_signals(stopped)


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Start a child within this: it starts with the stop signals blocked, until it unblocks them.

    A child of the job shares its process group, so Ctrl-C reaches it too,
    and a Python child would otherwise print a KeyboardInterrupt traceback
    if the signal came during its start-up, before its own handling is in
    place. The mask is the calling thread's only (the job's other threads
    still take the signal) and is inherited through fork and exec; the
    child unblocks (``unblock_stop_signals``) once it ignores them.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def unblock_stop_signals() -> None:
    """In a child started by ``stop_signals_blocked``, once its handling of them is set: take them again."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
