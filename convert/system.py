"""What this process may use of the machine: the one definition every package asks."""

from __future__ import annotations

import os


def cpu_count() -> int:
    """CPUs this process may run on (a SLURM or container limit), else all of the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
