"""Decode one video with PyAV into uint8 RGB frames of a fixed size.

Resizing goes through a libavfilter graph (rotate, scale, then convert to RGB),
which measured faster than ``VideoFrame.reformat`` on Kinetics footage
(docs/benchmarks.md). Frame selection for a target fps happens before the graph, so
dropped frames are never scaled.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

if TYPE_CHECKING:
    import av


class VideoError(Exception):
    """This video cannot be used at all; ``str(err)`` is the reason."""


@dataclass(frozen=True)
class FrameSpec:
    """Output frames: fixed ``size`` (H, W), or ``short_side`` keeping aspect; optional fps."""

    size: tuple[int, int] | None = (128, 171)
    short_side: int | None = None
    fps: float | None = None
    threads: int = 1

    def __post_init__(self) -> None:
        if (self.size is None) == (self.short_side is None):
            raise ValueError("give exactly one of size=(H, W) and short_side=S")
        if self.size is not None and (len(self.size) != 2 or min(self.size) < 2 or max(self.size) > 8192):
            raise ValueError(f"size must be (H, W) with 2 <= H, W <= 8192, got {self.size}")
        if self.short_side is not None and not 2 <= self.short_side <= 8192:
            raise ValueError(f"short_side must be in 2..8192, got {self.short_side}")
        if self.fps is not None and not 0 < self.fps <= 1000:
            raise ValueError(f"fps must be in (0, 1000], got {self.fps}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0 lets FFmpeg choose), got {self.threads}")

    def out_size(self, width: int, height: int) -> tuple[int, int]:
        """(H, W) of the output for a displayed frame of ``width`` x ``height``."""
        if self.size is not None:
            return self.size
        s = cast(int, self.short_side)  # set whenever size is not (__post_init__)
        if width <= height:
            return max(2, round(height * s / width)), s
        return s, max(2, round(width * s / height))


@dataclass(frozen=True)
class Probe:
    """What the container says before decoding (used to pre-size the store)."""

    width: int
    height: int
    rate: float
    frames_estimate: int


# FFmpeg's display-matrix convention: rotation is counter-clockwise degrees, and
# the filters below turn the picture upright the way ffmpeg's autorotate does.
_ROTATIONS = {90: ["transpose=cclock"], 180: ["hflip", "vflip"], 270: ["transpose=clock"]}


def _rotation_filters(rotation: float) -> list[str]:
    return _ROTATIONS.get(int(round(rotation)) % 360, [])


class VideoDecoder:
    """Iterate a video's frames as uint8 (H, W, 3) arrays.

    Damage part-way (a packet the decoder rejects, a truncated file) stops the
    iteration; ``damage`` then holds the reason, counted in decoded (not yet
    resampled) frames. A video that cannot be opened raises ``VideoError``.
    """

    def __init__(self, path: str, spec: FrameSpec) -> None:
        self.path = path
        self.spec = spec
        self.damage: str | None = None
        self.frames_out = 0
        self.frames_decoded = 0
        self._tb: tuple[int, int] | None | bool = False  # decoded frames' time base (num, den); False: not seen yet
        self._reached: float | None = None  # latest end (pts + duration, seconds) of a decoded frame
        self._last_step = 0.0  # that frame's duration, seconds
        self._last_pts: float | None = None
        # PyAV is imported here, not with the module: the job process plans and
        # supervises without it (its import is part of the job's start-up).
        import av

        try:
            self._container = av.open(path, metadata_errors="ignore")
        except (av.error.FFmpegError, OSError, UnicodeDecodeError) as exc:
            raise VideoError(f"cannot open: {exc}") from exc
        if not self._container.streams.video:
            self._container.close()
            raise VideoError("no video stream")
        self._stream = self._container.streams.video[0]
        self._stream.thread_type = "AUTO"
        self._stream.thread_count = spec.threads
        rate = self._stream.average_rate or self._stream.guessed_rate or self._stream.base_rate
        self.rate = float(rate) if rate else 25.0

    def _duration(self) -> float | None:
        """Seconds the stream (else the container) says it lasts; None when neither says."""
        s = self._stream
        if s.duration is not None and s.time_base:
            return float(s.duration * s.time_base)
        if self._container.duration is not None:
            return self._container.duration / 1e6
        return None

    def probe(self) -> Probe:
        s = self._stream
        frames = s.frames
        if not frames:
            duration = self._duration()
            frames = math.ceil(duration * self.rate) if duration else 300
        if self.spec.fps is not None:
            frames = math.ceil(frames * self.spec.fps / self.rate) + 1
        return Probe(s.codec_context.width, s.codec_context.height, self.rate, int(frames))

    def close(self) -> None:
        self._container.close()

    def __enter__(self) -> VideoDecoder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- decoding -----------------------------------------------------------
    def _raw_frames(self) -> Iterator[av.VideoFrame]:
        import av

        try:
            for packet in self._container.demux(self._stream):
                for frame in packet.decode():
                    if frame.is_corrupt:
                        self.damage = f"corrupt frame after {self.frames_decoded} good frames"
                        return
                    self.frames_decoded += 1
                    self._note_end(frame)
                    yield frame
        except (av.error.FFmpegError, EOFError) as exc:
            # The decoder recovers after a bad packet, but what it shows next may
            # reference the damaged picture; everything before is trustworthy.
            self.damage = f"{type(exc).__name__} after {self.frames_decoded} good frames: {exc}"
            return
        # FFmpeg reads a truncated file without an error: it just ends early.
        self.damage = self._truncation()

    def _note_end(self, frame: av.VideoFrame) -> None:
        """Remember where the latest decoded frame ends (its pts plus its duration)."""
        t = frame.time
        if t is None:
            return
        tb = self._tb
        if tb is False:
            # Every frame of the stream has the stream's time base. Reading it
            # makes a Fraction each time, and multiplying by one more: a
            # measurable part of decoding. The integers give the same float
            # (both round the exact quotient once).
            base = frame.time_base
            tb = self._tb = (base.numerator, base.denominator) if base else None
        duration = frame.duration
        if duration and isinstance(tb, tuple):
            step = duration * tb[0] / tb[1]
        elif self._last_pts is not None and t > self._last_pts:
            step = t - self._last_pts  # no per-frame duration: the gap since the previous frame
        else:
            step = 1.0 / self.rate
        self._last_pts = t
        if self._reached is None or t + step >= self._reached:
            self._reached, self._last_step = t + step, step

    def _end_time(self) -> float | None:
        """Seconds at which the stream (else the container) says the video ends; None when neither says."""
        s = self._stream
        if s.duration is not None and s.time_base:
            start = s.start_time if s.start_time is not None else 0
            return float((start + s.duration) * s.time_base)
        c = self._container
        if c.duration is not None:
            return ((c.start_time or 0) + c.duration) / 1e6
        return None

    def _truncation(self) -> str | None:
        """Why decoding looks cut short, or None when it reached the video's end.

        A frame count in the header (MP4, AVI) is exact at any frame rate. Without
        one, where decoding stopped is compared with where the stream says it
        ends, in seconds: an estimate of duration x average rate would call a
        complete variable-frame-rate video (a 20 ms gap, then a 60 ms one, ...)
        truncated.
        """
        s = self._stream
        if s.frames:
            expected = s.frames - max(1, s.frames // 100)
            if self.frames_decoded < expected:
                return (f"truncated: decoded {self.frames_decoded} frames, fewer than the {s.frames} "
                        f"the container's header counts")
            return None
        end = self._end_time()
        if end is None or self._reached is None:
            return None
        start = s.start_time * s.time_base if s.start_time is not None and s.time_base else 0.0
        # Headers round durations and audio may outlast the picture: allow 5% and two frames.
        tolerance = 0.05 * max(end - float(start), 0.0) + 2 * self._last_step
        if self._reached < end - tolerance:
            return (f"truncated: decoding stopped at {self._reached:.3f} s after {self.frames_decoded} frames, "
                    f"the stream ends at {end:.3f} s")
        return None

    def _timed(self) -> Iterator[tuple[float, av.VideoFrame]]:
        """Frames with monotonic times; a missing or backward pts takes prev + 1/rate."""
        prev = None
        step = 1.0 / self.rate
        for frame in self._raw_frames():
            t = frame.time  # seconds as a float, None when the frame has no pts
            if prev is None:
                t = t if t is not None else 0.0
            elif t is None or t <= prev:
                t = prev + step
            prev = t
            yield t, frame

    def _selected(self) -> Iterator[tuple[av.VideoFrame, int]]:
        """(frame, times to emit) after resampling to ``spec.fps`` by nearest timestamp."""
        if self.spec.fps is None:
            for frame in self._raw_frames():  # no resampling: the frames' times are not needed
                yield frame, 1
            return
        period = 1.0 / self.spec.fps
        slot = 0
        held = None
        start = held_t = 0.0  # set with the first frame
        for t, frame in self._timed():
            if held is None:
                start, held, held_t = t, frame, t
                continue
            # Slots nearer to the held frame than to this one belong to the held
            # frame; a slot exactly halfway goes to the earlier frame.
            bound = (held_t + t) / 2 - start
            n = 0
            while slot * period <= bound + 1e-9:
                slot += 1
                n += 1
            if n:
                yield held, n
            held, held_t = frame, t
        if held is not None:
            # The last frame lasts one source frame: the output covers the whole video.
            bound = held_t + 1.0 / self.rate - start
            n = 0
            while slot * period < bound - 1e-9:
                slot += 1
                n += 1
            if n:
                yield held, n

    def _graph(self, frame: av.VideoFrame) -> av.filter.Graph:
        import av

        rot = _rotation_filters(frame.rotation or 0)
        w, h = frame.width, frame.height
        if any("transpose" in f for f in rot):
            w, h = h, w
        out_h, out_w = self.spec.out_size(w, h)
        graph = av.filter.Graph()
        node = graph.add_buffer(width=frame.width, height=frame.height,
                                format=frame.format.name,  # type: ignore[arg-type]  # PyAV takes the name too
                                time_base=frame.time_base or self._stream.time_base)
        chain = [graph.add(*f.split("=", 1)) for f in rot]
        chain.append(graph.add("scale", f"{out_w}:{out_h}:flags=bilinear"))
        chain.append(graph.add("format", "rgb24"))
        chain.append(graph.add("buffersink"))
        for nxt in chain:
            node.link_to(nxt)
            node = nxt
        graph.configure()
        return graph

    def __iter__(self) -> Iterator[np.ndarray]:
        graph = None
        for frame, repeat in self._selected():
            if graph is None:
                graph = self._graph(frame)
            graph.push(frame)
            rgb = graph.pull().to_ndarray()
            self.frames_out += 1
            yield rgb
            for _ in range(repeat - 1):
                self.frames_out += 1
                yield rgb.copy()
        if self.frames_out == 0 and self.damage is None:
            raise VideoError("no frames decoded")


def decode_all(path: str, spec: FrameSpec) -> tuple[np.ndarray, str | None]:
    """Every output frame of a video as one (N, H, W, 3) array, plus the damage reason."""
    with VideoDecoder(path, spec) as dec:
        frames = list(dec)
        if not frames:
            raise VideoError(dec.damage or "no frames decoded")
        return np.stack(frames), dec.damage
