"""The commands' stop signals (SIGINT, SIGTERM): taken one way everywhere, and one line while a command starts.

``python -m convert`` and ``python -m train`` spend their first second or
more importing (numpy, PyAV, torch) before their own handling of the
signals is in place. Without ``stop_while_starting``, a Ctrl-C there
printed a KeyboardInterrupt traceback from the middle of an import and a
SIGTERM ended the process without a word. Their ``__main__`` modules call
it before any heavy import, so this module imports the standard library
only (and ``import convert``, which runs first, imports nothing). Nothing
has been written yet in that time, so the stop only has to say its line and
end the process.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def take_stop_signals(handler: Callable[[int, Any], None]) -> dict[int, Any]:
    """``handler`` for SIGINT and SIGTERM, but for one this process was started ignoring (``nohup``, a script's
    background job), which stays ignored as in every well-behaved program. Returns the handlers replaced, for
    ``put_back``. In the main thread only (where Python sets handlers)."""
    previous: dict[int, Any] = {}
    for sig in STOP_SIGNALS:
        current = signal.getsignal(sig)
        if current is not signal.SIG_IGN:
            previous[sig] = current
            signal.signal(sig, handler)
    return previous


def put_back(previous: dict[int, Any]) -> None:
    """The handlers ``take_stop_signals`` replaced, back in place."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def stop_while_starting(line: str) -> dict[int, Any]:
    """SIGINT and SIGTERM end the process at once, writing ``line`` (one line, no newline) to stderr, with
    status 128 + the signal's number (``take_stop_signals``: one ignored stays ignored). Returns the handlers
    replaced, for ``put_back``."""
    said = (line + "\n").encode()

    def stopped(signum: int, frame: object) -> None:
        os.write(2, said)  # not print: the signal may have come in the middle of one
        os._exit(128 + signum)

    return take_stop_signals(stopped)
