"""ClipDataset returns exactly what open_clips stored, cropped where the preset says."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data._utils.collate import default_collate

from convert.format import WRITE_CODECS  # tests run over every registered backend and codec
from loaders import ClipDataset, ClipPreset, DistributedClipSampler, build_loader, open_clips
from loaders.dataset import ClipBatch, collate
from loaders.presets import apply

from .loaders_fixtures import backend_converted, loader_base, raw_root, short_side_root  # noqa: F401


def _expected(store, preset: ClipPreset, epoch: int, i: int) -> np.ndarray:
    clip = store[i].clip
    return apply(clip, preset.params(epoch, i, clip.shape))


@pytest.mark.parametrize("codec", list(WRITE_CODECS))
@pytest.mark.parametrize("train", [True, False])
def test_every_item_is_the_stored_clip_cropped_by_the_preset(synth_videos, loader_base, codec, train):  # noqa: F811
    root = backend_converted(synth_videos, loader_base, "lmdb", codec)
    store = open_clips(root)
    ds = ClipDataset(root, train=train)
    assert len(ds) == len(store) > 20
    assert ds.classes == store.classes
    assert np.array_equal(ds.labels(), store.labels())
    assert np.array_equal(ds.video_index(), store.video_index())
    epoch = 3
    for i in range(len(ds)):
        item = ds[(epoch, i)]
        s = store[i]
        assert item["clip"].dtype == torch.uint8 and tuple(item["clip"].shape) == (16, 112, 112, 3)
        assert np.array_equal(item["clip"].numpy(), _expected(store, ds.preset, epoch, i)), i
        assert (item["label"], item["video_id"], item["clip_index"], item["index"]) == \
               (s.label, s.video_id, s.clip_index, i)
        assert ds.video_ids[ds.video_index()[i]] == s.video_id


def test_int_items_use_set_epoch(raw_root):
    ds = ClipDataset(raw_root, train=True)
    ds.set_epoch(5)
    for i in (0, 7, len(ds) - 1):
        assert torch.equal(ds[i]["clip"], ds[(5, i)]["clip"])
    assert torch.equal(ds[-1]["clip"], ds[(5, len(ds) - 1)]["clip"])
    changed = sum(not torch.equal(ds[(0, i)]["clip"], ds[(1, i)]["clip"]) for i in range(len(ds)))
    assert changed > len(ds) // 2  # a new epoch, new crops
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]


def test_batched_path_equals_item_path(raw_root):
    ds = ClipDataset(raw_root, train=True)
    # indices across all shards, unsorted, with a repeat
    items = [(2, i) for i in (len(ds) - 1, 0, 13, 5, 13, len(ds) // 2)]
    batch = ds.__getitems__(items)
    assert isinstance(batch, ClipBatch) and len(batch) == len(items)
    got = collate(batch)
    want = default_collate([ds[it] for it in items])
    assert sorted(got) == sorted(want) == ["clip", "clip_index", "index", "label", "video_id"]
    assert got["clip"].shape == (6, 16, 112, 112, 3) and got["clip"].dtype == torch.uint8
    for key in ("clip", "label", "clip_index", "index"):
        assert torch.equal(got[key], want[key]), key
    assert got["video_id"] == want["video_id"]
    # torch's own collate on the same list gives the same batch too
    plain = default_collate(list(batch))
    assert torch.equal(plain["clip"], got["clip"]) and plain["video_id"] == got["video_id"]


def test_frames_of_different_widths_batch_together(short_side_root):
    store = open_clips(short_side_root)
    widths = {store[i].clip.shape[2] for i in range(len(store))}
    assert len(widths) >= 3 and {store[i].clip.shape[1] for i in range(len(store))} == {120}
    for train in (True, False):
        ds = ClipDataset(short_side_root, train=train)
        batch = collate(ds.__getitems__([(1, i) for i in range(len(ds))]))
        for i in range(len(ds)):
            assert np.array_equal(batch["clip"][i].numpy(), _expected(store, ds.preset, 1, i))


def test_clip_len_and_multiscale_options(raw_root):
    store = open_clips(raw_root)
    ds = ClipDataset(raw_root, train=True, clip_len=8, multiscale=(1.0, 0.75), crop_size=96)
    assert ds.clip_shape == (8, 96, 96, 3)
    batch = collate(ds.__getitems__([(0, i) for i in range(10)]))
    assert batch["clip"].shape == (10, 8, 96, 96, 3)
    for i in range(10):
        assert np.array_equal(batch["clip"][i].numpy(), _expected(store, ds.preset, 0, i))
    assert len({ds.preset.params(0, i, (16, 128, 171)).t0 for i in range(len(ds))}) > 3


def test_preset_and_fields_must_agree(raw_root):
    p = ClipPreset(train=True, seed=4)
    assert ClipDataset(raw_root, train=True, preset=p, seed=4).preset is p  # the trainer passes both
    with pytest.raises(ValueError, match="disagree with the preset: seed=5"):
        ClipDataset(raw_root, train=True, preset=p, seed=5)
    with pytest.raises(ValueError, match="train=False but the preset has train=True"):
        ClipDataset(raw_root, train=False, preset=p)
    with pytest.raises(ValueError, match="longer than the stored clips"):
        ClipDataset(raw_root, train=True, clip_len=32)
    with pytest.raises(ValueError, match="does not fit"):
        ClipDataset(raw_root, train=False, crop_size=150)


def _reference(ds: ClipDataset, epoch: int) -> dict[int, torch.Tensor]:
    return {i: ds[(epoch, i)]["clip"] for i in range(len(ds))}


def _run_epoch(ds, *, workers: int, method: str | None, epoch: int, batch_size: int = 5) -> dict[int, dict]:
    loader = build_loader(ds, batch_size=batch_size, workers=workers, start_method=method, drop_last=False,
                          persistent_workers=False, prefetch_factor=2)
    loader.sampler.set_epoch(epoch)
    seen: dict[int, dict] = {}
    for batch in loader:
        assert batch["clip"].dtype == torch.uint8 and batch["clip"].shape[1:] == (16, 112, 112, 3)
        for k, i in enumerate(batch["index"].tolist()):
            assert i not in seen
            seen[i] = {"clip": batch["clip"][k].clone(), "label": int(batch["label"][k]),
                       "video_id": batch["video_id"][k], "clip_index": int(batch["clip_index"][k])}
    del loader
    return seen


@pytest.mark.parametrize("method, workers", [("fork", 0), ("fork", 2), ("spawn", 2)])
def test_dataloader_workers_and_start_methods_deliver_the_same_crops(raw_root, method, workers):
    store = open_clips(raw_root)
    ds = ClipDataset(raw_root, train=True)
    epoch = 1
    ref = _reference(ds, epoch)  # the parent has the shards open before any fork
    seen = _run_epoch(ds, workers=workers, method=method, epoch=epoch)
    assert sorted(seen) == list(range(len(ds)))
    for i, got in seen.items():
        assert torch.equal(got["clip"], ref[i]), i
        s = store[i]
        assert (got["label"], got["video_id"], got["clip_index"]) == (s.label, s.video_id, s.clip_index)


def test_worker_count_does_not_change_crops_across_epochs(raw_root):
    ds = ClipDataset(raw_root, train=True)
    one = _run_epoch(ds, workers=1, method="fork", epoch=2, batch_size=3)
    two = _run_epoch(ds, workers=2, method="fork", epoch=2, batch_size=7)
    assert all(torch.equal(one[i]["clip"], two[i]["clip"]) for i in range(len(ds)))
    # the sampler's epoch reaches the workers through the (epoch, index) items
    other = _run_epoch(ds, workers=2, method="fork", epoch=3, batch_size=7)
    assert sum(not torch.equal(other[i]["clip"], two[i]["clip"]) for i in range(len(ds))) > len(ds) // 2


def test_build_loader_defaults(raw_root, monkeypatch):
    ds = ClipDataset(raw_root, train=True, seed=3)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    loader = build_loader(ds, batch_size=4, workers=0)
    assert isinstance(loader.sampler, DistributedClipSampler) and loader.sampler.shuffle
    assert loader.sampler.seed == 3 and loader.drop_last and loader.collate_fn is collate
    assert loader.pin_memory == torch.cuda.is_available()
    ev = build_loader(ClipDataset(raw_root, train=False), batch_size=4, train=False, workers=0)
    assert not ev.sampler.shuffle and not ev.drop_last
    assert [i for b in ev for i in b["index"].tolist()] == list(range(len(ds)))
    from loaders.factory import default_workers

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")
    assert default_workers() == 0
    with pytest.raises(ValueError, match="start_method must be None or one of fork, spawn, forkserver"):
        build_loader(ds, batch_size=4, start_method="thread")
    with pytest.raises(ValueError, match="batch_size"):
        build_loader(ds, batch_size=0)


def test_the_retired_name_lmdb_clip_dataset_is_gone():
    import loaders

    with pytest.raises(AttributeError):
        loaders.LmdbClipDataset  # noqa: B018 - the attribute access is the test
    with pytest.raises(ImportError):
        # The statement old code has, run by exec: the type checker would refuse it as written.
        exec("from loaders.dataset import LmdbClipDataset", {})


def test_opening_keeps_no_shard_mapped_and_reads_every_clip_in_record_order(raw_root):
    """The store indexes its shards through readers it closes (their records mapped pages all over each shard,
    held in RSS for the whole run): afterwards it reads the same clips, in the same order, as the shards' own
    records give them."""
    from convert.format import codec_for_id
    from convert.format.lmdb import HANDLES

    for path in open_clips(raw_root).shard_paths:
        HANDLES.forget(path)  # handles other tests' readers opened
    store = open_clips(raw_root)
    assert not any(HANDLES.holds(p) for p in store.shard_paths)
    expected = []
    for path in store.shard_paths:
        reader = store.backend.reader(path)
        records = reader.records()
        assert reader.records() == records and reader.records() is not records  # read afresh, never kept
        expected += [(h.video_id, h.clip_index, h.label, codec_for_id(h.codec_id).decode(p, h.shape).tobytes())
                     for _, h, p in reader.iter_clips()]
        reader.close()
    assert [(s.video_id, s.clip_index, s.label, s.clip.tobytes()) for s in store] == expected
    assert len(expected) == len(store) > 20
