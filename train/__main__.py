"""``python -m train [options]`` trains; ``python -m train demo [--out DIR]`` runs the end-to-end demo;
``python -m train eval --checkpoint CKPT --data OUT`` evaluates a checkpoint."""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "demo":
    from .demo import main as demo_main

    sys.exit(demo_main(sys.argv[2:]))
if len(sys.argv) > 1 and sys.argv[1] == "eval":
    from .evalcmd import main as eval_main

    sys.exit(eval_main(sys.argv[2:]))

from .main import main

sys.exit(main(sys.argv[1:]))
