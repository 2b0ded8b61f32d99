"""Run ``python -m train`` several times in one set of torchrun processes.

``python -m torch.distributed.run --nproc_per_node 2 -m tests.ddp_runs '[ARGV, ...]'``: each rank trains every
ARGV in turn, in one interpreter, so a test of several models pays torch's import and the launch once. The process group
outlives the runs: the trainer joins the one already started (``train.dist.init_distributed`` starts none
when one is), and its teardown at the end of each run is held back until the last, because a second group
started on the same rendezvous waits forever. Exits with the first non-zero status.
"""

from __future__ import annotations

import json
import sys

from train import dist
from train.main import main


def run_all(argvs: list[list[str]]) -> int:
    """Train each argv in order; the first failing run's status, else 0."""
    cleanup = dist.cleanup
    dist.cleanup = lambda: None
    try:
        for argv in argvs:
            status = main(argv)
            if status:
                return status
        return 0
    finally:
        dist.cleanup = cleanup
        cleanup()


if __name__ == "__main__":
    sys.exit(run_all(json.loads(sys.argv[1])))
