"""Decoding: every odd file of the shared set (both tiers), rotation, resizing, fps resampling."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from convert.decode import FrameSpec, VideoDecoder, VideoError, decode_all
from convert.synth import render, write_mp4

# file -> (decoded frames, damage expected); the synthetic stand-ins reproduce every count
CASES = {
    "mmaction2__demo.mp4": (280, False),          # Kinetics-400 340x256 h264
    "mmaction2__test.avi": (164, False),          # UCF101, mpeg4 packed B-frames, pts N/A
    "mmaction2__part_0.mp4": (32, False),         # missing timestamps at the end
    "mmcv__test.mp4": (168, False),               # width 294, with AAC audio
    "decord__video_90.mov": (3, False),           # 3 frames, rotation -90
    "moviepy__no_duration.webm": (74, False),     # VP9, no container duration
    "moviepy__big_buck_bunny_432_433.webm": (24, False),  # VP8
    "torchcodec__h265_video.mp4": (10, False),    # HEVC
    "decord__corrupted.mp4": (28, True),          # bad NAL unit at 3.0 s (frame 28 of 50)
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_shared_file_decodes_as_specified(videos, name):
    frames, damage = decode_all(videos.path(name), FrameSpec(size=(128, 171)))
    n, damaged = CASES[name]
    assert frames.shape == (n, 128, 171, 3) and frames.dtype == np.uint8
    assert (damage is not None) == damaged
    if damaged:
        assert "InvalidDataError after 28 good frames" in damage
    # Real pictures, not blank buffers.
    assert frames.std() > 1.0 or name == "moviepy__no_duration.webm"


def test_rotation_metadata_is_honoured(videos):
    import av

    path = videos.path("decord__video_90.mov")  # coded 568x320, display matrix -90 degrees
    frames, _ = decode_all(path, FrameSpec(size=None, short_side=64))
    assert frames.shape == (3, 114, 64, 3)  # portrait, as players show it
    # Upright = the coded picture turned clockwise, as ffmpeg's autorotate does.
    upright, _ = decode_all(path, FrameSpec(size=(568, 320)))
    with av.open(path) as c:
        coded = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    want = np.rot90(coded[0], k=-1)
    assert want.shape == upright[0].shape
    assert np.abs(want.astype(int) - upright[0]).mean() < 2.0
    assert np.abs(np.rot90(coded[0], k=1).astype(int) - upright[0]).mean() > 10.0


def test_short_side_keeps_aspect(videos):
    frames, _ = decode_all(videos.path("mmcv__test.mp4"), FrameSpec(size=None, short_side=120))
    assert frames.shape[1:] == (120, 147, 3)  # 294x240 -> 147x120


def test_unreadable_file_is_a_video_error(tmp_path):
    bad = tmp_path / "junk.mp4"
    bad.write_bytes(b"\x00" * 1000)
    with pytest.raises(VideoError, match="cannot open"):
        VideoDecoder(str(bad), FrameSpec())


@pytest.mark.parametrize("name, total", [("mmaction2__test.avi", 164), ("moviepy__big_buck_bunny_432_433.webm", 24)])
def test_truncated_file_keeps_frames_before_the_cut(videos, tmp_path, name, total):
    # FFmpeg reads a half file without any error; the decoder must notice the shortfall.
    data = open(videos.path(name), "rb").read()
    cut = tmp_path / ("cut" + name[-4:])
    cut.write_bytes(data[: len(data) // 2])
    full, _ = decode_all(videos.path(name), FrameSpec())
    frames, damage = decode_all(str(cut), FrameSpec())
    assert 0 < len(frames) < total
    assert damage.startswith(("truncated: ", "corrupt frame after"))
    assert np.array_equal(frames, full[: len(frames)])


def _ramp(tmp_path, n: int, rate: Fraction) -> str:
    """A video whose frame k is a flat grey of level 4k, so decoded frames say their index."""
    frames = np.repeat(np.arange(n, dtype=np.uint8)[:, None, None, None] * 4, 32, axis=1)
    frames = np.ascontiguousarray(np.broadcast_to(frames, (n, 32, 32, 3)))
    path = str(tmp_path / "ramp.mp4")
    write_mp4(path, frames, rate)
    return path


def _indices(frames: np.ndarray) -> list[int]:
    return np.round(frames.reshape(len(frames), -1).mean(1) / 4).astype(int).tolist()


@pytest.mark.parametrize("rate", [Fraction(25), Fraction(30000, 1001), Fraction(30), Fraction(981, 50)])
def test_fps_resampling_gives_equal_durations(tmp_path, rate):
    # About 2 s at each rate: output frame j must be the source frame nearest j/10 s,
    # so a 16-frame clip spans 1.6 s whatever the source rate.
    n = round(2 * float(rate))
    frames, _ = decode_all(_ramp(tmp_path, n, rate), FrameSpec(size=(32, 32), fps=10))
    assert len(frames) == math.ceil(n / float(rate) * 10 - 1e-9)
    want = [min(n - 1, math.floor(j / 10 * float(rate) + 0.5 - 1e-9)) for j in range(len(frames))]
    assert _indices(frames) == want


def test_fps_upsampling_repeats_frames(tmp_path):
    up, _ = decode_all(_ramp(tmp_path, 30, Fraction(30)), FrameSpec(size=(32, 32), fps=60))
    assert _indices(up) == [k // 2 for k in range(60)]


def test_frame_spec_validation_lists_the_rule():
    with pytest.raises(ValueError, match="exactly one of"):
        FrameSpec(size=(128, 171), short_side=128)
    with pytest.raises(ValueError, match="fps must be"):
        FrameSpec(fps=0)


def test_first_video_stream_is_the_one_decoded(tmp_path):
    # Two video streams in one file: red frames first, then blue; the first wins.
    import av

    path = str(tmp_path / "two.mkv")
    with av.open(path, "w") as out:
        streams = []
        for _ in range(2):
            s = out.add_stream("libx264", rate=25)
            s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
            streams.append(s)
        for colour, stream in zip(((220, 20, 20), (20, 20, 220)), streams):
            frame = np.zeros((48, 64, 3), np.uint8) + np.array(colour, np.uint8)
            for _ in range(20):
                for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                    out.mux(packet)
            for packet in stream.encode():
                out.mux(packet)
    frames, damage = decode_all(path, FrameSpec(size=(48, 64)))
    assert damage is None and len(frames) == 20
    r, g, b = frames.reshape(-1, 3).mean(0)
    assert r > 180 and b < 60


def _vfr(path: str, n: int = 160, **options: str) -> str:
    """Variable frame rate: gaps of 20 ms and 60 ms alternate, the stream declares 50 fps.

    Frame k is a flat grey of level 4 * (k % 64), so decoded frames say their index.
    """
    import av

    ms = Fraction(1, 1000)
    with av.open(path, "w", options=options) as out:
        s = out.add_stream("libx264", rate=50)  # the shortest gap: what a camera would declare
        s.width, s.height, s.pix_fmt = 32, 32, "yuv420p"
        s.codec_context.time_base = s.time_base = ms
        t = 0
        for k in range(n):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 4 * (k % 64), np.uint8), format="rgb24")
            frame.pts, frame.time_base = t, ms
            t += 20 if k % 2 == 0 else 60
            for packet in s.encode(frame):
                out.mux(packet)
        for packet in s.encode():
            out.mux(packet)
    return path


# mp4 with its index first (faststart), so a file cut in half still opens
VFR_CONTAINERS = {"mkv": {}, "mp4": {"movflags": "faststart"}}


@pytest.mark.parametrize("ext", sorted(VFR_CONTAINERS))
def test_complete_variable_frame_rate_video_is_not_truncated(tmp_path, ext):
    # 160 frames over 6.4 s at a declared 50 fps: duration x rate would expect 318.
    path = _vfr(str(tmp_path / f"vfr.{ext}"), **VFR_CONTAINERS[ext])
    frames, damage = decode_all(path, FrameSpec(size=(32, 32)))
    assert damage is None
    assert _indices(frames) == [k % 64 for k in range(160)]


@pytest.mark.parametrize("ext", sorted(VFR_CONTAINERS))
def test_truncated_variable_frame_rate_video_is_still_truncated(tmp_path, ext):
    full_path = _vfr(str(tmp_path / f"vfr.{ext}"), **VFR_CONTAINERS[ext])
    data = open(full_path, "rb").read()
    cut = tmp_path / f"cut.{ext}"
    cut.write_bytes(data[: len(data) // 2])
    full, _ = decode_all(full_path, FrameSpec(size=(32, 32)))
    frames, damage = decode_all(str(cut), FrameSpec(size=(32, 32)))
    assert 0 < len(frames) < 150
    # The mkv ends cleanly before its stated end; the mp4's last packet is cut mid-way.
    assert damage.startswith("truncated: " if ext == "mkv" else "InvalidDataError after")
    assert np.array_equal(frames, full[: len(frames)])
