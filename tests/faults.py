"""Faults injected into real shard processes: the suite's ``CONVERT_SHARD_HOOK``.

``tests/conftest.py`` sets ``CONVERT_SHARD_HOOK=tests.faults:install`` for
the whole session; every shard process calls ``install()`` once as it
starts, and a test chooses the fault with ``CONVERT_TEST_FAULT``:
``"crash:ID"``, ``"hang:ID"``, ``"alloc:ID"``, ``"enospc:ID"`` or
``"crash_once:ID:MARKER_FILE"``. The fault strikes in the decode step of the
video ``ID``, so the suite proves that a decoder crash or hang costs one
video and nothing else, without shipping a file that really crashes FFmpeg.
"""

from __future__ import annotations

import errno
import os
import signal
import time

from convert import shard_worker
from convert.format import StoreFullError

FAULT_ENV = "CONVERT_TEST_FAULT"


def _strike(kind: str, marker: str, video_id: str) -> None:
    if kind == "crash" or (kind == "crash_once" and not os.path.exists(marker)):
        if marker:
            open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "hang":
        time.sleep(3600)
    if kind == "alloc":
        import numpy as np

        np.ones(1 << 40, dtype=np.uint8)  # 1 TiB: fails under any --max-memory
    if kind == "enospc":  # the store fills up in the middle of this video's clips
        raise StoreFullError(errno.ENOSPC, f"no space left for the shard (simulated while writing {video_id})")


def install() -> None:
    """Wrap the shard process's decode step so that the video ``$CONVERT_TEST_FAULT`` names meets its fault."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    kind, _, rest = spec.partition(":")
    target, _, marker = rest.partition(":")
    real = shard_worker.frames_of

    def frames_of(item, dec):
        if item.id == target:
            _strike(kind, marker, item.id)
        return real(item, dec)

    shard_worker.frames_of = frames_of
