"""The on-the-fly PyAV baseline, and the benchmark's pieces on small data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.onthefly import OnTheFlyVideoDataset
from convert.format import FormatError
from convert.worker.decode import FrameSpec, decode_all
from loaders import ClipPreset
from loaders.presets import apply

from .loaders_fixtures import loader_base, raw_root  # noqa: F401


@pytest.fixture(scope="module")
def frames_of(synth_videos):
    cache: dict[str, np.ndarray] = {}

    def get(path: str) -> np.ndarray:
        if path not in cache:
            cache[path] = decode_all(path, FrameSpec(size=(128, 171)))[0]
        return cache[path]

    return get


def test_eval_item_is_the_centre_window_cropped(synth_videos, frames_of):
    ds = OnTheFlyVideoDataset(synth_videos, train=False)
    assert len(ds) == 20 and ds.classes == ["move_down", "move_left", "move_right", "move_up", "spin"]
    for i in (0, 7, 19):
        frames = frames_of(ds.items[i].path)
        t0 = int(round((len(frames) - 16) / 2.0))
        item = ds[i]
        want = frames[t0:t0 + 16][:, 8:120, 30:142]  # centre crop of 128x171
        assert np.array_equal(item["clip"].numpy(), want)
        assert item["label"] == ds.items[i].label and item["video_id"] == ds.items[i].id
        assert (item["index"], item["clip_index"]) == (i, 0)


def test_train_window_is_random_but_keyed_by_epoch_and_index(synth_videos, frames_of):
    ds = OnTheFlyVideoDataset(synth_videos, train=True, seed=2)
    i = 3
    frames = frames_of(ds.items[i].path)
    starts = set()
    for epoch in range(6):
        t0, window = ds.window(i, epoch)
        assert 0 <= t0 <= len(frames) - 16
        assert np.array_equal(window, frames[t0:t0 + 16])
        starts.add(t0)
        item = ds[(epoch, i)]
        assert np.array_equal(item["clip"].numpy(), apply(window, ds.preset.params(epoch, i, window.shape)))
        assert torch.equal(item["clip"], ds[(epoch, i)]["clip"])
    assert len(starts) > 2


def test_shared_videos_through_a_list_file(videos, tmp_path, frames_of):
    listing = tmp_path / "list.txt"
    # the 3-frame rotated clip is looped up to 16 frames
    listing.write_text("mmaction2__demo.mp4 0\nmmcv__test.mp4 1\ndecord__video_90.mov 1\n")
    ds = OnTheFlyVideoDataset(str(listing), train=False, videos=videos.root,
                              preset=ClipPreset(train=False, crop_size=112))
    assert [it.label for it in ds.items] == [1, 0, 1]  # sorted by id
    for i in range(len(ds)):
        assert ds[i]["clip"].shape == (16, 112, 112, 3)
    short = [k for k, it in enumerate(ds.items) if it.id == "decord__video_90"][0]
    t0, window = ds.window(short)
    frames = frames_of(ds.items[short].path)
    assert t0 == 0 and len(frames) == 3
    assert np.array_equal(window, frames[[0, 1, 2] * 5 + [0]])


def test_missing_video_file_is_a_clear_error(tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text("nothing_here.mp4 0\n")
    with pytest.raises(FormatError, match="no usable videos"):
        OnTheFlyVideoDataset(str(listing), train=True)


def test_bench_pieces_on_small_data(raw_root, synth_videos):
    from benchmarks.loaders.common import EPOCH_DRAWS, ReadCopyDataset, _as_is, measure, paired, steady_sampler
    from convert.store import open_clips
    from loaders import ClipDataset

    two, one = ("threads", "x", 2), ("threads", "x", 1)
    rounds = [{two: 3.0, one: 2.0}, {two: 2.0, one: 1.0}, {two: 5.0, one: 2.0}, {two: 9.0}]
    assert paired(rounds, two, one) == 2.0  # the ratios 1.5, 2, 2.5 within rounds; the last has no pair
    assert paired(rounds[3:], two, one) is None

    steady = steady_sampler(10)
    steady.set_epoch(3)
    drawn = [i for _, i in steady]
    assert len(drawn) == len(steady) == EPOCH_DRAWS * 10 and set(drawn) <= set(range(10))

    bound = ReadCopyDataset(raw_root)
    batch = bound.__getitems__([(0, 0), (0, 5)])
    store = open_clips(raw_root)
    values: list[bytes] = [b"", b""]
    for clip in store.read([0, 5]):
        values[clip.position] = bytes(clip.payload)
    assert batch["bytes"] == sum(len(v) for v in values)
    assert bytes(batch["clip"][1, :len(values[1])].numpy()) == values[1]
    for ds, fn in ((ClipDataset(raw_root, train=True), None), (bound, _as_is)):
        r = measure(ds, batch_size=4, workers=0, seconds=0.2, start_method=None, collate_fn=fn)
        assert r["clips_s"] > 0 and r["clips"] % 4 == 0
    r = measure(OnTheFlyVideoDataset(synth_videos, train=True), batch_size=2, workers=0, seconds=0.1,
                start_method=None)
    assert r["mb_s"] == pytest.approx(r["clips_s"] * 16 * 112 * 112 * 3 / 1e6)
