"""Samples assembled at read time from one conversion: ``SampleSpec``, ``VideoSamples`` and ``ClipDataset(spec=)``.

The spec decides which frames of a video one sample is (random windows at
any step, uniform evaluation views, TSN segments, SlowFast's pathways);
every reader gives the same samples, drawn from (seed, epoch, index).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from convert.store import open_clips
from loaders import ClipDataset
from loaders.factory import build_loader
from loaders.presets import ClipPreset
from loaders.sampler import DistributedClipSampler
from loaders.sampling import SampleSpec, VideoSamples

from .loaders_fixtures import converted, loader_base, short_side_root  # noqa: F401 (fixtures)

SIZE = (32, 40)


@pytest.fixture(scope="module")
def timeline(tmp_path_factory):
    """Five videos of about 3 s, jpeg at 32x40 with the default clips (a frame timeline), and a --stride 2 one."""
    from convert.synth import make_dataset

    base = str(tmp_path_factory.mktemp("sampling"))
    src = f"{base}/src"
    make_dataset(src, per_class=1, seconds=3.0, seed=5)
    return {"default": converted(src, base, "jpeg", codec="jpeg", size=SIZE),
            "stride2": converted(src, base, "jpeg2", codec="jpeg", size=SIZE, stride=2)}


def test_a_spec_is_validated_and_round_trips_through_a_checkpoint():
    spec = SampleSpec(frames=32, step=2, rule="window", clips_per_video=5, views=10, alpha=4)
    assert SampleSpec.from_dict(spec.to_dict()) == spec and spec.span == 63
    assert spec.slow_indices().tolist() == [0, 4, 8, 12, 16, 20, 24, 28]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"rule": "window"}, "needs frames"), ({"frames": 0, "rule": "window"}, "frames must be"),
        ({"frames": 8, "rule": "dense"}, "rule must be one of"),
        ({"frames": 8, "step": 2, "rule": "segments"}, "takes step 1"),
        ({"frames": 8, "clips_per_video": 2}, "rule 'clips' reads each stored clip once"),
        ({"frames": 32, "rule": "window", "alpha": 5}, "alpha 5 must divide frames 32")]
    for bad, words in cases:
        with pytest.raises(ValueError, match=words):
            SampleSpec(**bad)
    with pytest.raises(ValueError, match="unknown sample spec fields"):
        SampleSpec.from_dict({"frames": 8, "speed": 2})


def test_windows_views_and_segments_follow_the_recipes():
    lengths = np.array([100, 40, 10])
    train = VideoSamples(spec=SampleSpec(frames=16, step=4, rule="window", clips_per_video=5), lengths=lengths,
                         train=True, seed=3)
    assert len(train) == 15 and train.video(7) == 1
    for i in range(len(train)):
        idx = train.indices(2, i)
        assert np.array_equal(idx, train.indices(2, i))  # keyed: the same draw every time it is asked
        if train.video(i) == 0:
            assert idx[0] <= 100 - 61 and idx[-1] - idx[0] == 60
    assert any(not np.array_equal(train.indices(0, i), train.indices(1, i)) for i in range(5))  # new per epoch
    # A 40-frame video is shorter than the 61-frame span, a 10-frame one too: their frames loop (SHORT_RULE).
    assert train.indices(0, 5).tolist() == [(4 * k) % 40 for k in range(16)]
    assert train.indices(0, 10).tolist() == [(4 * k) % 10 for k in range(16)]
    views = VideoSamples(spec=SampleSpec(frames=16, step=2, rule="window", views=3), lengths=np.array([100]),
                         train=False)
    # mmaction2's test offsets: slack 70, view k at int((k + 0.5) * 70 / 3).
    assert [int(views.indices(0, k)[0]) for k in range(3)] == [11, 35, 58]
    segs = VideoSamples(spec=SampleSpec(frames=8, rule="segments"), lengths=np.array([80]), train=False)
    assert segs.indices(0, 0).tolist() == [5, 15, 25, 35, 45, 55, 65, 75]
    two = VideoSamples(spec=SampleSpec(frames=8, rule="segments", views=2), lengths=np.array([80]), train=False)
    assert [two.indices(0, k).tolist()[:3] for k in range(2)] == [[2, 12, 22], [7, 17, 27]]  # a quarter, 3 quarters
    segs_train = VideoSamples(spec=SampleSpec(frames=8, rule="segments"), lengths=np.array([80]), train=True)
    got = segs_train.indices(4, 0)
    assert all(10 * k <= int(f) < 10 * (k + 1) for k, f in enumerate(got))
    too_long = VideoSamples(spec=SampleSpec(frames=64, step=2, rule="window"), lengths=lengths, train=True)
    assert "spans 127 frames, longer than every video (the longest has 100)" in (too_long.problem() or "")


@pytest.mark.parametrize("spec", [SampleSpec(frames=16, step=4, rule="window", clips_per_video=2),
                                  SampleSpec(frames=8, rule="segments"),
                                  SampleSpec(frames=32, step=2, rule="window", alpha=4)], ids=str)
def test_every_reader_gives_the_same_samples_and_each_is_the_timeline_cut(timeline, spec):
    root = timeline["default"]
    store = open_clips(root)
    preset = ClipPreset(train=True, crop_size=24, seed=9, clip_len=spec.frames)
    ds = ClipDataset(root, train=True, preset=preset, spec=spec)
    assert len(ds) == len(store.video_ids) * spec.clips_per_video and ds.clip_shape == (spec.frames, 24, 24, 3)
    direct = ds.__getitems__([(1, i) for i in range(len(ds))]).collated
    for i in range(len(ds)):
        v = ds.samples.video(i)
        frames = store.frames(v, ds.samples.indices(1, i))
        p = preset.params(1, i, frames.shape)
        want = frames[:, p.y0:p.y0 + p.h, p.x0:p.x0 + p.w]
        want = want[:, :, ::-1] if p.flip else want
        assert np.array_equal(direct["clip"][i].numpy(), want)
        assert int(direct["label"][i]) == int(store.video_labels[v]) and direct["video_id"][i] == store.video_ids[v]
    assert np.array_equal(ds.labels(), direct["label"].numpy())
    batches = {}
    for threads, workers in ((2, None), (None, 2), (None, 0)):
        sampler = DistributedClipSampler(len(ds), num_replicas=1, rank=0, seed=4)
        sampler.set_epoch(1)
        with build_loader(ds, batch_size=3, sampler=sampler, drop_last=False, pin_memory=False, threads=threads,
                          workers=workers) as loader:
            batches[(threads, workers)] = [(b["index"].clone(), b["clip"].clone()) for b in loader]
    first, *rest = batches.values()
    for other in rest:
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, other))
    for index, clip in first:
        for k, i in enumerate(index.tolist()):
            assert torch.equal(clip[k], direct["clip"][i])


def test_the_default_spec_reads_the_stored_clips_as_before(timeline):
    root = timeline["default"]
    preset = ClipPreset(train=True, crop_size=24, seed=9, clip_len=8)
    plain = ClipDataset(root, train=True, preset=preset)
    spec = ClipDataset(root, train=True, preset=ClipPreset(train=True, crop_size=24, seed=9), spec=SampleSpec(frames=8))
    items = [(0, i) for i in range(len(plain))]
    assert len(plain) == len(spec) and plain.preset == spec.preset
    assert torch.equal(plain.__getitems__(items).collated["clip"], spec.__getitems__(items).collated["clip"])


def test_a_spec_the_data_cannot_serve_is_refused_in_one_line(timeline):
    with pytest.raises(ValueError, match="do not tile each video's frames") as exc:
        ClipDataset(timeline["stride2"], train=True, crop_size=24, spec=SampleSpec(frames=8, rule="window"))
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="longer than every video"):
        ClipDataset(timeline["default"], train=True, crop_size=24, spec=SampleSpec(frames=64, step=8, rule="window"))
    with pytest.raises(ValueError, match="crop_size 48 does not fit"):
        ClipDataset(timeline["default"], train=True, crop_size=48, spec=SampleSpec(frames=8, rule="window"))
    with pytest.raises(ValueError, match="disagrees with the spec's frames"):
        ClipDataset(timeline["default"], train=True, preset=ClipPreset(train=True, clip_len=16, crop_size=24),
                    spec=SampleSpec(frames=8, rule="window"))


def test_evaluation_views_are_the_same_every_pass(timeline):
    ds = ClipDataset(timeline["default"], train=False, crop_size=24,
                     spec=SampleSpec(frames=16, step=2, rule="window", views=3))
    assert len(ds) == 3 * len(ds.store.video_ids)
    assert ds.video_index().tolist() == np.repeat(np.arange(len(ds.store.video_ids)), 3).tolist()
    a = ds.__getitems__([(0, i) for i in range(len(ds))]).collated["clip"]
    b = ds.__getitems__([(5, i) for i in range(len(ds))]).collated["clip"]
    assert torch.equal(a, b)


@pytest.mark.parametrize("workers", [0, 2])
def test_dali_source_route_assembles_the_same_samples_and_the_native_route_names_it(timeline, workers, tmp_path):
    pytest.importorskip("nvidia.dali")
    from loaders.dali import DaliClipLoader, DaliTFRecordLoader

    root = timeline["default"]
    spec = SampleSpec(frames=16, step=3, rule="window", clips_per_video=2)
    preset = ClipPreset(train=True, crop_size=24, seed=9, clip_len=16)
    ds = ClipDataset(root, train=True, preset=preset, spec=spec)
    loader = DaliClipLoader(root, train=True, batch_size=2, preset=preset, spec=spec, workers=workers)
    loader.set_epoch(2)
    got = list(loader)
    loader.close()
    assert len(got) == len(ds) // 2
    for batch in got:
        want = ds.__getitems__([(2, int(i)) for i in batch["index"]]).collated
        assert torch.equal(batch["clip"], want["clip"]) and torch.equal(batch["label"], want["label"])
        assert batch["video_id"] == want["video_id"] and torch.equal(batch["clip_index"], want["clip_index"])
    if workers == 0:
        from convert.synth import make_dataset

        src = str(tmp_path / "src")
        make_dataset(src, per_class=1, seconds=1.0, seed=5)
        tf = converted(src, str(tmp_path), "tf", codec="raw", backend="tfrecord", size=SIZE)
        with pytest.raises(ValueError, match="native TFRecord route reads stored clips.*route='source'") as exc:
            DaliTFRecordLoader(tf, train=True, batch_size=2, preset=preset, spec=spec)
        assert "\n" not in str(exc.value)


def test_samples_of_a_short_side_conversion_are_cut_from_each_videos_own_frame_size(short_side_root):
    """Frames keep their aspect (short side 120): each video's size comes from its clip header, the crop is cut
    from it as from the whole frames (flipped or not), one copy of the region only."""
    root = short_side_root
    store = open_clips(root)
    spec = SampleSpec(frames=16, step=2, rule="window")
    preset = ClipPreset(train=True, crop_size=96, seed=1, clip_len=16)
    ds = ClipDataset(root, train=True, preset=preset, spec=spec)
    got = ds.__getitems__([(3, i) for i in range(len(ds))]).collated["clip"]
    flips = 0
    for i in range(len(ds)):
        v = ds.samples.video(i)
        frames = store.frames(v, ds.samples.indices(3, i))
        p = preset.params(3, i, frames.shape)
        want = frames[:, p.y0:p.y0 + p.h, p.x0:p.x0 + p.w]
        flips += p.flip
        assert np.array_equal(got[i].numpy(), want[:, :, ::-1] if p.flip else want)
    assert 0 < flips < len(ds)


def test_a_short_side_scale_cuts_the_square_that_becomes_the_crop_after_the_resize():
    """short_side (lo, hi): the region of round(crop * short / S) with S drawn from lo..hi (training) or lo
    (evaluation), resized to the crop with a filtered downscale; refused below the crop or with multiscale."""
    train = ClipPreset(train=True, crop_size=32, seed=2, short_side=(40, 80))
    sides = set()
    for i in range(200):
        p = train.params(0, i, (16, 64, 96))
        assert p.h == p.w and p.out_size in (None, (32, 32)) and p.antialias == (p.out_size is not None)
        assert round(32 * 64 / 80) <= p.h <= round(32 * 64 / 40)
        assert 0 <= p.y0 <= 64 - p.h and 0 <= p.x0 <= 96 - p.w
        sides.add(p.h)
    assert len(sides) > 10
    ev = ClipPreset(train=False, crop_size=32, short_side=(48, 48)).params(0, 0, (16, 64, 96))
    assert (ev.h, ev.y0, ev.x0, ev.out_size) == (43, 10, 26, (32, 32))  # round(32*64/48) = 43, centred
    frames = np.random.default_rng(0).integers(0, 256, (16, 64, 96, 3), dtype=np.uint8)
    from loaders.presets import apply, resize_antialiased

    got = apply(frames, ev)
    assert got.shape == (16, 32, 32, 3)
    assert np.array_equal(got, resize_antialiased(frames[:, 10:53, 26:69], (32, 32)))
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"short_side": (31, 40)}, "crop_size 32 <= lo <= hi"), ({"short_side": (50, 40)}, "crop_size 32 <= lo <= hi"),
        ({"short_side": (40, 50), "multiscale": (1.0, 0.8)}, "give one")]
    for bad, words in refusals:
        with pytest.raises(ValueError, match=words):
            ClipPreset(train=True, crop_size=32, **bad)


def test_the_read_time_resize_is_the_conversions_within_its_tolerance(tmp_path):
    """A short-side 64 conversion's frames resized at read time to a short side of 32 (the filter of
    short_side's crops, resize_antialiased) against a short-side 32 conversion of the same videos: a mean
    absolute difference under 3 grey levels per clip (FFmpeg's bilinear scaler runs on the YUV planes before
    the conversion to RGB, this one on RGB)."""
    from convert.job.run import JobOptions, run_job
    from convert.synth import make_dataset
    from convert.worker.plan import ConvertConfig
    from loaders.presets import resize_antialiased

    src = str(tmp_path / "src")
    make_dataset(src, per_class=1, seconds=0.7, seed=3)
    for side in (64, 32):
        run_job(src, str(tmp_path / str(side)), ConvertConfig(size=None, short_side=side),
                JobOptions(workers=1, shards=1, progress=False))
    big, small = open_clips(str(tmp_path / "64")), open_clips(str(tmp_path / "32"))
    for i in range(len(big)):
        want = small[i].clip
        got = resize_antialiased(big[i].clip, want.shape[1:3])
        assert np.abs(got.astype(np.int16) - want).mean() < 3, i


def test_dali_source_route_scales_the_short_side_as_the_dataset_does(short_side_root):
    """DALI's antialiased linear resize against the dataset's (Pillow's): within a grey level."""
    pytest.importorskip("nvidia.dali")
    from loaders.dali import DaliClipLoader, DaliTFRecordLoader

    for train in (True, False):
        preset = ClipPreset(train=train, crop_size=96, seed=1, short_side=(128, 160) if train else (140, 140))
        ds = ClipDataset(short_side_root, train=train, preset=preset)
        loader = DaliClipLoader(short_side_root, train=train, batch_size=4, preset=preset, workers=0)
        for k, batch in enumerate(loader):
            want = ds.__getitems__([(0, int(i)) for i in batch["index"]]).collated["clip"]
            assert (batch["clip"].int() - want.int()).abs().max() <= 1
            if k == 1:
                break
        loader.close()
    with pytest.raises(ValueError, match="no short-side scale"):
        DaliTFRecordLoader(short_side_root, train=True, batch_size=2, preset=preset)


def test_a_random_resized_crop_draws_an_area_and_an_aspect_and_every_reader_cuts_it_alike(short_side_root):
    """random_resized (0.08, 1): regions of 8-100% of the frame's area and an aspect ratio in 3/4..4/3, inside
    the frame, resized to the crop (filtered); evaluation takes the centre square; the dataset and DALI's source
    route agree within their filters' tolerance (a mean difference under half a grey level, a few edge pixels
    further: DALI's and Pillow's antialiasing differ at scales that are not the same both ways)."""
    import math

    from loaders.presets import RESIZED_RATIO

    preset = ClipPreset(train=True, crop_size=48, seed=4, random_resized=(0.08, 1.0))
    areas = []
    for i in range(300):
        p = preset.params(1, i, (16, 120, 160))
        assert p.out_size == (48, 48) and p.antialias and 0 <= p.y0 <= 120 - p.h and 0 <= p.x0 <= 160 - p.w
        assert RESIZED_RATIO[0] - 0.05 <= p.w / p.h <= RESIZED_RATIO[1] + 0.05 or (p.h, p.w) == (120, 160)
        areas.append(p.h * p.w / (120 * 160))
    assert min(areas) < 0.2 and max(areas) > 0.8 and not math.isclose(min(areas), max(areas))
    ev = ClipPreset(train=False, crop_size=48, random_resized=(0.08, 1.0)).params(0, 0, (16, 120, 160))
    assert (ev.h, ev.w, ev.out_size) == (48, 48, None)
    with pytest.raises(ValueError, match="give one"):
        ClipPreset(train=True, crop_size=48, random_resized=(0.08, 1.0), multiscale=(1.0,))
    with pytest.raises(ValueError, match="0 < lo <= hi <= 1"):
        ClipPreset(train=True, crop_size=48, random_resized=(0.5, 1.5))
    pytest.importorskip("nvidia.dali")
    from loaders.dali import DaliClipLoader

    ds = ClipDataset(short_side_root, train=True, preset=preset)
    loader = DaliClipLoader(short_side_root, train=True, batch_size=4, preset=preset, workers=0)
    for k, batch in enumerate(loader):
        want = ds.__getitems__([(0, int(i)) for i in batch["index"]]).collated["clip"]
        diff = (batch["clip"].int() - want.int()).abs()
        assert diff.float().mean() < 0.5 and diff.max() <= 16
        if k == 1:
            break
    loader.close()
