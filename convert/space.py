"""Whether OUT's device looks big enough for a run: an estimate from a few probed videos, said as advice."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterable

from .format import get_codec
from .plan import Plan, PlanError
from .rerun import HeldRecords
from .sources import VideoItem

SPACE_SAMPLE = 16  # videos probed to estimate the space a job needs


def pending_videos(plan: Plan, shards: Iterable[int], held: HeldRecords) -> list[VideoItem]:
    """The videos of ``shards`` that this run will convert (those their shards hold no record of)."""
    pending = []
    for i in shards:
        try:
            done = {r.video_id for r in held(i) or ()}
        except PlanError:
            done = set()  # a damaged shard: its process sets it aside and converts it all again
        pending += [item for item in plan.shards[i] if item.id not in done]
    return pending


def estimate(plan: Plan, pending: list[VideoItem]) -> int | None:
    """Bytes ``pending`` will take, from up to SPACE_SAMPLE probed videos; None if none probes."""
    from .decode import VideoDecoder, VideoError
    from .shard_worker import estimate_bytes

    if not pending:
        return 0
    step = max(1, len(pending) // SPACE_SAMPLE)
    sizes = []
    for item in pending[::step][:SPACE_SAMPLE]:
        try:
            with VideoDecoder(item.path, plan.config.frame_spec()) as dec:
                sizes.append(estimate_bytes(dec, plan.config))
        except VideoError:
            continue  # the conversion records why; it adds nothing to the estimate
    if not sizes:
        return None
    # Raw bytes, divided by what the codec can count on storing less: an upper bound.
    ratio = get_codec(plan.config.codec).expected_ratio
    return int(sum(sizes) / len(sizes) * len(pending) / ratio)


def estimate_bytes_needed(out: str, plan: Plan, shards: Iterable[int], *,
                          held: HeldRecords | None = None) -> int | None:
    """Bytes the pending videos of ``shards`` will take, from a few probed videos; None if none probes.

    A sample, not every video: probing reads each container's header, and a
    Kinetics job has 240k of them.
    """
    return estimate(plan, pending_videos(plan, shards, held or HeldRecords(out=out, plan=plan)))


def _warn_if_short(out: str, plan: Plan, pending: list[VideoItem], say: Callable[[str], None]) -> None:
    need = estimate(plan, pending)
    free = shutil.disk_usage(out).free
    if need and need > free:
        say(f"{out}: this run needs about {_human(need)} (estimated from up to {SPACE_SAMPLE} probed videos) "
            f"but the device has {_human(free)} free; it stops cleanly when the disk fills, and a rerun after "
            f"freeing space goes on from there")


class SpaceCheck(threading.Thread):
    """Warns (through ``say``) when OUT's device looks too small for ``pending``; runs beside the shards.

    Probing imports PyAV into the job process and opens up to SPACE_SAMPLE
    videos, time the shard processes waited when it ran before them (median
    ``run_job`` on one tiny local video 0.314 -> 0.281 s in a thread; on
    network storage, 16 container opens). The warning is only advice (a full
    disk stops the job cleanly anyway), so it may come a moment after the
    shards start. The pending videos are listed before the shards start
    writing, from the records read already; the thread only probes files and
    asks the device for its free space. ``run()`` called directly checks in
    the caller's thread. A probe that fails unexpectedly is said, not raised.
    """

    def __init__(self, *, out: str, plan: Plan, pending: list[VideoItem], say: Callable[[str], None]) -> None:
        super().__init__(name="convert-space-check", daemon=True)
        self.out, self.plan, self.pending, self.say = out, plan, pending, say

    def run(self) -> None:
        try:
            _warn_if_short(self.out, self.plan, self.pending, self.say)
        except Exception as exc:  # noqa: BLE001 - advice only: the conversion goes on without it
            self.say(f"{self.out}: could not estimate the space this run needs ({type(exc).__name__}: {exc})")


def _human(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 1 << 30 else f"{n / 2**20:.0f} MiB"


__all__ = ["SPACE_SAMPLE", "SpaceCheck", "estimate", "estimate_bytes_needed", "pending_videos"]
