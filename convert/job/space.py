"""Whether OUT's device looks big enough for a run: an estimate from a few probed videos, said as advice."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable

from ..format import get_codec
from ..worker.plan import ConvertConfig, Plan, PlanError
from ..worker.sources import VideoItem
from .childproc import LineProcess, Stopped
from .rerun import HeldRecords
from .supervise import package_env

SPACE_SAMPLE = 16  # videos probed to estimate the space a job needs
PROBE_TIMEOUT = 300.0  # seconds one probe may take by default (the shards' default --video-timeout)


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


class Prober:
    """Probes videos in a child process (``convert.worker.probe``), never in this one.

    ``size(item)`` is the bytes the video's clips will take, or None when it
    cannot be opened, crashes its probe, or gives no answer within
    ``timeout`` seconds (its process is then killed, and the next probe
    starts another). ``cancel()``, from any thread, kills the process and
    makes every later ``size`` None at once.
    """

    def __init__(self, *, config: ConvertConfig, timeout: float = PROBE_TIMEOUT) -> None:
        self.config, self.timeout = config, timeout
        self._child: LineProcess | None = None
        self._cancelled = threading.Event()
        self._lock = threading.Lock()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def _start(self) -> LineProcess | None:
        with self._lock:
            if self._cancelled.is_set():
                return None
            if self._child is None:
                with open(os.devnull, "wb") as null:
                    self._child = LineProcess(module="convert.worker.probe", env=package_env(), stderr=null.fileno(),
                                              argv=lambda fds: [json.dumps(self.config.to_dict())])
            return self._child

    def size(self, item: VideoItem) -> int | None:
        child = self._start()
        if child is None:
            return None
        child.send({"id": item.id, "path": item.path})
        try:
            answer = child.read(self.timeout)
        except TimeoutError:
            answer = None  # it hangs: killed below, as a shard process that hangs on a video is
        if answer is None or self._cancelled.is_set():
            self._stop()
            return None
        return answer.get("bytes")

    def _stop(self) -> None:
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.close()

    def cancel(self) -> None:
        """Kill the probe process now (a read waiting on it returns at once); every later probe is None."""
        with self._lock:
            self._cancelled.set()
            child = self._child
        if child is not None:
            # Only the signal: the thread waiting on it reaps and closes it (two waits would race on its status).
            child.proc.kill()

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> Prober:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def estimate(plan: Plan, pending: list[VideoItem], *, prober: Prober | None = None) -> int | None:
    """Bytes ``pending`` will take, from up to SPACE_SAMPLE probed videos; None if none probes.

    The probes run in ``prober``'s child process (one with the default timeout when not given).
    """
    if not pending:
        return 0
    step = max(1, len(pending) // SPACE_SAMPLE)
    own = prober is None
    prober = prober or Prober(config=plan.config)
    try:
        # A video that does not probe is left out: the conversion records why.
        sizes = [n for n in (prober.size(item) for item in pending[::step][:SPACE_SAMPLE]) if n is not None]
    finally:
        if own:
            prober.close()
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


def _warn_if_short(out: str, plan: Plan, pending: list[VideoItem], say: Callable[[str], None],
                   prober: Prober) -> None:
    need = estimate(plan, pending, prober=prober)
    if prober.cancelled:
        return
    free = shutil.disk_usage(out).free
    if need and need > free:
        say(f"{out}: this run needs about {_human(need)} (estimated from up to {SPACE_SAMPLE} probed videos) "
            f"but the device has {_human(free)} free; it stops cleanly when the disk fills, and a rerun after "
            f"freeing space goes on from there")


class SpaceCheck(threading.Thread):
    """Warns (through ``say``) when OUT's device looks too small for ``pending``; runs beside the shards.

    Probing opens up to SPACE_SAMPLE videos, time the shard processes waited
    when it ran before them (on network storage, 16 container opens). The
    warning is only advice (a full disk stops the job cleanly anyway), so it
    may come a moment after the shards start. The pending videos are listed
    before the shards start writing, from the records read already; the
    thread only has videos probed and asks the device for its free space.

    The videos are opened in a child process (``Prober``), each probe given
    ``timeout`` seconds (the job's ``--video-timeout``): a video that hangs
    FFmpeg costs the check one timeout, never the job. ``finish(wait)`` waits
    at most ``wait`` seconds for the warning, then abandons the check (its
    process killed). ``run()`` called directly checks in the caller's thread.
    A probe that fails unexpectedly is said, not raised.
    """

    def __init__(self, *, out: str, plan: Plan, pending: list[VideoItem], say: Callable[[str], None],
                 timeout: float = PROBE_TIMEOUT) -> None:
        super().__init__(name="convert-space-check", daemon=True)
        self.out, self.plan, self.pending, self.say = out, plan, pending, say
        self.prober = Prober(config=plan.config, timeout=timeout)

    def run(self) -> None:
        try:
            _warn_if_short(self.out, self.plan, self.pending, self.say, self.prober)
        except Stopped:
            pass  # the job is being stopped by a signal: it says so itself
        except Exception as exc:  # noqa: BLE001 - advice only: the conversion goes on without it
            if not self.prober.cancelled:  # abandoned: nothing to say
                self.say(f"{self.out}: could not estimate the space this run needs ({type(exc).__name__}: "
                         f"{exc})")
        finally:
            self.prober.close()

    def finish(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for the check, then abandon it: the job's end never waits longer."""
        deadline = time.monotonic() + wait
        self.join(max(0.0, deadline - time.monotonic()))
        if self.is_alive():
            self.prober.cancel()
            self.join(5.0)  # the probe process is killed: its read returns at once


def _human(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 1 << 30 else f"{n / 2**20:.0f} MiB"


__all__ = ["PROBE_TIMEOUT", "SPACE_SAMPLE", "Prober", "SpaceCheck", "estimate", "estimate_bytes_needed",
           "pending_videos"]
