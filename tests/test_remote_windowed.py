"""A shard-windowed order through a cache smaller than the data: each shard is downloaded once per epoch.

Read through ``build_loader`` as training reads (the sampler's order drives
the prefetch; reader threads or worker processes behind it), from a real S3
server, with a cache of two windows (the one read and the next, prefetched)
holding half of the data; the downloads are counted from the cache's log,
which every process of the node appends to. The declarations of the
shards being read, which make this so, are checked across processes too.
"""

from __future__ import annotations

import collections
import os

import pytest

from convert.store.cache import CacheSettings

from .remote_fixtures import cache_of
from .train_fixtures import tiny_data, tiny_tfrecord

WINDOW = 2
SHARDS = 8


@pytest.fixture(scope="module")
def eight_shards(tiny_data, tmp_path_factory) -> str:
    """The 20 videos of ``tiny_data`` as eight TFRecord shards of five clips."""
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    out = str(tmp_path_factory.mktemp("windowed") / "tfrecord")
    run_job(os.path.join(os.path.dirname(tiny_data), "videos", "train"), out,
            ConvertConfig(backend="tfrecord", codec="raw", size=(40, 52), max_clips=2),
            JobOptions(workers=2, shards=SHARDS, progress=False))
    return out


@pytest.mark.parametrize("readers", [{"threads": 2}, {"workers": 1}], ids=["threads", "processes"])
def test_windowed_order_downloads_each_shard_once_per_epoch(s3_server, eight_shards, tmp_path, readers):
    from loaders import ClipDataset, DistributedClipSampler, build_loader
    from loaders.sampler import clip_shards

    url = s3_server.upload(eight_shards, s3_server.bucket())
    probe = ClipDataset(url, train=True, crop_size=32, seed=0, cache=CacheSettings(cache_dir=str(tmp_path / "p")))
    sizes = probe.store.cache.sizes
    probe.store.close()
    assert len(sizes) == SHARDS
    limit = 2 * WINDOW * max(sizes)
    assert limit < sum(sizes)
    ds = ClipDataset(url, train=True, crop_size=32, seed=0,
                     cache=CacheSettings(cache_dir=str(tmp_path / "cache"), limit=limit, prefetch=WINDOW))
    cache = ds.store.cache
    sampler = DistributedClipSampler(len(ds), num_replicas=1, rank=0, seed=0, order="shards",
                                     clip_shards=clip_shards(ds.store), shard_window=WINDOW)
    loader = build_loader(ds, batch_size=2, sampler=sampler, train=True, drop_last=False, prefetch_factor=2,
                          **readers)
    names = sorted(s.name for s in ds.store.manifest.shards)
    try:
        for epoch in range(3):
            sampler.set_epoch(epoch)
            before = len(cache.downloads())
            present = {names[i] for i in range(SHARDS) if cache.present(i)}
            seen = []
            for batch in loader:
                seen += [int(i) for i in batch["index"]]
                assert cache.held_bytes() <= limit
            got = collections.Counter(cache.downloads()[before:])
            assert sorted(seen) == list(range(len(ds))), epoch
            # Each shard once: the ones the epoch began without exactly once, the others at most once.
            assert max(got.values(), default=0) == 1, (epoch, got)
            assert set(names) - present <= set(got), (epoch, got, present)
    finally:
        if hasattr(loader, "close"):
            loader.close()
        ds.store.close()


def test_dali_source_route_prefetches_in_its_order(s3_server, eight_shards, tmp_path):
    """DALI's source route drives the prefetch from the batches it hands out: after the first batch the next
    shards of its order are in the cache before any read needs them, and read shard by shard through a
    three-shard cache each shard is downloaded once per epoch."""
    from loaders import ClipPreset, dali

    if dali.missing() is not None:
        pytest.skip(f"DALI not usable: {dali.missing()}")
    import time

    import numpy as np

    from loaders.dali import DaliClipLoader

    url = s3_server.upload(eight_shards, s3_server.bucket())
    probe = ClipPreset(train=True, crop_size=32, seed=3)
    loader = DaliClipLoader(url, train=True, batch_size=1, preset=probe, workers=0, prefetch=1,
                            cache=CacheSettings(cache_dir=str(tmp_path / "p")))
    store = loader.store
    order = np.argsort(store.shards_of(np.arange(len(store))), kind="stable")  # shard by shard
    sizes = store.cache.sizes
    loader.close()
    store.close()
    settings = CacheSettings(cache_dir=str(tmp_path / "cache"), limit=3 * max(sizes), prefetch=2)
    loader = DaliClipLoader(url, train=True, batch_size=1, preset=probe, workers=0, prefetch=1, share=order,
                            cache=settings)
    cache = loader.store.cache
    try:
        it = iter(loader)
        next(it)
        deadline = time.monotonic() + 30
        while not (cache.present(1) and cache.present(2)) and time.monotonic() < deadline:
            time.sleep(0.05)
        # The readers are at most two clips into shard 0 (five clips): shards 1 and 2 came by prefetch.
        assert cache.present(1) and cache.present(2), cache.downloads()
        seen = [1 + sum(1 for _ in it)]
        for epoch in (1, 2):
            loader.set_epoch(epoch)
            before = len(cache.downloads())
            seen.append(sum(1 for _ in loader))
            got = collections.Counter(cache.downloads()[before:])
            assert max(got.values(), default=0) == 1, (epoch, got)
            assert cache.held_bytes() <= settings.limit
        assert seen == [len(order)] * 3
    finally:
        loader.close()
        loader.store.close()


def _declare_and_exit(url: str, cache_dir: str, shards: list[int]) -> None:
    from convert.store.cache import ShardCache

    ShardCache(url, CacheSettings(cache_dir=cache_dir)).want(shards)


def test_shards_a_process_reads_are_kept_for_it(tiny_tfrecord, tmp_path):
    """Declarations are the node's: a prefetch in one process never evicts a shard another process declared
    (it gives up instead); a read evicts one only when nothing else frees the room; the declaration of a
    process that ended counts for nothing."""
    import multiprocessing

    from convert.store.cache import ShardCache

    url = f"file://{tiny_tfrecord}"
    cache_dir = str(tmp_path / "cache")
    first = ShardCache(url, CacheSettings(cache_dir=cache_dir))
    limit = 3 * max(first.sizes)
    a = ShardCache(url, CacheSettings(cache_dir=cache_dir, limit=limit))
    b = ShardCache(url, CacheSettings(cache_dir=cache_dir, limit=limit))
    for s in (0, 1, 2):
        a.acquire(s).release()
    a.want({0, 1, 2})
    assert b.wanted() == {0, 1, 2}
    assert not b.fetch(3, wait=False)  # a prefetch: every shard there is wanted
    assert all(b.present(s) for s in (0, 1, 2)) and not b.present(3)
    a.want({0, 2})
    assert b.fetch(3, wait=False)  # shard 1, wanted by nobody, made the room
    assert not b.present(1) and all(b.present(s) for s in (0, 2, 3))
    a.want({0, 2, 3})
    b.acquire(1).release()  # a read: evicts a wanted shard (the least recently used) when it must
    assert b.present(1) and b.held_bytes() <= limit
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_declare_and_exit, args=(url, cache_dir, [1]))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert b.wanted() == {0, 2, 3}  # the ended process's declaration is gone
    a.unwant()
    assert b.wanted() == set()
    assert os.listdir(os.path.join(b.dir, ".wanted")) == []


def _rank(rank: int, world: int, port: int, argv: list[str]) -> None:
    from train.main import run_argv

    from .train_fixtures import as_torchrun_rank

    as_torchrun_rank(rank, world, port)

    run_argv(argv)


@pytest.mark.parametrize("window", [1, 2, 4])
def test_the_cache_limit_floor_is_the_one_docs_reading_states(s3_server, eight_shards, tmp_path, window):
    """docs/reading.md: with ``--order shards --order-shards W`` the trainer prefetches max(2, W) shards, so a
    ``--cache-limit`` under (1 + max(2, W)) times the largest shard is refused in one line (3 times it for
    W = 1, not 2), and that floor itself is taken."""
    from argparse import Namespace

    from convert.store.cache import CacheFullError, ShardCache
    from train.data import cache_settings

    url = s3_server.upload(eight_shards, s3_server.bucket())
    largest = max(ShardCache(url, CacheSettings(cache_dir=str(tmp_path / "probe"))).sizes)
    times = 1 + max(2, window)

    def settings(limit: int) -> CacheSettings:
        return cache_settings(Namespace(order="shards", order_shards=window, cache_dir=str(tmp_path / "cache"),
                                        cache_limit=limit))

    assert settings(1).prefetch == max(2, window)
    with pytest.raises(CacheFullError) as refused:
        ShardCache(url, settings(times * largest - 1))
    msg = str(refused.value)
    assert "\n" not in msg and f"({largest} bytes) times {times} (one read, {times - 1} prefetched)" in msg, msg
    assert ShardCache(url, settings(times * largest)).limit == times * largest


def test_the_trainers_start_up_check_downloads_one_shard(s3_server, eight_shards, tmp_path):
    """Checking the clip shape of a remote conversion reads the shards already cached, else the first: it must
    not download the data (Kinetics from a bucket is terabytes)."""
    from convert.store.cache import ShardCache
    from train.data import dataset_info

    url = s3_server.upload(eight_shards, s3_server.bucket())
    settings = CacheSettings(cache_dir=str(tmp_path / "cache"))
    shape = dataset_info(url, 32, cache=settings)
    assert shape.clip_len == 16
    assert ShardCache(url, settings).downloads() == ["shard-00000"]
    dataset_info(url, 32, cache=settings)
    assert ShardCache(url, settings).downloads() == ["shard-00000"]


def test_two_ranks_of_a_node_train_from_one_cache_each_shard_once_per_epoch(s3_server, eight_shards, tmp_path):
    """The trainer on two gloo processes from ``s3://`` with ``--order shards --order-shards 2`` and one cache of
    two windows (half the data) for both: every shard downloaded once per epoch for the node, two epochs."""
    import torch.multiprocessing as mp

    from .train_fixtures import common, free_port

    url = s3_server.upload(eight_shards, s3_server.bucket())
    probe = _shard_sizes(url, tmp_path)
    limit = 2 * WINDOW * max(probe)
    assert limit < sum(probe)
    cache_dir = tmp_path / "cache"
    argv = common(url, tmp_path / "run") + [
        "--batch-size", "2", "--optimizer", "sgd", "--lr", "0.01", "--epochs", "2", "--eval-every", "0",
        "--order", "shards", "--order-shards", str(WINDOW), "--cache-dir", str(cache_dir),
        "--cache-limit", str(limit)]
    mp.start_processes(_rank, args=(2, free_port(), argv), nprocs=2, start_method="spawn")
    from convert.store.cache import ShardCache

    got = collections.Counter(ShardCache(url, CacheSettings(cache_dir=str(cache_dir))).downloads())
    # Epoch 0 downloads all eight (the start-up check of the clip shape one of them, read on by the epoch);
    # epoch 1 those the cache lost since, each once (its first window may still be there from epoch 0).
    assert set(got) == {f"shard-{i:05d}" for i in range(SHARDS)} and max(got.values()) <= 2, got
    assert SHARDS + SHARDS - 2 * WINDOW <= sum(got.values()) <= 2 * SHARDS, got


def _shard_sizes(url: str, tmp_path) -> list[int]:
    """The shard sizes of the conversion at ``url``."""
    from convert.store import open_clips

    store = open_clips(url, cache=CacheSettings(cache_dir=str(tmp_path / "probe")))
    sizes = list(cache_of(store).sizes)
    store.close()
    return sizes
