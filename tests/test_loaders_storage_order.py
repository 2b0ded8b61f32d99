"""``ClipStore.storage_order``: every clip once, in the order its bytes lie in the shards.

Checked against where the bytes really are: the address of each LMDB value
in the shard's map, and the record order of the TFRecord part files read
with the ``tfrecord`` package.
"""

from __future__ import annotations

import os

import lmdb
import numpy as np

from convert.format.lmdb import HANDLES, clip_key
from loaders import open_clips

from .loaders_fixtures import copy_conversion, loader_base, raw_root, tfrecord_converted  # noqa: F401


def _global(store) -> dict[tuple[str, int], int]:
    """(video id, clip index) -> global clip index."""
    starts = np.cumsum(store.video_clips) - store.video_clips
    return {(vid, c): int(starts[v]) + c for v, vid in enumerate(store.video_ids) for c in range(store.video_clips[v])}


def _by_address(store) -> list[int]:
    """Every clip index of an LMDB conversion, sorted by the address of its value in its shard's map."""
    where = _global(store)
    want = []
    for si, path in enumerate(store.shard_paths):
        mine = [(vid, c) for (vid, c) in where if store.video_shard[store.video_ids.index(vid)] == si]
        with HANDLES.get(path).begin(buffers=True) as txn:
            address = {}
            for k in mine:
                value = txn.get(clip_key(*k))
                assert value is not None, k
                address[k] = np.frombuffer(value, dtype=np.uint8).ctypes.data
        want += [where[k] for k in sorted(mine, key=address.__getitem__)]
    return want


def test_lmdb_storage_order_is_the_order_of_the_values_in_each_shard(raw_root):  # noqa: F811
    store = open_clips(raw_root)
    want = _by_address(store)
    got = store.storage_order()
    assert got.tolist() == want
    assert sorted(want) == list(range(len(store)))
    assert want != sorted(want)  # written in plan (hash) order, read in id order: a real permutation


def test_a_compacted_lmdb_shard_records_its_new_order(synth_videos, tmp_path):
    """Compaction rewrites a shard in key order: the order it records is the one its values then have."""
    from convert.format.lmdb import LmdbOptions
    from convert.job.run import JobOptions, run_job
    from convert.job.supervise import ShardOptions
    from convert.worker.plan import ConvertConfig

    root = str(tmp_path / "compact")
    run_job(synth_videos, root, ConvertConfig(), JobOptions(workers=2, shards=2, progress=False,
                                                           shard=ShardOptions(store=LmdbOptions(compact=True))))
    store = open_clips(root)
    assert store.storage_order().tolist() == _by_address(store)


def test_tfrecord_storage_order_is_the_record_order_of_the_part_files(synth_videos, loader_base, raw_root):  # noqa: F811
    import tfrecord

    root = tfrecord_converted(synth_videos, loader_base, "raw")
    store = open_clips(root)
    where = _global(store)
    want = []
    for shard in store.manifest.shards:
        for f in shard.extras["files"]:
            data = f"{store.root}/{shard.path}/{f['path']}"
            want += [where[(bytes(ex["video_id"]).decode(), int(ex["clip_index"][0]))]
                     for ex in tfrecord.tfrecord_loader(data, None, {"video_id": "byte", "clip_index": "int"})]
    assert store.storage_order().tolist() == want
    # Both backends store a shard's videos in the plan's order: LMDB's guess is TFRecord's exact order.
    assert open_clips(raw_root).storage_order().tolist() == want


def test_the_storage_order_is_the_shards_own_not_the_plans(raw_root, tmp_path):  # noqa: F811
    """Each shard records where its videos lie (m/order): without plan.json the order is the same; a shard
    written before the order was recorded is read in reading order."""
    copy = copy_conversion(raw_root, str(tmp_path / "noplan"))
    (tmp_path / "noplan" / "plan.json").unlink()
    assert open_clips(copy).storage_order().tolist() == open_clips(raw_root).storage_order().tolist()
    store = open_clips(copy)
    for path in store.shard_paths:
        HANDLES.forget(path)
        env = lmdb.open(path, subdir=True, max_dbs=0, lock=False,
                        map_size=os.path.getsize(os.path.join(path, "data.mdb")) * 2 + (64 << 20))
        with env.begin(write=True) as txn:
            assert txn.delete(b"m/order")  # as in a shard of an earlier release
        env.close()
    store = open_clips(copy)
    assert store.storage_order().tolist() == list(range(len(store)))
