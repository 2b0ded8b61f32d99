"""The process that decodes and writes one shard (``python -m convert.worker.shard_worker``).

It is started and watched by ``supervise.run_shard``: commands come as JSON
lines on stdin, one answer per command goes back on a private copy of stdout.
The first line is the shard's own part of the plan (``plan.ShardPlan``): the
process never reads plan.json, so its start costs the same whatever the
dataset's size.
Running the decoder in its own process means an FFmpeg crash, a hang or the
OOM killer takes down only this process, and the supervisor knows exactly which
video was in flight.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import resource
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import numpy as np

from ..format import (
    DAMAGED_DIR,
    MANIFEST,
    ShardDamaged,
    ShardWriter,
    StoreError,
    VideoRecord,
    get_backend,
    shard_meta,
    shard_name,
)
from ..format.base import ClipProducer
from ..format.errors import storing
from ..format.system import import_named
from ..signals import unblock_stop_signals
from .clips import ClipCutter
from .decode import VideoDecoder, VideoError
from .plan import ConvertConfig, PlanError, ShardPlan
from .sources import VideoItem

log = logging.getLogger("convert.shard")
MACHINE_EXIT = 3  # the store failed (full disk, I/O error): the job must stop, no video is to blame

VALUE_OVERHEAD = 256  # header, key and LMDB node bytes per clip, rounded up

# What the process is doing, as it marks it in a byte its supervisor reads after it died: only a crash
# while DECODING is evidence against the video; in any other phase (between commands, storing what was
# decoded) the process died of the machine or of the code, and no video is to blame.
IDLE, DECODING, STORING = 0, 1, 2
_phase: mmap.mmap | None = None  # that byte (main maps it)


def set_phase(phase: int) -> None:
    """Mark what this process is doing (``supervise.DECODING``, ``STORING``, ``IDLE``) for its supervisor.

    Only a crash while decoding is taken for the video's: the mark is set
    around every call into the decoder and cleared whenever a clip goes to
    the writer, a store in shared memory that costs nothing beside a clip.
    """
    if _phase is not None:
        _phase[0] = phase


def clip_producer(item: VideoItem, config: ConvertConfig, threads: int,
                  decoder: VideoDecoder | None = None) -> Callable[[], ClipProducer]:
    """A repeatable generator function: yields clips, returns the VideoRecord."""
    frame_spec, clip_spec = config.frame_spec(threads), config.clip_spec()
    first = [decoder]

    def produce() -> ClipProducer:
        try:
            return (yield from decoded())
        finally:
            set_phase(STORING)  # what is left is the writer's: the record, the commit

    def decoded() -> ClipProducer:
        set_phase(DECODING)
        dec, first[0] = first[0], None
        if dec is None:
            try:
                dec = VideoDecoder(item.path, frame_spec)
            except VideoError as exc:
                return (yield from failed_producer(item, str(exc))())
        cutter = ClipCutter(clip_spec)
        try:
            with dec:
                for frame in frames_of(item, dec):
                    clip = cutter.push(frame)
                    if clip is not None:
                        set_phase(STORING)  # the writer encodes and stores the clip until the next one is asked
                        yield clip.index, clip.start_frame, clip.frames
                        set_phase(DECODING)
                    if cutter.done:
                        break
        except VideoError as exc:
            return (yield from failed_producer(item, str(exc))())
        except MemoryError:
            return (yield from failed_producer(item, "out of memory while decoding (see --max-memory)")())
        set_phase(STORING)
        tail = None if dec.damage else cutter.tail()
        if tail is not None:  # the frames after the last whole clip, in one more clip (ClipSpec.keeps_tail)
            yield tail.index, tail.start_frame, tail.frames
        n, frames = cutter.emitted, cutter.frames_seen
        record = lambda status, clips, reason="": VideoRecord(  # noqa: E731
            item.id, item.path, item.label, status, clips, frames, reason, stream=dec.stream_index)
        if dec.damage:
            if config.on_damage == "skip":
                return record("failed", 0, f"damaged, skipped by policy: {dec.damage}")
            if n == 0:
                return record("failed", 0, f"damaged before the first full clip: {dec.damage}")
            return record("partial", n, f"kept {n} clips before the damage: {dec.damage}")
        if n == 0:
            last = cutter.padded()
            if last is None:
                return record("short", 0, f"{frames} frames, a clip needs {clip_spec.span}; skipped by policy")
            yield last.index, last.start_frame, last.frames
            return record("padded", 1, f"{frames} frames, a clip needs {clip_spec.span}; filled by {clip_spec.short}")
        return record("ok", n)

    return produce


def frames_of(item: VideoItem, dec: VideoDecoder) -> Iterator[np.ndarray]:
    """The decoded frames of ``item``: the decode step, where the test suite's hook injects its faults."""
    return iter(dec)


def estimate_bytes(dec: VideoDecoder, config: ConvertConfig) -> int:
    probe = dec.probe()
    h, w = config.frame_spec().out_size(probe.width, probe.height)
    clips = max(1, config.clip_spec().count(probe.frames_estimate))
    return clips * (config.clip_len * h * w * 3 + VALUE_OVERHEAD)


def convert_video(writer: ShardWriter, item: VideoItem, config: ConvertConfig, threads: int) -> VideoRecord:
    """Decode, cut and store one video; a video that cannot be opened is recorded as failed."""
    set_phase(DECODING)  # opening the container and reading its header run FFmpeg's demuxer
    try:
        dec = VideoDecoder(item.path, config.frame_spec(threads))
        estimate = estimate_bytes(dec, config)
    except VideoError:
        dec, estimate = None, 0  # the producer reopens it and records the reason
    set_phase(STORING)
    return writer.write_video(item.id, item.label, clip_producer(item, config, threads, dec), estimate)


def failed_producer(item: VideoItem, reason: str) -> Callable[[], ClipProducer]:
    """A producer with no clips whose record says the video failed."""
    def produce() -> ClipProducer:
        return VideoRecord(item.id, item.path, item.label, "failed", 0, 0, reason)
        yield  # pragma: no cover - a generator that yields nothing
    return produce


def open_writer(out: str, shard: ShardPlan, options: Any = None) -> ShardWriter:
    """The writer of ``shard``, which stores the plan's data spec and its place among the shards.

    ``options``: the backend's options dataclass (None: its defaults).
    """
    meta = shard_meta(shard.data_spec(), index=shard.index, count=shard.count)
    return get_backend(shard.config.backend).writer(path=shard.path(out), codec=shard.config.codec, meta=meta,
                                                    options=options)


def open_or_set_aside(out: str, shard: ShardPlan, options: Any) -> tuple[ShardWriter, str | None]:
    """The shard's writer; an unfinished shard that cannot be opened is moved aside first (and a note says so).

    Its videos are then converted again into a fresh shard: nothing else is
    lost. A finished conversion's shard is never moved (``verify`` reports it).
    """
    try:
        return open_writer(out, shard, options), None
    except ShardDamaged as exc:
        if os.path.exists(os.path.join(out, MANIFEST)):
            raise
        path = shard.path(out)
        aside = os.path.join(out, DAMAGED_DIR, f"{os.path.basename(path)}-{time.strftime('%Y%m%dT%H%M%S')}")
        with storing("moving the damaged shard aside to", aside):
            os.makedirs(os.path.dirname(aside), exist_ok=True)
            os.rename(path, aside)
        log.warning("%s; moved aside to %s, its videos are converted again", exc, aside)
        return open_writer(out, shard, options), f"{exc}; moved aside to {aside} and converted again"


HOOK_ENV = "CONVERT_SHARD_HOOK"


def install_hook() -> None:
    """Call the ``module:function`` that ``$CONVERT_SHARD_HOOK`` names, once, as the shard process starts.

    How the test suite puts its fault injection (a decoder that crashes,
    hangs or fills the disk on a chosen video) into real shard processes,
    without shipping a video that really crashes FFmpeg and without a lookup
    on every video.
    """
    spec = os.environ.get(HOOK_ENV)
    if not spec:
        return
    import_named(spec)()


PLAN_OP = "plan"  # the first command: the shard's part of the plan


def plan_command(shard: ShardPlan) -> dict:
    """The first line the job sends a shard process: its shard's plan (``read_shard_plan`` reads it)."""
    return {"op": PLAN_OP, "shard": shard.to_dict()}


def read_shard_plan(stream: TextIO, index: int) -> ShardPlan:
    """Shard ``index``'s plan, the first line on ``stream`` (``{"op": "plan", "shard": ShardPlan.to_dict()}``);
    PlanError in one line when the stream ends first or its first line is not that shard's plan."""
    name = shard_name(index)
    line = stream.readline()
    if not line:
        raise PlanError(f"{name}: its input ended before the shard's plan, which the job sends first")
    try:
        cmd = json.loads(line)
    except ValueError as exc:
        raise PlanError(f"{name}: the first line of its input is not JSON ({exc})") from None
    if not isinstance(cmd, dict) or cmd.get("op") != PLAN_OP:
        raise PlanError(f"{name}: the first line of its input is not the shard's plan")
    try:
        shard = ShardPlan.from_dict(cmd.get("shard"))
    except PlanError as exc:
        raise PlanError(f"{name}: {exc}") from None
    if shard.index != index:
        raise PlanError(f"{name}: was sent the plan of {shard.name}")
    return shard


def main(argv: list[str]) -> int:
    global _phase
    # The job stops this process itself (it kills it, which is safe at any moment): Ctrl-C reaching the
    # whole process group must not print a traceback into the shard's log.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    unblock_stop_signals()  # blocked while it started (a Popen'ed child)
    out, index, opts = argv[0], int(argv[1]), json.loads(argv[2])
    if opts.get("phase_fd") is not None:
        _phase = mmap.mmap(opts["phase_fd"], 1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s shard %(process)d %(message)s")
    # Answers go on a private descriptor; anything a library prints lands in the log.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    if opts.get("max_memory"):
        # RLIMIT_DATA bounds the heap (decoder buffers, frames) but not the
        # file-backed LMDB map, so a huge video fails with MemoryError here
        # instead of waking the machine's OOM killer.
        limit = int(opts["max_memory"])
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    install_hook()
    # Under the memory limit already: the shard's plan is its own videos only.
    shard = read_shard_plan(sys.stdin, index)
    items = shard.items
    options = get_backend(shard.config.backend).make_options(opts.get("store"))
    try:
        writer, note = open_or_set_aside(out, shard, options)
    except StoreError as exc:
        proto.write(json.dumps({"machine": str(exc)}) + "\n")
        return MACHINE_EXIT
    with writer:
        done = writer.done_records()
        proto.write(json.dumps({"ready": True, "done": [i for i, it in enumerate(items) if it.id in done],
                                "complete": writer.complete_record() is not None, "note": note}) + "\n")
        for line in sys.stdin:
            cmd = json.loads(line)
            set_phase(STORING)  # every command but a video's decoding is the writer's work
            try:
                if not answer(cmd, writer, shard, opts, proto):
                    break
                set_phase(IDLE)
            except StoreError as exc:
                # A full disk or an I/O error says nothing about the video: nothing
                # of it was committed, and the job stops so a rerun redoes it.
                video = items[cmd["index"]].id if "index" in cmd else None
                proto.write(json.dumps({"index": cmd.get("index"), "video": video, "machine": str(exc)}) + "\n")
                return MACHINE_EXIT
    return 0


def answer(cmd: dict, writer: ShardWriter, shard: ShardPlan, opts: dict, proto: TextIO) -> bool:
    """Carry out one supervisor command and write its answer; False after ``finish``."""
    items = shard.items
    if cmd["op"] in ("video", "retry"):
        item = items[cmd["index"]]
        if cmd["op"] == "retry":
            # Its failure record goes only now, just before the new attempt. A job
            # killed before the new record commits leaves the video pending, so a
            # plain rerun converts it; a decoder crash is handled as for any video.
            writer.forget_video(item.id)
        rec = convert_video(writer, item, shard.config, opts.get("threads", 1))
        proto.write(json.dumps({"index": cmd["index"], **rec.to_dict()}) + "\n")
    elif cmd["op"] == "fail":
        item = items[cmd["index"]]
        rec = writer.write_video(item.id, item.label, failed_producer(item, cmd["reason"]), 0)
        proto.write(json.dumps({"index": cmd["index"], **rec.to_dict()}) + "\n")
    elif cmd["op"] == "finish":
        summary = writer.finish()
        proto.write(json.dumps({"finished": True, **summary}) + "\n")
        return False
    else:
        raise ValueError(f"unknown command {cmd!r}")
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
