"""Synthetic stand-ins for the shared test videos, encoded with PyAV at test time.

The real files in ``../shared/testdata/videos`` (described in its SOURCES.tsv)
are not part of a clone. Each of them is here reproduced by one small file
with the same name and the same oddity: the container, the codec, the frame
count the tests rely on, audio beside the picture, and the quirk that makes
it worth testing (packed B-frames, a display matrix, no container duration,
a NAL unit with a broken length, irregular frame intervals). Tests refer to
the files by name, so the same test runs on either folder.

What the stand-ins do not copy is what no test needs: the real files' high
resolutions (1280x720 ones are 160x90 here) and their footage. Sizes a test
measures (294 pixels wide, the 568x320 rotated clip, the 340x256 aspect) are
kept. ``tests/test_videos_fixture.py`` checks every property listed here on
the files as written.

Every file is written deterministically: fixed pixel patterns, one encoder
thread (a thread count changes x264's and x265's bitstream), and the
muxers' bitexact flag (no random segment UID, no version strings), so the
bytes depend only on the encoder builds PyAV bundles (and, for the audio
tracks, perhaps on the CPU: see ``pictures_digest``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from fractions import Fraction

import numpy as np


@dataclass(frozen=True)
class Spec:
    """One synthetic file: what it must be, for the test that checks it and for the tests that use it."""

    container: str            # FFmpeg's demuxer name as PyAV reports it
    codec: str                # the video decoder's name
    width: int                # coded size
    height: int
    rate: Fraction            # the stream's average frame rate
    frames: int               # frames encoded (the real file's header count, or decoded count without one)
    audio: str | None         # the audio track's decoder name, if any
    oddity: str               # what the real file it stands for is in the suite for


# The real files' names; the real file's properties are in SOURCES.tsv.
SPECS: dict[str, Spec] = {
    "mmaction2__demo.mp4": Spec("mov,mp4,m4a,3gp,3g2,mj2", "h264", 170, 128, Fraction(28), 280, None,
                                "Kinetics-like h264 of 10 s: many clips (the real one is 340x256)"),
    "mmaction2__test.avi": Spec("avi", "mpeg4", 160, 120, Fraction(25), 164, "mp3float",
                                "AVI, MPEG-4 part 2 with DivX-packed B-frames: frames without a decode "
                                "timestamp, presentation timestamps out of order; mp3 audio"),
    "mmaction2__part_0.mp4": Spec("mov,mp4,m4a,3gp,3g2,mj2", "h264", 340, 256, Fraction(30), 32, None,
                                  "32 frames with irregular intervals (a 2-frame gap before the last) and "
                                  "B-frames, so the last frames come without a decode timestamp"),
    "mmcv__test.mp4": Spec("mov,mp4,m4a,3gp,3g2,mj2", "h264", 294, 240, Fraction(25), 168, "aac",
                           "294 pixels wide (odd aspect), AAC audio"),
    "decord__video_90.mov": Spec("mov,mp4,m4a,3gp,3g2,mj2", "h264", 568, 320, Fraction(30), 3, None,
                                 "3 frames, display matrix -90 degrees: decoded upright as portrait"),
    "decord__corrupted.mp4": Spec("mov,mp4,m4a,3gp,3g2,mj2", "h264", 160, 90, Fraction(10), 50, None,
                                  "one NAL unit with a broken length (packet 30): FFmpeg rejects it, loses "
                                  "a frame and decodes on; the package stops after 28 good frames"),
    "moviepy__no_duration.webm": Spec("matroska,webm", "vp9", 160, 90, Fraction(15000, 1001), 74, "opus",
                                      "VP9 webm written live: no container duration, no frame count; opus audio"),
    "moviepy__big_buck_bunny_432_433.webm": Spec("matroska,webm", "vp8", 160, 90, Fraction(24), 24, "opus",
                                                 "VP8 webm of 1 s (audio: opus here, vorbis in the real "
                                                 "file: this FFmpeg has no vorbis encoder)"),
    "torchcodec__h265_video.mp4": Spec("mov,mp4,m4a,3gp,3g2,mj2", "hevc", 128, 128, Fraction(10), 10, None,
                                       "HEVC, 10 frames"),
}

# decord__corrupted.mp4: the packet (decode order) whose NAL length prefix is broken, as in the real
# file; with two B-frames between anchors it holds frame 29, and 28 frames come out before it
CORRUPT_PACKET = 30
# mmaction2__part_0.mp4: its time base, as the real file's (512 ticks a frame at 30 fps)
PART_TIME_BASE = Fraction(1, 15360)
# the bright bar that moves across every picture, in pixels a frame
BAR_SPEED = 3
BAR_WIDTH = 12


def bar_position(frame: np.ndarray) -> int:
    """The column where ``frame``'s white bar starts: the frame's index times BAR_SPEED, modulo the width.

    Lets a test tell which source frame a decoded picture is, whatever the codec did to its edges: the
    bar is where a bar-wide window is brightest (the background is darker everywhere). Brightness, not
    colour: 4:2:0 chroma has half the columns.
    """
    brightness = frame.astype(np.int64).mean(axis=(0, 2))
    wrapped = np.concatenate([brightness, brightness[:BAR_WIDTH - 1]])  # the bar may wrap at the right edge
    return int(np.argmax(np.convolve(wrapped, np.ones(BAR_WIDTH), mode="valid")))


def pattern(n: int, height: int, width: int, seed: int) -> np.ndarray:
    """(n, H, W, 3) uint8 frames: a fixed textured gradient under a white bar moving right.

    The gradient runs from dark top left to light bottom right, so the picture is not symmetric under
    any rotation; the texture, a fixed draw of ``seed``, gives the encoders real detail to code.
    """
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 110, width)[None, :, None]
    y = np.linspace(0, 40, height)[:, None, None]
    base = x + y + np.array([0.0, 20.0, 40.0]) + rng.integers(-15, 16, (height, width, 1))
    frames = np.repeat(np.clip(base, 0, 170).astype(np.uint8)[None], n, axis=0)
    for t in range(n):
        frames[t][:, (np.arange(BAR_WIDTH) + t * BAR_SPEED) % width] = 250
    return frames


def _tone(seconds: float, rate: int) -> np.ndarray:
    """(1, samples) int16 mono: a 440 Hz sine."""
    t = np.arange(round(seconds * rate)) / rate
    return (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)[None]


def _open(path: str, **muxer_options: str):
    import av

    return av.open(path, "w", container_options={"fflags": "+bitexact", **muxer_options})


def _video_stream(out, codec: str, spec: Spec, time_base: Fraction | None = None, /, **options: str):
    """A video stream of ``spec``'s size and rate, one encoder thread; timestamps count ``time_base`` (1/rate)."""
    stream = out.add_stream(codec, rate=spec.rate)
    stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, "yuv420p"
    stream.codec_context.thread_count = 1
    stream.codec_context.time_base = time_base or 1 / spec.rate
    stream.options = {"flags": "+bitexact", **options}
    return stream


def _audio_stream(out, codec: str, rate: int):
    """A mono audio stream; added before anything is muxed (the header lists every stream)."""
    stream = out.add_stream(codec, rate=rate)
    stream.layout = "mono"
    stream.codec_context.thread_count = 1
    return stream


def _encode_audio(out, stream, seconds: float) -> None:
    """``seconds`` of tone, encoded after the picture: the muxer interleaves the two."""
    import av

    rate = stream.codec_context.sample_rate
    frame = av.AudioFrame.from_ndarray(_tone(seconds, rate), format="s16", layout="mono")
    frame.sample_rate, frame.pts = rate, 0
    for packet in stream.encode(frame):
        out.mux(packet)
    for packet in stream.encode(None):
        out.mux(packet)


def _encode(out, stream, frames: np.ndarray, pts: list[int] | None = None) -> None:
    """Encode and mux ``frames``, frame k at ``pts[k]`` (default k) in the codec's time base.

    Every frame gets a timestamp: without them, x264 (with B-frames and mb-tree) wrote different
    bitstreams for the same frames from one run to the next.
    """
    import av

    for k, image in enumerate(frames):
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        frame.pts, frame.time_base = (k if pts is None else pts[k]), stream.codec_context.time_base
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode(None):
        out.mux(packet)


# x264 at a constant QP with none of the lookahead's decisions: with them (CRF, adaptive B-frames,
# mb-tree, scene cuts, weighted prediction) two encodes of the same frames in one process differed
# when the width is not a multiple of 16 (seen at 170, 294 and 340 pixels wide); without them, never.
X264_FIXED = "qp=23:b-adapt=0:scenecut=0:mbtree=0:weightp=0"


def _h264(path: str, spec: Spec, seed: int, *, bframes: int, audio: bool = False, rotation: float | None = None,
          time_base: Fraction | None = None, pts: list[int] | None = None, **options: str) -> None:
    """h264 in MP4/MOV; ``bframes`` between anchors; ``pts`` in ``time_base`` (default: 1/rate, one a frame)."""
    with _open(path) as out:
        stream = _video_stream(out, "libx264", spec, time_base, threads="1", preset="veryfast",
                               **{"x264-params": f"{X264_FIXED}:bframes={bframes}"}, **options)
        if rotation is not None:
            stream.set_display_rotation(rotation)
        sound = _audio_stream(out, "aac", 44100) if audio else None
        _encode(out, stream, pattern(spec.frames, spec.height, spec.width, seed), pts)
        if sound is not None:
            _encode_audio(out, sound, spec.frames / float(spec.rate))


def _corrupted(path: str, spec: Spec, seed: int) -> None:
    """h264 whose sample CORRUPT_PACKET claims a NAL unit of 4 GiB, as in the real file.

    The length prefix exists only in the file (the encoder writes start codes, the MP4 muxer turns
    them into lengths), so the written file is patched where the demuxer says that sample is.
    """
    import av

    with _open(path) as out:
        stream = _video_stream(out, "libx264", spec, threads="1", preset="veryfast",
                               **{"x264-params": f"{X264_FIXED}:bframes=2"})
        _encode(out, stream, pattern(spec.frames, spec.height, spec.width, seed))
    with av.open(path) as c:
        packets = c.demux(c.streams.video[0])
        sample = next(p for k, p in enumerate(packets) if k == CORRUPT_PACKET)
        pos, size, data = sample.pos, sample.size, bytes(sample)
    if int.from_bytes(data[:4], "big") != size - 4:
        raise RuntimeError(f"{path}: sample {CORRUPT_PACKET} is not one length-prefixed NAL unit")
    with open(path, "r+b") as fh:
        fh.seek(pos)
        fh.write(b"\xff" * 5)  # the length, and the NAL header's forbidden bit set


def _webm(path: str, codec: str, spec: Spec, seed: int, *, live: bool) -> None:
    """VP8/VP9 in webm with an opus track.

    ``live``: the muxer writes no duration and no cues, and the frames come at jittered intervals
    (the real file's are 62 to 72 ms at 15000/1001 fps).
    """
    with _open(path, **({"live": "1"} if live else {})) as out:
        # No alt-ref frames: libvpx would hold frames back and emit invisible ones.
        stream = _video_stream(out, codec, spec, Fraction(1, 1000) if live else None, threads="1",
                               deadline="good", **{"cpu-used": "5", "auto-alt-ref": "0", "lag-in-frames": "0"})
        sound = _audio_stream(out, "libopus", 48000)
        pts = [round(k * 1000 / spec.rate) + (0, 4, -4)[k % 3] for k in range(spec.frames)] if live else None
        _encode(out, stream, pattern(spec.frames, spec.height, spec.width, seed), pts)
        _encode_audio(out, sound, spec.frames / float(spec.rate))


def _hevc(path: str, spec: Spec, seed: int) -> None:
    """HEVC in MP4; x265 single-threaded (its thread pools change the bitstream) and quiet."""
    with _open(path) as out:
        stream = _video_stream(out, "libx265", spec,
                               **{"x265-params": "log-level=error:pools=none:frame-threads=1:info=0"})
        _encode(out, stream, pattern(spec.frames, spec.height, spec.width, seed))


# -- DivX-packed MPEG-4 part 2 ---------------------------------------------------
# DivX 5 and Xvid store a B-frame in the same AVI chunk as the P-frame before it
# (decode order), then put a "not coded" VOP (N-VOP) of a few bytes where the
# B-frame's chunk would be, so the file holds one chunk per frame for players
# that cannot reorder. FFmpeg recognises such streams by the "DivX...p" user
# data and unpacks them while decoding. FFmpeg's encoder cannot write them, so
# its one-VOP-per-packet output is packed here, as the real file's encoder did.
_VOP_START = b"\x00\x00\x01\xb6"
DIVX_PACKED_USER_DATA = b"\x00\x00\x01\xb2DivX503b1393p"


def vop_type(data: bytes) -> str:
    """'I', 'P', 'B' or 'S': the coding type of the first VOP in ``data``."""
    i = data.find(_VOP_START)
    if i < 0 or i + 4 >= len(data):
        raise ValueError("no VOP start code")
    return "IPBS"[data[i + 4] >> 6]


def _n_vop(time_increment_bits: int) -> bytes:
    """A not-coded P-VOP: start code, type, modulo_time_base 0, time increment 0, vop_coded 0, stuffing."""
    bits = "".join(f"{b:08b}" for b in _VOP_START) + "01" + "0" + "1" + "0" * time_increment_bits + "1" + "0"
    bits += "0" + "1" * ((-len(bits) - 1) % 8)  # MPEG-4 stuffing: a 0, then 1s to the byte boundary
    return int(bits, 2).to_bytes(len(bits) // 8, "big")


def pack_b_frames(packets: list[bytes], rate: int) -> list[bytes]:
    """FFmpeg's MPEG-4 packets (one VOP each, decode order) as a DivX-packed stream, one chunk per frame."""
    first = packets[0]
    i = first.find(_VOP_START)
    packed = [first[:i] + DIVX_PACKED_USER_DATA + first[i:]]
    # FFmpeg's encoder: vop_time_increment_resolution is the rate, coded in this many bits
    n_vop = _n_vop(max(1, (rate - 1).bit_length()))
    j = 1
    while j < len(packets):
        if j + 1 < len(packets) and vop_type(packets[j]) in "IP" and vop_type(packets[j + 1]) == "B":
            packed += [packets[j] + packets[j + 1], n_vop]
            j += 2
        else:
            packed.append(packets[j])
            j += 1
    return packed


def _avi(path: str, spec: Spec, seed: int) -> None:
    """MPEG-4 part 2 with one B-frame between anchors, DivX-packed, in AVI as Xvid; an mp3 track."""
    import av

    rate = int(spec.rate)
    encoder = av.CodecContext.create("mpeg4", "w")
    encoder.width, encoder.height, encoder.pix_fmt = spec.width, spec.height, "yuv420p"
    encoder.time_base, encoder.framerate = Fraction(1, rate), spec.rate
    encoder.max_b_frames, encoder.gop_size, encoder.thread_count = 1, 12, 1
    encoder.options = {"flags": "+bitexact"}
    encoder.open()
    vops = []
    for k, image in enumerate(pattern(spec.frames, spec.height, spec.width, seed)):
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        frame.pts = k
        vops += [bytes(p) for p in encoder.encode(frame)]
    vops += [bytes(p) for p in encoder.encode(None)]
    # The mp3 encoder's priming samples start before 0; shifting every stream to start at 0 would
    # put the first video chunk one frame late and the AVI muxer would fill the gap with empty chunks.
    with _open(path, avoid_negative_ts="disabled") as out:
        stream = out.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, "yuv420p"
        stream.codec_tag = "XVID"
        sound = _audio_stream(out, "libmp3lame", 22050)
        # AVI keeps no timestamps: chunk k is frame k, whatever it holds.
        for k, data in enumerate(pack_b_frames(vops, rate)):
            packet = av.Packet(data)
            packet.pts = packet.dts = k
            packet.time_base, packet.stream, packet.is_keyframe = Fraction(1, rate), stream, vop_type(data) == "I"
            out.mux(packet)
        _encode_audio(out, sound, spec.frames / rate)


def part_0_pts(frames: int) -> list[int]:
    """mmaction2__part_0.mp4's timestamps: every 1/30 s, but the last frame two intervals after the one before."""
    step = round(1 / (30 * PART_TIME_BASE))
    return [step * k for k in range(frames - 1)] + [step * frames]


def _write(name: str, path: str, seed: int) -> None:
    spec = SPECS[name]
    if name == "mmaction2__test.avi":
        _avi(path, spec, seed)
    elif name == "decord__corrupted.mp4":
        _corrupted(path, spec, seed)
    elif name == "moviepy__no_duration.webm":
        _webm(path, "libvpx-vp9", spec, seed, live=True)
    elif name == "moviepy__big_buck_bunny_432_433.webm":
        _webm(path, "libvpx", spec, seed, live=False)
    elif name == "torchcodec__h265_video.mp4":
        _hevc(path, spec, seed)
    elif name == "mmaction2__part_0.mp4":
        _h264(path, spec, seed, bframes=2, time_base=PART_TIME_BASE, pts=part_0_pts(spec.frames))
    elif name == "mmcv__test.mp4":
        _h264(path, spec, seed, bframes=0, audio=True, profile="main")
    elif name == "decord__video_90.mov":
        _h264(path, spec, seed, bframes=0, rotation=-90, profile="baseline")
    else:
        _h264(path, spec, seed, bframes=2)


def write_all(root: str) -> str:
    """Write every synthetic file into ``root`` (created); returns ``root``."""
    os.makedirs(root, exist_ok=True)
    for seed, name in enumerate(sorted(SPECS)):
        tmp = os.path.join(root, ".part-" + name)
        _write(name, tmp, seed)
        os.replace(tmp, os.path.join(root, name))
    return root


def pictures_digest(root: str) -> str:
    """SHA-256 over every synthetic file's video packets, as demuxed: equal means the same pictures.

    Only the video bitstreams decide what a conversion stores. The audio encoders compute in floating
    point, whose last bits may depend on the CPU's vector unit, so their bytes are left out.
    """
    import av

    h = hashlib.sha256()
    for name in sorted(SPECS):
        h.update(name.encode() + b"\0")
        with av.open(os.path.join(root, name)) as c:
            for packet in c.demux(c.streams.video[0]):
                h.update(packet.size.to_bytes(8, "little") + bytes(packet))
    return h.hexdigest()


@dataclass(frozen=True)
class VideoSet:
    """One tier of the shared test videos: a folder of files named as the real ones.

    ``tier`` is "synthetic" (this module's stand-ins, always there) or "real" (the folder beside the
    checkout, when it is there). A test that needs another expectation on one tier asks ``tier``.
    """

    tier: str
    root: str

    def path(self, name: str) -> str:
        """The file standing for the real file ``name`` in this tier."""
        return os.path.join(self.root, name)
