"""``python -m train [options]`` trains; ``python -m train demo [--out DIR]`` runs the end-to-end demo."""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "demo":
    from .demo import main as demo_main

    sys.exit(demo_main(sys.argv[2:]))

from .main import main

sys.exit(main(sys.argv[1:]))
