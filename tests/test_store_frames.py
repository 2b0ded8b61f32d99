"""A video's frames read at any indices of its timeline: ``ClipStore.frames`` (FORMAT.md, *Frame timeline*).

One conversion with the default geometry (16-frame clips that tile each
video) is a frame timeline: a reader assembles frames at any step and
length from the clips they fall in. These tests prove it equals the stored
clips, and what a conversion with that geometry stores.
"""

from __future__ import annotations

import os
from typing import cast

import numpy as np
import pytest

from convert.format import FormatError
from convert.format.codecs import CODECS_BY_ID, JpegCodec
from convert.store import open_clips

from .loaders_fixtures import copy_conversion, rewrite_value

CODECS = ("raw", "lz4", "jpeg", "h264", "vp9")
SIZE = (32, 40)


@pytest.fixture(scope="module")
def convs(tmp_path_factory):
    """Five videos of about 3 s, converted with the default clips and with 16 frames at step 4, with each codec:
    {name: folder}."""
    from convert.job.run import JobOptions, run_job
    from convert.synth import make_dataset
    from convert.worker.plan import ConvertConfig

    base = tmp_path_factory.mktemp("frames")
    src = str(base / "src")
    make_dataset(src, per_class=1, seconds=3.0, seed=11)
    out = {}
    configs: list[tuple[str, str, int]] = [*((c, c, 1) for c in CODECS),
                                           *((f"{c}-step4", c, 4) for c in CODECS)]
    for name, codec, stride in configs:
        out[name] = str(base / name)
        run_job(src, out[name], ConvertConfig(size=SIZE, short="loop", codec=codec, stride=stride),
                JobOptions(workers=1, shards=2, progress=False))
    return out


def _timeline(store, v: int) -> np.ndarray:
    """Video ``v``'s whole timeline from its decoded clips, the slow way, by FORMAT.md's rule: whole clips, then a
    tail clip (the video's last T frames) whose frames past the whole clips end the timeline."""
    first, n, length = int(store._video_clip(v, 0)), int(store.video_clips[v]), int(store.video_frames[v])
    clips = [store[first + c].clip for c in range(n)]
    t = clips[0].shape[0]
    if t <= length < n * t:  # a tail clip: its last length - (n - 1) * t frames are the timeline's last
        clips[-1] = clips[-1][t - (length - (n - 1) * t):]
    return np.concatenate(clips)[:length]


@pytest.mark.parametrize("codec", CODECS)
def test_frames_at_any_indices_equal_the_stored_clips(convs, codec):
    store = open_clips(convs[codec])
    rng = np.random.default_rng(0)
    for v in range(len(store.video_ids)):
        whole = _timeline(store, v)
        n = int(store.video_frames[v])
        assert n == whole.shape[0] and n >= 16
        for indices in (np.arange(0, min(n, 64), 4), rng.integers(0, n, 20), [n - 1, 0, 0, n - 1], [], [17]):
            got = store.frames(v, indices)
            assert got.shape == (len(indices), *SIZE, 3)
            assert np.array_equal(got, whole[np.asarray(indices, dtype=np.int64)]), (codec, v, indices)
        # Into a caller's buffer, cropped: the region at ``at`` of each frame.
        out = np.zeros((5, 20, 24, 3), np.uint8)
        picks = [3, 40 % n, 2, 3, n - 1]
        assert store.frames(v, picks, out=out, at=(7, 9)) is out
        assert np.array_equal(out, whole[picks, 7:27, 9:33])


def test_only_the_clips_asked_are_read_and_only_the_frames_asked_decoded(convs, monkeypatch):
    store = open_clips(convs["jpeg"])
    codec = cast(JpegCodec, CODECS_BY_ID[2])
    seen: list[int] = []
    decoded: list[int] = []
    real_at, real_frame = JpegCodec.frames_at, JpegCodec.decode_frame_into

    def frames_at(self, payload, shape, picks, out, *, at=(0, 0)):
        seen.append(len(picks))
        return real_at(self, payload, shape, picks, out, at=at)

    def decode_frame_into(self, part, shape, j, out):
        decoded.append(j)
        return real_frame(self, part, shape, j, out)

    monkeypatch.setattr(JpegCodec, "frames_at", frames_at)
    monkeypatch.setattr(JpegCodec, "decode_frame_into", decode_frame_into)
    assert isinstance(codec, JpegCodec)
    v = int(np.argmax(store.video_frames))
    store.frames(v, [1, 5, 5, 33, 2])  # clips 0 and 2 of the video; frame 5 once
    assert sorted(seen) == [1, 4] and sorted(decoded) == [1, 1, 2, 5]


@pytest.mark.parametrize("codec", CODECS)
def test_frames_at_step_4_equal_a_conversion_with_that_geometry(convs, codec):
    """Frames 0, 4, ..., 60 of a default conversion are clip 0 of a ``--stride 4`` conversion: bit for bit for raw,
    lz4 and jpeg (each frame coded alone, the same way); for h264 and vp9 within their stated tolerance (the two
    conversions code the frames in other groups of pictures): a mean absolute difference under 2 grey levels,
    none over 48."""
    timeline, stepped = open_clips(convs[codec]), open_clips(convs[f"{codec}-step4"])
    assert stepped.manifest.data.timeline_problem() is not None
    compared = 0
    for sv, vid in enumerate(stepped.video_ids):
        v = timeline.video_ids.index(vid)
        for c in range(int(stepped.video_clips[sv])):
            clip = stepped[int(stepped._video_clip(sv, c))].clip
            got = timeline.frames(v, np.arange(c * 64, c * 64 + 61, 4))
            if codec in ("h264", "vp9"):
                diff = np.abs(got.astype(np.int16) - clip)
                assert diff.mean() < 2 and diff.max() <= 48, (vid, c, diff.mean(), diff.max())
            else:
                assert np.array_equal(got, clip), (vid, c)
            compared += 1
    assert compared >= 3


def test_a_conversion_that_does_not_tile_is_refused_and_bad_indices_named(convs):
    stepped = open_clips(convs["raw-step4"])
    with pytest.raises(FormatError, match="do not tile each video's frames") as exc:
        stepped.frames(0, [0])
    assert "\n" not in str(exc.value) and stepped.root in str(exc.value)
    store = open_clips(convs["raw"])
    n = int(store.video_frames[0])
    for bad in ([n], [-1]):
        with pytest.raises(IndexError, match=f"out of range for video {store.video_ids[0]!r} of {n} frames"):
            store.frames(0, bad)
    with pytest.raises(IndexError, match="video 99 out of range"):
        store.frames(99, [0])
    with pytest.raises(ValueError, match="out must be uint8"):
        store.frames(0, [0], out=np.zeros((1, 8, 8, 3), np.uint8), at=(30, 0))


def test_a_damaged_clip_inside_a_sample_is_named_by_its_shard_and_clip(convs, tmp_path):
    from convert.format.layout import unpack_header
    from convert.format.lmdb import HANDLES, clip_key

    root = copy_conversion(convs["jpeg"], str(tmp_path / "c"))
    store = open_clips(root)
    v = int(np.argmax(store.video_clips))
    shards, refs = store.refs([store._video_clip(v, 1)])
    shard = os.path.join(root, store.manifest.shards[int(shards[0])].path)

    def damage(value: bytes) -> bytes:
        h = unpack_header(value)
        return value[:h.offset + 40] + bytes(len(value) - h.offset - 40)

    HANDLES.forget(shard)
    rewrite_value(shard, clip_key(*refs[0]), damage)
    fresh = open_clips(root)
    with pytest.raises(FormatError) as exc:
        fresh.frames(v, [0, 16, 17], verify=True)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{shard}: {clip_key(*refs[0]).decode()}"), msg


def test_a_video_shorter_than_a_clip_has_its_own_frames_only(tmp_path, touch_video):
    """A 10-frame video stored as one looped 16-frame clip (``--short loop``): its timeline is its 10 frames."""
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    touch_video(str(tmp_path / "src" / "a" / "ten.mp4"))
    out = str(tmp_path / "out")
    run_job(str(tmp_path / "src"), out, ConvertConfig(size=SIZE, short="loop"),
            JobOptions(workers=1, shards=1, progress=False))
    store = open_clips(out)
    assert store.video_clips.tolist() == [1] and store.video_frames.tolist() == [10]
    assert np.array_equal(store.frames(0, range(10)), store[0].clip[:10])
    with pytest.raises(IndexError, match="of 10 frames"):
        store.frames(0, [10])


def test_the_tail_clip_holds_the_frames_after_the_last_whole_clip():
    """--tail keep: a video of 50 frames in 16-frame clips gives 3 whole clips and a fourth of its
    last 16 frames (34..49); nothing when the clips end with the video, when max_clips stops before, or when the
    clips do not tile the video."""
    from convert.worker.clips import ClipSpec, cut_clips

    frames = [np.full((2, 2, 3), i, np.uint8) for i in range(50)]
    clips = list(cut_clips(frames, ClipSpec(tail="keep")))
    assert [(c.index, c.start_frame) for c in clips] == [(0, 0), (1, 16), (2, 32), (3, 34)]
    assert clips[3].frames[:, 0, 0, 0].tolist() == list(range(34, 50))
    assert ClipSpec(tail="keep").count(50) == 4 and ClipSpec(tail="drop").count(50) == 3
    for spec, n in [(ClipSpec(tail="drop"), 50), (ClipSpec(tail="keep"), 48), (ClipSpec(tail="keep", max_clips=3), 50),
                    (ClipSpec(tail="keep", stride=2), 50), (ClipSpec(tail="keep", step=8), 50)]:
        got = list(cut_clips(frames[:n], spec))
        assert len(got) == spec.count(n) and all(c.start_frame % spec.start_step == 0 for c in got), spec
    assert len(list(cut_clips(frames, ClipSpec(tail="keep", max_clips=4)))) == 4
    assert not ClipSpec(tail="keep", stride=2).keeps_tail


def test_a_default_conversion_holds_every_frame_of_each_video(tmp_path):
    """With --tail keep each video's timeline is the whole decoded video, frame for frame (raw: bit for bit with
    the converter's own decoder), the tail clip included; a --tail drop conversion (the default) stops at the
    last whole clip."""
    from convert.job.run import JobOptions, run_job
    from convert.synth import make_dataset
    from convert.worker.decode import FrameSpec, VideoDecoder
    from convert.worker.plan import ConvertConfig

    src = str(tmp_path / "src")
    paths = make_dataset(src, per_class=1, seconds=1.3, seed=2)
    keep, drop = str(tmp_path / "keep"), str(tmp_path / "drop")
    for out, tail in ((keep, "keep"), (drop, "drop")):
        run_job(src, out, ConvertConfig(size=SIZE, tail=tail), JobOptions(workers=1, shards=1, progress=False))
    kept, dropped = open_clips(keep), open_clips(drop)
    assert kept.manifest.data.clip.tail and not dropped.manifest.data.clip.tail
    tails = 0
    for path in paths:
        vid = os.path.relpath(os.path.splitext(path)[0], src)
        with VideoDecoder(path, FrameSpec(size=SIZE)) as dec:
            source = np.stack(list(dec))
        v = kept.video_ids.index(vid)
        assert int(kept.video_frames[v]) == len(source)
        assert np.array_equal(kept.frames(v, range(len(source))), source)
        d = dropped.video_ids.index(vid)
        assert int(dropped.video_frames[d]) == len(source) // 16 * 16
        tails += int(kept.video_clips[v]) - int(dropped.video_clips[d])
    assert tails == sum(1 for p in paths if int(kept.video_frames[kept.video_ids.index(
        os.path.relpath(os.path.splitext(p)[0], src))]) % 16)
