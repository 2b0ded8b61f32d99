"""``python -m train [options]`` trains; ``python -m train demo [--out DIR]`` runs the end-to-end demo;
``python -m train eval --checkpoint CKPT --data OUT`` evaluates a checkpoint (``train.commands`` chooses).

A stop signal while the command imports (torch: a second or more) is one
line and 128 + the signal's number (``convert.signals``), not a
KeyboardInterrupt traceback from inside torch; then the command's own
handling takes over (a training run saves and stops).
"""

import sys

from convert.signals import put_back, stop_while_starting

INTERRUPTED = "train: interrupted while starting; nothing was written"

if __name__ == "__main__":
    replaced = stop_while_starting(INTERRUPTED)
    from .commands import command

    run, rest = command(sys.argv[1:])
    put_back(replaced)
    sys.exit(run(rest))
