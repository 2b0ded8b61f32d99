"""``python -m convert``: a stop signal is one line from the moment this runs, then ``convert.cli.main``.

Importing ``convert.cli`` takes about half a second, more on a busy
machine. A Ctrl-C in that time printed a KeyboardInterrupt traceback, and a
SIGTERM ended the process without a word (status -15). Nothing has started
yet, so the stop only has to say its line (``convert.signals``). The
package's own ``__init__`` runs before this module and imports nothing, so
only the interpreter's own start is left uncovered. Once the command line
is imported, its full stop (``convert.cli._interrupted``: children killed,
one line) holds until the process ends, the interpreter's teardown
included, and not only inside ``main``, which puts back what it found for
callers in a process of their own (tests, a notebook).
"""

import sys

from .signals import stop_while_starting

# convert.cli.INTERRUPTED, which cannot be imported before the handler that says it is in place.
INTERRUPTED = "convert: interrupted; rerun the same command to continue"


if __name__ == "__main__":
    stop_while_starting(INTERRUPTED)
    from .cli import _stop_on_signals, main

    _stop_on_signals()
    sys.exit(main())
