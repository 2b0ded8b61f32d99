"""``python -m convert``: a stop signal is one line from the moment this runs, then ``convert.cli.main``.

Importing the package and ``convert.cli`` takes about half a second, more
on a busy machine. A Ctrl-C in that time printed a KeyboardInterrupt
traceback, and a SIGTERM ended the process without a word (status -15).
Nothing has started yet, so the stop only has to say its line; the
package's own ``__init__`` runs before this module, though, and stays
uncovered. Once the command line is imported, its full stop
(``convert.cli._interrupted``: children killed, one line) holds until the
process ends, the interpreter's teardown included, and not only inside
``main``, which puts back what it found for callers in a process of their
own (tests, a notebook).
"""

import os
import signal
import sys

# convert.cli.INTERRUPTED, which cannot be imported before the handler that says it is in place.
INTERRUPTED = b"convert: interrupted; rerun the same command to continue\n"


def _stopped_early(signum: int, frame: object) -> None:
    """A stop signal before the command line is imported: no child exists yet, so only the line and the status."""
    os.write(2, INTERRUPTED)
    os._exit(128 + signum)


def _stop_early() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        # One this process was started ignoring (nohup, a script's background job) stays ignored, as in cli.
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _stopped_early)


if __name__ == "__main__":
    _stop_early()
    from .cli import _stop_on_signals, main

    _stop_on_signals()
    sys.exit(main())
