"""Several processes reading one shard set at once, while others hold it open."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import re

import lmdb
import numpy as np
import pytest

from convert.format.lmdb import HANDLES, clip_key
from loaders import ClipDataset, open_clips

from .loaders_fixtures import loader_base, raw_root  # noqa: F401


def _digests(root: str, order: list[int], train: bool) -> dict[int, str]:
    """SHA-256 of every clip read in ``order`` (runs in a spawned process)."""
    ds = ClipDataset(root, train=train)
    out = {}
    for k in range(0, len(order), 4):  # the batched path, several shards per batch
        batch = ds.__getitems__([(1, i) for i in order[k:k + 4]])
        for sample in batch:
            out[sample["index"]] = hashlib.sha256(sample["clip"].numpy().tobytes()).hexdigest()
    for i in order[:3]:  # and the single-item path
        assert hashlib.sha256(ds[(1, i)]["clip"].numpy().tobytes()).hexdigest() == out[i]
    return out


def _stored_digests(root: str) -> dict[int, str]:
    store = open_clips(root)
    return {i: hashlib.sha256(store[i].clip.tobytes()).hexdigest() for i in range(len(store))}


def test_spawned_readers_return_correct_values(raw_root):
    ds = ClipDataset(raw_root, train=True)  # this process holds the shards open throughout
    n = len(ds)
    want = {i: hashlib.sha256(ds[(1, i)]["clip"].numpy().tobytes()).hexdigest() for i in range(n)}
    rng = np.random.default_rng(0)
    orders = [rng.permutation(n).tolist() for _ in range(3)]
    ctx = mp.get_context("spawn")
    with ctx.Pool(3) as pool:
        results = pool.starmap(_digests, [(raw_root, o, True) for o in orders])
        stored = pool.apply_async(_stored_digests, (raw_root,))
        uncropped = stored.get(timeout=120)
    for got in results:
        assert got == want
    store = open_clips(raw_root)
    assert uncropped == {i: hashlib.sha256(store[i].clip.tobytes()).hexdigest() for i in range(n)}


def _read_in_child(path: str, key: bytes, queue) -> None:
    try:
        with HANDLES.get(path).begin() as txn:
            queue.put(len(_value(txn, key)))
    except Exception as exc:  # noqa: BLE001 - report any failure to the parent, which asserts on it
        queue.put(f"{type(exc).__name__}: {exc}")


def _value(txn: lmdb.Transaction, key: bytes) -> bytes | memoryview:
    value = txn.get(key)
    assert value is not None, key
    return value


def test_forked_child_reopens_a_shard_its_parent_has_open(raw_root):
    # py-lmdb's "already open in this process" registry is inherited through
    # fork; the loader closes the inherited handles in the child first.
    store = open_clips(raw_root)
    shards, refs = store.refs([0])
    path = store.shard_paths[int(shards[0])]
    keys = [clip_key(*refs[0])]
    with HANDLES.get(path).begin() as txn:
        size = len(_value(txn, keys[0]))
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(path, keys[0], queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=60)
    assert got == size
    with HANDLES.get(path).begin() as txn:  # the parent's handle still works
        assert len(_value(txn, keys[0])) == size


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_shard_maps_keep_the_kernels_read_around(raw_root):  # noqa: F811
    """A reader's LMDB map must not carry MADV_RANDOM ("rr" in VmFlags): py-lmdb touches every page of a value
    in get(), so without read-around a clip that is not in the page cache comes in 4 KB at a time (README)."""
    store = open_clips(raw_root)
    assert store.get(0).clip.shape == (16, 128, 171, 3)
    flags, current = {}, None
    with open("/proc/self/smaps") as fh:
        for line in fh:
            fields = line.split()
            if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", fields[0]):  # a mapping's first line; the path is the 6th field
                path = fields[5] if len(fields) >= 6 else ""
                current = path if path.startswith(raw_root) and path.endswith("data.mdb") else None
            elif current and fields[0] == "VmFlags:":
                flags[current] = fields[1:]
    assert len(flags) >= 1  # the shard of clip 0 is mapped
    assert all("rd" in f and "wr" not in f and "rr" not in f for f in flags.values()), flags


def test_the_cold_benchmark_drops_a_file_from_the_page_cache(tmp_path):
    """``python -m benchmarks.loaders --sections cold`` is only cold if the drop works: reading the file again
    must fault."""
    import mmap
    import resource

    from benchmarks.loaders.cold import drop_from_page_cache

    path = tmp_path / "data"
    path.write_bytes(np.random.default_rng(0).integers(0, 255, 1 << 20, dtype=np.uint8).tobytes())
    path.read_bytes()
    if not drop_from_page_cache([str(path)]):
        pytest.skip("this filesystem keeps the file's pages (tmpfs?)")
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ) as mm:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        np.frombuffer(mm, dtype=np.uint8)[::4096].sum()  # one byte of every page
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt - before
    assert faults >= 1


@pytest.mark.parametrize("order", ["random", "blocks"])
def test_the_small_cache_benchmark_reads_every_clip_once_in_the_samplers_order(raw_root, order):  # noqa: F811
    """``--sections smallcache``'s reader (here without a cgroup): each clip once, from storage, in either order."""
    from benchmarks.loaders.cold import cold_read

    n = len(open_clips(raw_root))
    r = cold_read(raw_root, order=order, block=4, window=2)
    assert r["clips"] == r["distinct"] == n
    assert r["clips_s"] > 0 and r["mb_read"] >= 0


def test_closing_a_store_lets_go_of_its_shards_and_it_reads_again(raw_root):  # noqa: F811
    store = open_clips(raw_root)
    first = store.get(0).clip.copy()
    path = store.shard_paths[int(store.refs([0])[0][0])]
    HANDLES.forget(path)  # so that this store's reader is the one that opens the handle
    store.close()
    assert np.array_equal(store.get(0).clip, first) and HANDLES.holds(path)
    store.close()
    assert not HANDLES.holds(path)
    assert np.array_equal(store.get(0).clip, first)  # reopened on next use
