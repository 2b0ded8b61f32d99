"""``python -m train``'s commands: training (options only), ``demo`` and ``eval``, chosen by the first argument.

Kept apart from ``main`` so that choosing a command imports nothing heavy: a
mistyped command (``python -m train evl``) is answered at once, in one line,
with the command it is close to, instead of the trainer's parser's "the
following arguments are required: --data".
"""

from __future__ import annotations

import difflib
import functools
import sys
from collections.abc import Callable

COMMANDS = ("demo", "eval")


def mistyped_command(argv: list[str]) -> str | None:
    """The one-line message for a first argument that is no option and no command but close to one (``evl``:
    "did you mean eval?"), or None: a command, an option, or a word near none, which the trainer's parser
    answers as it does any stray argument."""
    if not argv or argv[0].startswith("-") or argv[0] in COMMANDS:
        return None
    close = difflib.get_close_matches(argv[0], COMMANDS, n=1, cutoff=0.6)
    if not close:
        return None
    return (f"unknown command {argv[0]}; did you mean {close[0]}? (python -m train {close[0]} --help; training "
            f"takes options only: python -m train --data OUT)")


def command(argv: list[str]) -> tuple[Callable[[list[str]], int], list[str]]:
    """The function that runs the command ``argv`` names (``python -m train ARGV``), imported (torch with it),
    and the arguments it takes; the function returns the exit status."""
    if argv and argv[0] == "demo":
        from .demo import main as demo_main

        return demo_main, argv[1:]
    if argv and argv[0] == "eval":
        from .evalcmd import main as eval_main

        return eval_main, argv[1:]
    problem = mistyped_command(argv)
    if problem is not None:
        return functools.partial(_refuse, problem), argv
    from .main import main

    return main, argv


def _refuse(problem: str, argv: list[str]) -> int:
    print(f"train: error: {problem}", file=sys.stderr)
    return 2


def dispatch(argv: list[str]) -> int:
    """Run the command ``argv`` names (``python -m train ARGV``); returns the exit status: 2 with one line on
    stderr for a mistyped command."""
    run, rest = command(argv)
    return run(rest)
