"""Decode one video with PyAV into uint8 RGB frames of a fixed size.

Resizing goes through a libavfilter graph (rotate, scale, then convert to RGB),
which measured faster than ``VideoFrame.reformat`` on Kinetics footage
(docs/benchmarks.md). Frame selection for a target fps happens before the graph, so
dropped frames are never scaled.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from ..format.layout import MAX_ASPECT

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
        if min(width, height) < 1 or max(width, height) > MAX_ASPECT * min(width, height):
            # The format bounds a frame's long side by its short side's (readers refuse any other clip).
            raise VideoError(f"frames of {width}x{height} are wider than the {MAX_ASPECT}:1 aspect a short-side "
                             f"conversion stores")
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
    stream: int  # the index of the video stream these describe (``choose_video_stream``)


# FFmpeg's display-matrix convention: rotation is counter-clockwise degrees, and
# the filters below turn the picture upright the way ffmpeg's autorotate does.
_ROTATIONS = {90: ["transpose=cclock"], 180: ["hflip", "vflip"], 270: ["transpose=clock"]}


def _rotation_filters(rotation: float) -> list[str]:
    return _ROTATIONS.get(int(round(rotation)) % 360, [])


# The demuxers a video may be read with: FFmpeg's single-file containers for the extensions
# ``convert.worker.sources`` takes (mov is also mp4, m4v, 3gp; matroska also webm), and the elementary streams
# such files sometimes really are. Any other format FFmpeg detects is refused before its header is read:
# a concat list, a playlist (hls, dash) or an image sequence opens other files, and an ffconcat file that
# names itself opened itself until the process ran out of descriptors.
DEMUXERS = ("mov", "matroska", "avi", "flv", "live_flv", "mpeg", "mpegts", "mpegvideo", "m4v", "ogg", "h264",
            "hevc", "ivf")
# FFmpeg's own checks, given to every open: only the file protocol (no URL, no ``concat:``, ``subfile:`` or
# ``data:`` wrapper), only those demuxers (checked after probing, so detection is as without the list).
OPEN_OPTIONS = {"protocol_whitelist": "file", "format_whitelist": ",".join(DEMUXERS)}


def open_video(path: str) -> av.container.InputContainer:
    """``path`` opened as this package reads every video: one regular file, through one of ``DEMUXERS``.

    ``VideoError`` (the reason) for anything else, before FFmpeg reads past the probe: a FIFO or a device
    would block or never end, a concat list or playlist would open other files.
    """
    import av

    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None  # FFmpeg's own error names it below
    if mode is not None and not stat.S_ISREG(mode):
        raise VideoError("cannot open: not a regular file (a FIFO, a device or a socket would block or never "
                         "end): never opened as a video")
    try:
        return av.open(path, metadata_errors="ignore", container_options=OPEN_OPTIONS)
    except av.error.ArgumentError as exc:
        refused = _refused_format(path)
        if refused is None:
            raise VideoError(f"cannot open: {exc}") from exc
        raise VideoError(f"cannot open: FFmpeg reads it as {refused!r}, not as a video file (a concat list, a "
                         f"playlist or an image sequence would open other files); refused") from exc
    except (av.error.FFmpegError, OSError, UnicodeDecodeError) as exc:
        raise VideoError(f"cannot open: {exc}") from exc


def _refused_format(path: str) -> str | None:
    """The format FFmpeg detected in ``path`` when ``OPEN_OPTIONS`` refused it; None when that was not why.

    Asked only after a refusal: FFmpeg says it in a log line, and its log is off otherwise (routing it
    through Python costs on every damaged frame). The second open is refused at the same point, before
    the format reads anything.
    """
    import av
    import av.logging

    level, skip = av.logging.get_level(), av.logging.get_skip_repeated()
    av.logging.set_level(av.logging.ERROR)
    av.logging.set_skip_repeated(False)  # the same refusal for another file is said again
    try:
        with av.logging.Capture(local=True) as logs:
            try:
                av.open(path, metadata_errors="ignore", container_options=OPEN_OPTIONS).close()
            except (av.error.FFmpegError, OSError, UnicodeDecodeError):
                pass
    finally:
        av.logging.set_skip_repeated(skip)
        av.logging.set_level(level)
    for _level, name, message in logs:
        if "not on whitelist" in message:
            return name
    return None


def _tag_seconds(text: str) -> float | None:
    """A Matroska duration tag ("00:00:01.000000000") in seconds; None when it is no such time."""
    parts = text.strip().split(":")
    if len(parts) != 3:
        return None
    try:
        h, m, sec = int(parts[0]), int(parts[1]), float(parts[2])
    except ValueError:
        return None
    value = h * 3600 + m * 60 + sec
    return value if math.isfinite(value) and value >= 0 else None


def _stream_end(s: av.video.stream.VideoStream) -> float | None:
    """Seconds at which stream ``s`` itself says it ends; None when it does not say.

    MP4, AVI: the stream's duration. Matroska and WebM have none per track, but their writers (FFmpeg,
    mkvmerge) tag each track with its DURATION, the end of its last frame.
    """
    if s.duration is not None and s.time_base:
        start = s.start_time if s.start_time is not None else 0
        return float((start + s.duration) * s.time_base)
    for key, value in s.metadata.items():
        if key.upper() == "DURATION":
            return _tag_seconds(value)
    return None


def _stream_start(s: av.video.stream.VideoStream) -> float:
    """Seconds at which stream ``s`` starts; 0 when it does not say."""
    return float(s.start_time * s.time_base) if s.start_time is not None and s.time_base else 0.0


def _stream_rate(s: av.video.stream.VideoStream) -> float | None:
    """Frames a second the stream's header or FFmpeg's probe says; None when neither says."""
    rate = s.average_rate or s.guessed_rate or s.base_rate
    return float(rate) if rate else None


# Image codecs: a stream of one of these with no frame count and no duration is taken for a picture (cover art
# muxed as a plain track), not a video; a camera's MJPEG video in AVI or MP4 has a frame count in its header.
_IMAGE_CODECS = frozenset({"mjpeg", "png", "bmp", "tiff", "webp", "jpeg2000", "jpegls", "jpegxl", "qoi", "targa",
                           "ppm", "pgm", "pgmyuv", "pbm", "pam", "sgi", "pcx", "dds", "exr", "hdr", "xwd",
                           "sunrast"})


def _looks_still(s: av.video.stream.VideoStream) -> bool:
    """Whether stream ``s``'s header says it is one still picture rather than a video.

    Matroska keeps no attached_pic flag for a picture muxed as a track (``ffmpeg -i cover.jpg -i video.mp4
    out.mkv`` writes a one-frame MJPEG track first), so the header's frame count, the stream's own duration
    (no longer than one frame) or, with neither, an image codec says it instead.
    """
    import av

    if s.disposition & av.stream.Disposition.still_image or s.frames == 1:
        return True
    if s.frames:
        return False
    end = _stream_end(s)
    if end is None:
        codec = s.codec_context.codec  # None where this FFmpeg has no decoder for it
        return codec is not None and codec.canonical_name in _IMAGE_CODECS
    # One frame lasts 1/rate; half a frame more allows for the rounding of a duration tag.
    return end - _stream_start(s) <= 1.5 / (_stream_rate(s) or 25.0)


def _frames_estimate(s: av.video.stream.VideoStream) -> float:
    """The header's frame count, else the stream's own duration times its rate; 0 when neither says."""
    if s.frames:
        return float(s.frames)
    end, rate = _stream_end(s), _stream_rate(s)
    if end is None or rate is None:
        return 0.0
    return max(0.0, end - _stream_start(s)) * rate


def choose_video_stream(container: av.container.InputContainer) -> av.video.stream.VideoStream:
    """The video stream to decode, chosen much as ``ffmpeg`` maps a file's video when told nothing.

    Cover art flagged attached_pic is never chosen: it is one picture. Of the rest, a stream whose header
    says it is a still picture (``_looks_still``) only when nothing else is there; then the largest picture
    (width x height, as ffmpeg prefers), then the most frames, then the first in the file. Unlike ffmpeg, the
    default flag counts for nothing: a Matroska track that omits it is a default track by the spec, whatever
    it holds. ``VideoError`` when the file has no video stream but cover art, or none at all.
    """
    import av

    video = list(container.streams.video)
    candidates = [s for s in video if not s.disposition & av.stream.Disposition.attached_pic]
    if not candidates:
        raise VideoError("no video stream" + (" (only an attached picture: cover art)" if video else ""))

    def rank(s: av.video.stream.VideoStream) -> tuple[bool, int, float, int]:
        cc = s.codec_context
        # min() takes the first of equals: the file's order decides a tie, as before streams were ranked.
        return _looks_still(s), -(cc.width * cc.height), -_frames_estimate(s), s.index

    return min(candidates, key=rank)


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

        self._container = open_video(path)
        try:
            self._stream = choose_video_stream(self._container)
        except VideoError:
            self._container.close()
            raise
        self.stream_index: int = self._stream.index  # which of the file's streams is decoded, for a report to name
        # Where the video stream has no end of its own, how far the other streams' packets reached tells
        # a complete file from a cut one (the container's duration may be the audio's): those streams
        # are then demuxed too, their packets only looked at.
        self._others = [] if self._own_end() is not None else [
            s for s in self._container.streams
            if s.index != self._stream.index and s.type in ("audio", "video")
            and not s.disposition & av.stream.Disposition.attached_pic]
        self._others_reached: float | None = None
        self._stream.thread_type = "AUTO"
        self._stream.thread_count = spec.threads
        self.rate = _stream_rate(self._stream) or 25.0

    def _own_end(self) -> float | None:
        """Seconds at which the video stream itself says it ends; None when it does not say."""
        return _stream_end(self._stream)

    def _start(self) -> float:
        return _stream_start(self._stream)

    def _duration(self) -> float | None:
        """Seconds the stream (else the container) says it lasts; None when neither says."""
        end = self._own_end()
        if end is not None:
            return max(0.0, end - self._start())
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
        return Probe(s.codec_context.width, s.codec_context.height, self.rate, int(frames), s.index)

    def close(self) -> None:
        self._container.close()

    def __enter__(self) -> VideoDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- decoding -----------------------------------------------------------
    def _raw_frames(self) -> Iterator[av.VideoFrame]:
        import av

        video = self._stream.index
        try:
            for packet in self._container.demux(self._stream, *self._others):
                if packet.stream.index != video:  # not stream_index: 0 in PyAV's end-of-stream packets
                    self._note_other(packet)
                    continue
                for frame in cast("list[av.VideoFrame]", packet.decode()):  # the video stream's packet
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

    def _note_other(self, packet: av.Packet) -> None:
        """Remember where the latest packet of another stream ends (audio outlasting the picture)."""
        if packet.pts is None or not packet.time_base:
            return
        end = float((packet.pts + (packet.duration or 0)) * packet.time_base)
        if self._others_reached is None or end > self._others_reached:
            self._others_reached = end

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

    def _container_end(self) -> float | None:
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
        truncated. The end is the video stream's own; only where it has none is
        the container's end compared with how far any stream's packets reached
        (the container's duration is its longest stream's, often the audio's).
        """
        s = self._stream
        if s.frames:
            expected = s.frames - max(1, s.frames // 100)
            if self.frames_decoded < expected:
                return (f"truncated: decoded {self.frames_decoded} frames, fewer than the {s.frames} "
                        f"the container's header counts")
            return None
        if self._reached is None:
            return None
        end, reached, what = self._own_end(), self._reached, "the stream"
        if end is None:
            end, what = self._container_end(), "the file"
            if self._others_reached is not None:
                reached = max(reached, self._others_reached)
        if end is None:
            return None
        # Headers round durations: allow 5% and two frames.
        tolerance = 0.05 * max(end - self._start(), 0.0) + 2 * self._last_step
        if reached < end - tolerance:
            return (f"truncated: decoding stopped at {reached:.3f} s after {self.frames_decoded} frames, "
                    f"{what} ends at {end:.3f} s")
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
