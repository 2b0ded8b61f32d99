"""The synthetic stand-ins (tests/videos.py) really have the oddities of the real files they stand for.

Each property is read back with plain PyAV, as FFmpeg reports it (the package's decoder only where a
test says what it must make of the oddity). The role test runs on both tiers, so with the real files
present it also shows that each real file has the traits its stand-in was made to copy.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import av
import numpy as np
import pytest

from convert.worker.decode import FrameSpec, decode_all

from . import videos as stand_ins

# what each file is in the suite for: the traits the real file and its stand-in share
ROLES: dict[str, dict[str, Any]] = {
    "mmaction2__demo.mp4": {"no_dts": True},
    "mmaction2__test.avi": {"audio": True, "no_dts": True, "backwards": True},
    "mmaction2__part_0.mp4": {"no_dts": True, "irregular": True},
    "mmcv__test.mp4": {"audio": True},
    "decord__video_90.mov": {"rotation": -90},
    "decord__corrupted.mp4": {"errors": 1, "no_dts": True, "irregular": True},
    "moviepy__no_duration.webm": {"audio": True, "duration": False, "header_frames": False, "irregular": True},
    "moviepy__big_buck_bunny_432_433.webm": {"audio": True, "header_frames": False},  # vorbis / opus
    "torchcodec__h265_video.mp4": {"no_dts": True},
}
PLAIN = {"audio": False, "rotation": 0, "errors": 0, "duration": True, "header_frames": True, "no_dts": False,
         "backwards": False, "irregular": False}


def traits(path: str) -> dict:
    """What FFmpeg says of a video: its format, every frame decoded past errors, and their timing."""
    with av.open(path) as c:
        s = c.streams.video[0]
        frames, errors, rotations, times, no_dts = 0, 0, set(), [], False
        for packet in c.demux(s):
            try:
                decoded = packet.decode()
            except av.error.InvalidDataError:
                errors += 1  # what ffmpeg logs and decodes on from, exiting 0
                continue
            for f in decoded:
                frames += 1
                rotations.add(f.rotation)
                times.append(f.time)
                no_dts |= f.dts is None
        (rotation,) = rotations
        # to 10 ms: Matroska's timestamps are whole milliseconds, 41 or 42 ms at a steady 24 fps
        steps = {round(b - a, 2) for a, b in itertools.pairwise(sorted(times))}
        return {"container": c.format.name, "codec": s.codec_context.name, "frames": frames,
                "audio": bool(c.streams.audio), "rotation": rotation, "errors": errors,
                "duration": c.duration is not None, "header_frames": s.frames > 0, "no_dts": no_dts,
                "backwards": any(b <= a for a, b in itertools.pairwise(times)), "irregular": len(steps) > 1}


@pytest.mark.parametrize("name", sorted(stand_ins.SPECS))
def test_each_file_has_the_traits_of_its_role(videos, name):
    spec = stand_ins.SPECS[name]
    lost = ROLES[name].get("errors", 0)  # a packet FFmpeg rejects is one frame fewer
    want = {"container": spec.container, "codec": spec.codec, "frames": spec.frames - lost, **PLAIN, **ROLES[name]}
    assert traits(videos.path(name)) == want


@pytest.mark.parametrize("name", sorted(stand_ins.SPECS))
def test_each_stand_in_is_as_its_spec_says(stand_in_videos, name):
    spec = stand_ins.SPECS[name]
    with av.open(os.path.join(stand_in_videos, name)) as c:
        s = c.streams.video[0]
        assert (s.codec_context.width, s.codec_context.height) == (spec.width, spec.height)
        assert s.average_rate == spec.rate
        assert [a.codec_context.name for a in c.streams.audio] == ([spec.audio] if spec.audio else [])
        assert s.frames in (0, spec.frames)


def test_the_live_webm_has_no_duration_and_the_other_one_has(stand_in_videos):
    with av.open(os.path.join(stand_in_videos, "moviepy__no_duration.webm")) as c:
        assert c.duration is None and c.streams.video[0].duration is None and c.streams.video[0].frames == 0
    with av.open(os.path.join(stand_in_videos, "moviepy__big_buck_bunny_432_433.webm")) as c:
        assert c.duration == pytest.approx(1_000_000, abs=10_000)  # 1 s (its opus track ends 8 ms later)


def test_the_avi_holds_divx_packed_b_frames_and_decodes_in_display_order(stand_in_videos):
    path = os.path.join(stand_in_videos, "mmaction2__test.avi")
    spec = stand_ins.SPECS["mmaction2__test.avi"]
    with av.open(path) as c:
        s = c.streams.video[0]
        assert s.codec_tag == "XVID"
        chunks = [bytes(p) for p in c.demux(s) if p.size]
    assert len(chunks) == s.frames == spec.frames  # one chunk per frame, as the header counts
    assert stand_ins.DIVX_PACKED_USER_DATA in chunks[0]
    packed = [c for c in chunks if c.count(b"\x00\x00\x01\xb6") == 2]
    n_vops = [c for c in chunks if len(c) < 8]
    assert len(packed) == len(n_vops) > 50
    assert {stand_ins.vop_type(c[c.rindex(b"\x00\x00\x01\xb6"):]) for c in packed} == {"B"}
    # The package's decoder gives every frame once, in display order: the bar moves BAR_SPEED a frame.
    frames, damage = decode_all(path, FrameSpec(size=(spec.height, spec.width)))
    assert damage is None
    want = [k * stand_ins.BAR_SPEED % spec.width for k in range(spec.frames)]
    assert [stand_ins.bar_position(f) for f in frames] == want


def test_the_rotated_clip_carries_a_minus_90_degree_display_matrix(stand_in_videos):
    with av.open(os.path.join(stand_in_videos, "decord__video_90.mov")) as c:
        frames = list(c.decode(video=0))
    assert [f.rotation for f in frames] == [-90] * 3
    assert {(f.width, f.height) for f in frames} == {(568, 320)}  # stored landscape


def test_the_corrupt_file_loses_one_frame_to_a_rejected_packet_and_decodes_on(stand_in_videos):
    path = os.path.join(stand_in_videos, "decord__corrupted.mp4")
    with av.open(path) as c:
        s = c.streams.video[0]
        out, failed = [], []
        for k, packet in enumerate(c.demux(s)):
            try:
                out += [round(f.time * 10) for f in packet.decode()]
            except av.error.InvalidDataError as exc:
                failed.append((k, "Invalid data" in str(exc)))
    assert failed == [(stand_ins.CORRUPT_PACKET, True)]
    assert len(out) == s.frames - 1 == 49 and sorted(out) == [k for k in range(50) if k != 29]
    frames, damage = decode_all(path, FrameSpec())
    assert len(frames) == 28 and damage is not None and damage.startswith("InvalidDataError after 28 good frames")


def test_the_short_clip_has_irregular_intervals_and_its_last_frames_no_decode_timestamp(stand_in_videos):
    with av.open(os.path.join(stand_in_videos, "mmaction2__part_0.mp4")) as c:
        frames = list(c.decode(video=0))
    want = [t * stand_ins.PART_TIME_BASE for t in stand_ins.part_0_pts(32)]
    assert [f.pts * f.time_base for f in frames] == want
    assert [f.dts is None for f in frames] == [False] * 30 + [True] * 2


def test_the_pictures_are_not_blank_and_not_symmetric(stand_in_videos):
    frames, _ = decode_all(os.path.join(stand_in_videos, "mmaction2__demo.mp4"), FrameSpec(size=None, short_side=128))
    assert frames.shape == (280, 128, 170, 3) and frames.std() > 20
    first = frames[0].astype(int)
    assert np.abs(first - first[::-1, ::-1]).mean() > 20  # upside down differs: rotations are visible


def test_writing_again_gives_the_same_bytes(stand_in_videos, tmp_path):
    # The golden checksums of test_convert_identical hold for these files only if they are reproducible.
    again = stand_ins.write_all(str(tmp_path / "again"))
    for name in stand_ins.SPECS:
        with open(os.path.join(again, name), "rb") as a, open(os.path.join(stand_in_videos, name), "rb") as b:
            assert a.read() == b.read(), name
    assert stand_ins.pictures_digest(again) == stand_ins.pictures_digest(stand_in_videos)
