"""Decoding: every odd file of the shared set (both tiers), rotation, resizing, fps resampling."""

from __future__ import annotations

import math
import os
import threading
from fractions import Fraction

import numpy as np
import pytest

from convert.synth import render, write_mp4
from convert.worker.decode import FrameSpec, VideoDecoder, VideoError, decode_all
from convert.worker.plan import ConvertConfig
from convert.worker.shard_worker import clip_producer
from convert.worker.sources import VideoItem

from . import videos as stand_ins

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
        assert damage is not None and "InvalidDataError after 28 good frames" in damage
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
    assert damage is not None and damage.startswith(("truncated: ", "corrupt frame after"))
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


def _vfr(path: str, n: int = 160, /, **options: str) -> str:
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
    assert damage is not None and damage.startswith("truncated: " if ext == "mkv" else "InvalidDataError after")
    assert np.array_equal(frames, full[: len(frames)])


# -- issue 19, point 2: complete videos that were called truncated ----------------------------------------------
def _gradient(k: int) -> np.ndarray:
    """Frame k of the test videos below: a flat grey of level 8k with a bar that moves, so frames differ."""
    frame = np.full((48, 64, 3), 8 * k, np.uint8)
    frame[:, (2 * k) % 60:(2 * k) % 60 + 4] = 255
    return frame


def _write_av(path: str, *, video: str, audio: str | None, video_s: float = 1.0, audio_s: float = 3.0,
              cover: bool = False) -> str:
    """A 25 fps video of ``video_s`` seconds, with an audio track of ``audio_s`` seconds and/or cover art.

    The cover (``cover``) is a one-picture MJPEG stream flagged attached_pic, as taggers add it: the MP4
    muxer stores it as the file's 'covr' atom, Matroska as an attached image file.
    """
    import av

    fmt = "mp4" if path.endswith(".mp4") else None
    with av.open(path, "w", format=fmt) as out:
        if cover and path.endswith(".mkv"):
            out.add_attachment("cover.jpg", "image/jpeg", _jpeg())
        pic = None
        if cover and path.endswith(".mp4"):
            pic = out.add_stream("mjpeg")
            pic.width, pic.height, pic.pix_fmt = 64, 48, "yuvj420p"
            pic.disposition = av.stream.Disposition.attached_pic
        vs = out.add_stream(video, rate=25)
        vs.width, vs.height, vs.pix_fmt = 64, 48, "yuv420p"
        aus = out.add_stream(audio, rate=48000) if audio else None
        if pic is not None:
            for packet in pic.encode(_picture(pic.pix_fmt)):
                out.mux(packet)
            for packet in pic.encode():
                out.mux(packet)
        for k in range(round(video_s * 25)):
            frame = av.VideoFrame.from_ndarray(_gradient(k), format="rgb24")
            frame.pts = k
            for packet in vs.encode(frame):
                out.mux(packet)
        for packet in vs.encode():
            out.mux(packet)
        if aus is not None:
            size = aus.codec_context.frame_size or 1024
            for start in range(0, round(audio_s * 48000), size):
                samples = av.AudioFrame.from_ndarray(np.zeros((1, size), np.float32), format="flt", layout="mono")
                samples.sample_rate, samples.pts = 48000, start
                for packet in aus.encode(samples):
                    out.mux(packet)
            for packet in aus.encode():
                out.mux(packet)
    return path


def _picture(pix_fmt: str):
    import av

    return av.VideoFrame.from_ndarray(np.full((48, 64, 3), 200, np.uint8), format="rgb24").reformat(format=pix_fmt)


def _jpeg() -> bytes:
    import io

    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mjpeg") as out:
        s = out.add_stream("mjpeg")
        s.width, s.height, s.pix_fmt = 64, 48, "yuvj420p"
        for packet in [*s.encode(_picture("yuvj420p")), *s.encode()]:
            out.mux(packet)
    return buf.getvalue()


def _cover_first(path: str) -> None:
    """Move the MP4's 'udta' box (its cover art) before its first 'trak', as some taggers write it: FFmpeg then
    lists the cover as the first video stream. The moov box keeps its size and place, so no offset changes."""
    import struct

    data = bytearray(open(path, "rb").read())

    def boxes(start: int, end: int):
        while start < end:
            size, kind = struct.unpack(">I4s", data[start:start + 8])
            yield start, size, kind
            start += size

    ((moov, size, _),) = [b for b in boxes(0, len(data)) if b[2] == b"moov"]
    kids = list(boxes(moov + 8, moov + size))
    trak = next(b for b in kids if b[2] == b"trak")
    udta = next(b for b in kids if b[2] == b"udta")
    assert trak[0] < udta[0]
    data[trak[0]:udta[0] + udta[1]] = data[udta[0]:udta[0] + udta[1]] + data[trak[0]:udta[0]]
    open(path, "wb").write(bytes(data))


def _untag(path: str) -> None:
    """Rename the Matroska tracks' DURATION tags (same length), as a file from a writer that does not tag them."""
    data = open(path, "rb").read()
    assert data.count(b"DURATION") >= 1
    open(path, "wb").write(data.replace(b"DURATION", b"DURATIOX"))


def _video_packet_pos(path: str, n: int) -> int:
    """Where the file's ``n``-th video packet starts (in file order)."""
    import av

    with av.open(path) as c:
        positions = sorted(p.pos for p in c.demux(video=0) if p.pos is not None and p.pos >= 0)
    return positions[n]


LONG_AUDIO = {"mkv": ("libx264", "aac"), "webm": ("libvpx-vp9", "libopus")}


@pytest.mark.parametrize("tagged", [True, False], ids=["tagged", "untagged"])
@pytest.mark.parametrize("ext", sorted(LONG_AUDIO))
def test_audio_longer_than_the_video_is_not_truncation(tmp_path, ext, tagged):
    """The container's duration is the audio's (3 s); the video's own end (its DURATION tag) or, without one,
    how far the file's packets reached says the 1 s of video is complete. A real cut is still found."""
    video, audio = LONG_AUDIO[ext]
    plain = _write_av(str(tmp_path / f"plain.{ext}"), video=video, audio=None)
    path = _write_av(str(tmp_path / f"long_audio.{ext}"), video=video, audio=audio)
    if not tagged:
        _untag(path)
    want, damage = decode_all(plain, FrameSpec(size=(48, 64)))
    assert damage is None and len(want) == 25
    frames, damage = decode_all(path, FrameSpec(size=(48, 64)))
    assert damage is None
    assert np.array_equal(frames, want)
    cut = tmp_path / f"cut.{ext}"
    cut.write_bytes(open(path, "rb").read()[: _video_packet_pos(path, 12)])  # cut after 12 of its 25 frames
    frames, damage = decode_all(str(cut), FrameSpec(size=(48, 64)))
    assert damage is not None and damage.startswith("truncated: "), damage
    # The frames before the cut are the file's (the last few may have lost a reference frame past the cut).
    assert 8 <= len(frames) < 25 and np.array_equal(frames[:8], want[:8])


@pytest.mark.parametrize("ext", ["mp4", "mkv"])
def test_cover_art_is_not_the_video(tmp_path, ext):
    """A cover picture (attached_pic) is a video stream of one frame: decoded as the video it was a 'truncated'
    video of one picture. The real video is decoded in full, equal to the file without a cover."""
    import av

    plain = _write_av(str(tmp_path / f"plain.{ext}"), video="libx264", audio=None)
    path = _write_av(str(tmp_path / f"cover.{ext}"), video="libx264", audio="aac", audio_s=1.0, cover=True)
    if ext == "mp4":
        _cover_first(path)
    with av.open(path) as c:
        covers = [s.index for s in c.streams.video if s.disposition & av.stream.Disposition.attached_pic]
        assert covers == ([0] if ext == "mp4" else [2])  # Matroska lists attached files after the tracks
    want, _ = decode_all(plain, FrameSpec(size=(48, 64)))
    frames, damage = decode_all(path, FrameSpec(size=(48, 64)))
    assert damage is None
    assert np.array_equal(frames, want)
    with VideoDecoder(path, FrameSpec(size=(48, 64))) as dec:
        assert dec.probe().frames_estimate == 25
        assert dec.stream_index == dec.probe().stream == (1 if ext == "mp4" else 0)


def test_a_file_of_cover_art_only_has_no_video_stream(tmp_path):
    import av

    path = str(tmp_path / "cover_only.mp4")
    with av.open(path, "w") as out:
        pic = out.add_stream("mjpeg")
        pic.width, pic.height, pic.pix_fmt = 64, 48, "yuvj420p"
        pic.disposition = av.stream.Disposition.attached_pic
        aus = out.add_stream("aac", rate=48000)
        for packet in [*pic.encode(_picture("yuvj420p")), *pic.encode()]:
            out.mux(packet)
        samples = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="flt", layout="mono")
        samples.sample_rate, samples.pts = 48000, 0
        for packet in [*aus.encode(samples), *aus.encode()]:
            out.mux(packet)
    with pytest.raises(VideoError, match=r"^no video stream \(only an attached picture: cover art\)$"):
        VideoDecoder(path, FrameSpec())




@pytest.mark.parametrize("backend", ["lmdb", "tfrecord"])
def test_each_video_record_names_the_stream_its_clips_were_decoded_from(tmp_path, backend):
    """The record says which of the file's streams became the clips (issue 27): cover art listed first in an
    MP4, an attached picture after a Matroska's tracks, a still picture as a Matroska's first track."""
    import json

    import av

    from convert.format import get_backend

    from .convert_helpers import run_cli

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    _cover_first(_write_av(str(src / "mp4_cover_first.mp4"), video="libx264", audio="aac", audio_s=1.0, cover=True))
    _write_av(str(src / "mkv_cover.mkv"), video="libx264", audio="aac", audio_s=1.0, cover=True)
    _still_then_video(str(src / "mkv_still_first.mkv"))
    out = tmp_path / "out"
    r = run_cli(str(tmp_path / "src"), str(out), "--backend", backend, "--size", "48x64", "--workers", "1",
                "--no-progress")
    assert r.returncode == 0, r.stderr
    manifest = json.load(open(out / "manifest.json"))
    records = {}
    for shard in manifest["shards"]:
        reader = get_backend(backend).reader(str(out / shard["path"]))
        try:
            records.update({rec.video_id: rec for rec in reader.records()})
        finally:
            reader.close()
    assert {vid: (rec.status, rec.stream) for vid, rec in records.items()} == {
        "a/mkv_cover": ("ok", 0), "a/mkv_still_first": ("ok", 1), "a/mp4_cover_first": ("ok", 1)}
    for vid, rec in records.items():
        with av.open(rec.path) as c:  # the one h264 stream of the file, the real video
            assert [s.index for s in c.streams if s.type == "video" and s.codec_context.name == "h264"] == \
                [rec.stream], vid


# -- a still picture muxed as an ordinary video track (no attached_pic flag) ---------------------------------------
STILL_FIRST = 40  # frames of the real video beside the still


def _still_then_video(path: str, *, still: bool = True, video: bool = True) -> str:
    """A one-frame 320x240 MJPEG track (a picture, larger than the video) then a 40-frame 64x48 h264 track.

    ``ffmpeg -i cover.jpg -i video.mp4 out.mkv`` writes such a file: Matroska keeps no attached_pic flag for
    a track, so nothing but its length says the first track is a picture. The video's frame k is
    ``stand_ins.pattern``'s: its bar says which frame it is. ``still``/``video`` leave either track out.
    """
    import av

    with av.open(path, "w", format="mp4" if path.endswith(".mp4") else None) as out:
        pic = out.add_stream("mjpeg", rate=25) if still else None
        if pic is not None:
            pic.width, pic.height, pic.pix_fmt = 320, 240, "yuvj420p"
        vs = out.add_stream("libx264", rate=25) if video else None
        if vs is not None:
            vs.width, vs.height, vs.pix_fmt = 64, 48, "yuv420p"
        if pic is not None:
            image = av.VideoFrame.from_ndarray(np.full((240, 320, 3), 200, np.uint8), format="rgb24")
            image = image.reformat(format="yuvj420p")
            image.pts = 0
            for packet in [*pic.encode(image), *pic.encode()]:
                out.mux(packet)
        if vs is not None:
            _mux_frames(out, vs, stand_ins.pattern(STILL_FIRST, 48, 64, seed=7))
    return path


def _mux_frames(out, stream, pictures) -> None:
    """Encode RGB ``pictures`` (one per frame, pts 0, 1, ...) into ``stream`` of container ``out``, and flush it."""
    import av

    for k, picture in enumerate(pictures):
        frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
        frame.pts = k
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)


def _bars(frames: np.ndarray) -> list[int]:
    return [stand_ins.bar_position(f) for f in frames]


BAR_AT = [(k * stand_ins.BAR_SPEED) % 64 for k in range(STILL_FIRST)]  # where frame k's bar is, 64 wide


@pytest.mark.parametrize("case", ["mkv-tagged", "mkv-untagged", "mp4"])
def test_a_still_picture_track_is_not_the_video(tmp_path, case):
    """The one-frame picture comes first and is larger, but the 40-frame video is decoded: tagged Matroska says
    the picture lasts one frame, untagged Matroska leaves only its image codec to say it, MP4 counts 1 frame."""
    import av

    path = _still_then_video(str(tmp_path / f"still.{case[:3]}"))
    if case == "mkv-untagged":
        _untag(path)
    with av.open(path) as c:
        assert [s.codec_context.name for s in c.streams.video] == ["mjpeg", "h264"]
        assert not any(s.disposition & av.stream.Disposition.attached_pic for s in c.streams.video)
    frames, damage = decode_all(path, FrameSpec(size=(48, 64)))
    assert damage is None
    assert _bars(frames) == BAR_AT
    with VideoDecoder(path, FrameSpec(size=(48, 64))) as dec:
        probe = dec.probe()
        assert dec.stream_index == probe.stream == 1
        assert (probe.width, probe.height, probe.frames_estimate) == (64, 48, STILL_FIRST)


def test_a_still_picture_track_is_not_converted_in_place_of_the_video(tmp_path):
    """The conversion's own producer: clips of the 40-frame video, not a 'short' record of the picture's 1 frame."""
    path = _still_then_video(str(tmp_path / "still.mkv"))
    produce = clip_producer(VideoItem("still", path, 0), ConvertConfig(size=(48, 64)), threads=1)()
    clips = []
    try:
        while True:
            clips.append(next(produce))
    except StopIteration as done:
        record = done.value
    assert (record.status, record.clips, record.frames, record.reason) == ("ok", 2, STILL_FIRST, "")
    assert [(index, start) for index, start, _ in clips] == [(0, 0), (1, 16)]
    assert _bars(np.concatenate([c for _, _, c in clips])) == BAR_AT[:32]


def test_a_lone_still_picture_track_is_still_decoded(tmp_path):
    """A picture is the lesser choice, not refused: alone, it is the file's video (one frame: a 'short' video)."""
    path = _still_then_video(str(tmp_path / "picture.mkv"), video=False)
    frames, damage = decode_all(path, FrameSpec(size=(48, 64)))
    assert damage is None and len(frames) == 1
    assert abs(float(frames.mean()) - 200) < 5


def test_the_largest_picture_is_the_video(tmp_path):
    """Of two real videos, the larger picture is decoded (as ffmpeg maps a file's video), wherever it is."""
    import av

    path = str(tmp_path / "two_sizes.mkv")
    with av.open(path, "w") as out:
        small, large = out.add_stream("libx264", rate=25), out.add_stream("libx264", rate=25)
        for stream, (w, h) in ((small, (32, 24)), (large, (64, 48))):
            stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for stream, colour in ((small, (220, 20, 20)), (large, (20, 20, 220))):
            picture = np.zeros((stream.height, stream.width, 3), np.uint8) + np.array(colour, np.uint8)
            _mux_frames(out, stream, [picture] * 20)
    with VideoDecoder(path, FrameSpec(size=(48, 64))) as dec:
        frames = np.stack(list(dec))
        assert dec.stream_index == 1 and dec.damage is None and len(frames) == 20
    r, g, b = frames.reshape(-1, 3).mean(0)
    assert b > 180 and r < 60


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_file_of_one_video_stream_decodes_that_stream(videos, name):
    """The shared files (one video track, some with audio) decode their only video stream, as before."""
    import av

    with av.open(videos.path(name)) as c:
        (index,) = [s.index for s in c.streams.video]  # read while open: a closed container's streams are freed
    with VideoDecoder(videos.path(name), FrameSpec()) as dec:
        assert dec.stream_index == dec.probe().stream == index

# -- issue 19, point 6: a video file is one file, never a list that opens others ----------------------------------
def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("names", ["itself", "another video"])
def test_a_concat_list_named_like_a_video_is_refused_before_it_opens_anything(tmp_path, names):
    """An ffconcat file naming itself made FFmpeg open it recursively until some 20,000 descriptors were open."""
    real = _write_av(str(tmp_path / "real.mp4"), video="libx264", audio=None)
    path = tmp_path / "self.mp4"
    target = "self.mp4" if names == "itself" else real
    path.write_text(f"ffconcat version 1.0\nfile '{target}'\n")
    before = _open_fds()
    for _ in range(2):  # the second refusal says the same (FFmpeg's log would fold a repeated line)
        with pytest.raises(VideoError) as info:
            VideoDecoder(str(path), FrameSpec())
        assert str(info.value) == ("cannot open: FFmpeg reads it as 'concat', not as a video file (a concat list, "
                                   "a playlist or an image sequence would open other files); refused")
    assert _open_fds() <= before
    assert len(decode_all(real, FrameSpec(size=(48, 64)))[0]) == 25


def test_a_playlist_and_a_protocol_wrapper_are_refused(tmp_path):
    real = _write_av(str(tmp_path / "real.mp4"), video="libx264", audio=None)
    playlist = tmp_path / "list.mp4"
    playlist.write_text(f"#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1.0,\n{real}\n#EXT-X-ENDLIST\n")
    with pytest.raises(VideoError, match=r"^cannot open: "):  # FFmpeg itself takes HLS only from a .m3u8 now
        VideoDecoder(str(playlist), FrameSpec())
    with pytest.raises(VideoError, match=r"^cannot open: "):
        VideoDecoder(f"concat:{real}|{real}", FrameSpec())


def test_a_fifo_is_never_opened(tmp_path):
    fifo = tmp_path / "x.mp4"
    os.mkfifo(fifo)  # opening it for reading would block until a writer comes: never
    errors: list[Exception] = []

    def open_it() -> None:
        try:
            VideoDecoder(str(fifo), FrameSpec())
        except VideoError as exc:
            errors.append(exc)

    opener = threading.Thread(target=open_it, daemon=True)  # daemon: a regression blocks it, not the suite
    opener.start()
    opener.join(30)
    assert not opener.is_alive(), "opening the FIFO blocked"
    assert [str(e) for e in errors] == ["cannot open: not a regular file (a FIFO, a device or a socket would "
                                        "block or never end): never opened as a video"]
