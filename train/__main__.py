"""``python -m train [options]`` trains; ``python -m train demo [--out DIR]`` runs the end-to-end demo;
``python -m train eval --checkpoint CKPT --data OUT`` evaluates a checkpoint (``train.commands`` chooses)."""

import sys

from .commands import dispatch

sys.exit(dispatch(sys.argv[1:]))
