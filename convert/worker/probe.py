"""The space check's probe process (``python -m convert.worker.probe CONFIG``): opens videos for the job process.

The job process never opens a video itself: a file that hangs FFmpeg (a
FIFO that slipped in after planning, a stuck network mount) or crashes it
would hang or kill the whole job. This child, started and watched like a
shard process (``convert.job.childproc.LineProcess``), takes one JSON line per
video, ``{"path": ..., "id": ...}``, and answers ``{"bytes": N}`` (what the
video's clips will take, raw) or ``{"error": REASON}``; its caller kills it
when an answer does not come in time.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from ..signals import unblock_stop_signals
from .decode import VideoDecoder, VideoError
from .plan import ConvertConfig
from .shard_worker import estimate_bytes, install_hook
from .sources import VideoItem


def probe_video(item: VideoItem, config: ConvertConfig) -> int:
    """Bytes ``item``'s clips will take, raw, from its container's header; VideoError when it cannot be opened."""
    with VideoDecoder(item.path, config.frame_spec()) as dec:
        return estimate_bytes(dec, config)


def main(argv: list[str]) -> int:
    # The job stops this process itself (it kills it): Ctrl-C reaching the whole process group must not
    # print a traceback here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    unblock_stop_signals()  # blocked while it started (a Popen'ed child)
    config = ConvertConfig.from_dict(json.loads(argv[0]))
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything a library prints goes where stderr goes, not into the answers
    install_hook()  # the test suite's faults (a probe that hangs), as in a shard process
    for line in sys.stdin:
        cmd = json.loads(line)
        item = VideoItem(cmd["id"], cmd["path"], 0)
        try:
            answer: dict = {"bytes": probe_video(item, config)}
        except VideoError as exc:
            answer = {"error": str(exc)}
        proto.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
