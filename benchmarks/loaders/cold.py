"""``--sections cold``: every clip read once from shards dropped from the page cache, against the same reads warm.

Also LMDB with the kernel's read-around off on its maps (what the readers did
before they left it on): those rows open the shards' process-wide handles
with ``HANDLES.get(path, read_around=False)`` before the store reads through
them, and close them after. ``cold_read`` is also the reader child of the
small-cache section (``smallcache``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from convert.format import read_manifest
from convert.format.lmdb import HANDLES
from convert.store import ClipStore, open_clips
from loaders import DistributedClipSampler

from .common import _data_files, _read_ahead


def drop_from_page_cache(files: list[str], *, attempts: int = 20) -> bool:
    """Ask the kernel to drop ``files`` from the page cache (no root needed); True once none is resident.

    POSIX_FADV_DONTNEED drops only clean pages no process maps, and may leave
    a few behind on a first call: the files are synced, then asked again
    until ``mincore`` sees none of them.
    """
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))

    def resident(path: str) -> int:
        """Pages of ``path`` in the page cache (all of them when mincore fails)."""
        size = os.path.getsize(path)
        if size == 0:
            return 0
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, prot=mmap.PROT_READ) as mm:
            view = np.frombuffer(mm, dtype=np.uint8)
            ok = libc.mincore(view.ctypes.data, size, vec)
            del view  # the map cannot close while a view exports it
        return sum(v & 1 for v in vec) if ok == 0 else pages

    for _ in range(attempts):
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        if all(resident(path) == 0 for path in files):
            return True
        time.sleep(0.05)
    return False


def _io_read_bytes() -> int:
    """Bytes this process has had read from storage (``/proc/self/io``; page faults' read-ahead included)."""
    with open("/proc/self/io") as fh:
        for line in fh:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    raise OSError("/proc/self/io has no read_bytes")


def _open_store(root: str, read_around: bool) -> ClipStore:
    """A store on ``root`` opened afresh; ``read_around=False``: through LMDB handles with the read-around off.

    The store's readers take the process-wide handle already open on each
    shard, so opening those handles first (with the read-around off) decides
    how the store's reads fault the shards in.
    """
    if not read_around:
        manifest = read_manifest(root)
        if manifest.data.backend != "lmdb":
            raise ValueError(f"{root}: read_around=False applies to LMDB shards, these are {manifest.data.backend}")
        for shard in manifest.shards:
            path = manifest.shard_path(root, shard.index)
            HANDLES.forget(path)  # a handle an earlier reader opened has the read-around on
            HANDLES.get(path, read_around=False)
    return open_clips(root)


def _close_all(store: ClipStore) -> None:
    """Close ``store`` and every process-wide handle on its shards (unmapped, reopened afresh next time)."""
    store.close()
    for path in store.shard_paths:  # handles an earlier section opened too
        HANDLES.forget(path)


def cold_read(root: str, *, cold: bool = True, order: str = "random", block: int = 64, window: int = 16,
              join: str | None = None, read_around: bool = True) -> dict:
    """Every clip of the conversion at ``root`` read and decoded once, one thread, in epoch 0's order of
    ``DistributedClipSampler(order=...)`` (a training epoch's access pattern), from a freshly opened store.

    ``cold`` drops the shard files from the page cache first; otherwise one
    untimed pass loads them. ``join``: a cgroup's ``cgroup.procs``, joined
    after the drop (so only what is read is charged to it). ``read_around``:
    False reads LMDB shards with the kernel's read-around off on their maps.
    Returns clips/s, major page faults and MB read from storage per clip, and
    the clips read.
    """
    import resource

    store = _open_store(root, read_around)
    storage = store.storage_order() if order == "blocks" else None
    indices = list(DistributedClipSampler(len(store), num_replicas=1, rank=0, seed=0, with_epoch=False,
                                          order=order, storage_order=storage, block=block, window=window))
    if cold:
        _close_all(store)
        if not drop_from_page_cache(_data_files(root)):
            print(f"  {root}: could not drop every page from the cache; the cold row is partly warm",
                  file=sys.stderr, flush=True)
        if join:
            with open(join, "w") as fh:
                fh.write(str(os.getpid()))
        store = _open_store(root, read_around)
    else:
        for i in indices:
            store.get(i)
    faults, read = resource.getrusage(resource.RUSAGE_SELF).ru_majflt, _io_read_bytes()
    t0 = time.perf_counter()
    for i in indices:
        store.get(i)
    elapsed = time.perf_counter() - t0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults
    read = _io_read_bytes() - read
    _close_all(store)  # a handle opened with the read-around off must not outlive its row
    n = len(indices)
    return {"clips_s": n / elapsed, "faults": faults / n, "mb_read": read / n / 1e6, "clips": n,
            "distinct": len(set(indices))}


def cold_table(paths: dict[str, str], args: argparse.Namespace) -> None:
    """Warm against cold reads per conversion, and LMDB with the kernel's read-around off (readers before it)."""
    rows = [(f"lmdb {c}", paths[c], True) for c in ("raw", "lz4")]
    rows += [(f"lmdb {c}, read-around off", paths[c], False) for c in ("raw", "lz4")]
    rows += [(f"tfrecord {c}", paths[f"tfrecord_{c}"], True) for c in ("raw", "lz4")]
    best: dict[tuple[str, bool], dict] = {}
    for _ in range(args.rounds):
        for name, root, around in rows:
            for cold in (False, True):
                r = cold_read(root, cold=cold, read_around=around)
                if (name, cold) not in best or r["clips_s"] > best[(name, cold)]["clips_s"]:
                    best[(name, cold)] = r
                print(f"  {name:28s} {'cold' if cold else 'warm'}: {r['clips_s']:8.1f} clips/s, "
                      f"{r['faults']:.1f} major faults per clip", file=sys.stderr, flush=True)
    ra = _read_ahead(paths["raw"])
    print(f"\nshards larger than memory: every clip read and decoded once, shuffled, one thread; warm = in the "
          f"page cache, cold = dropped from it first (read_ahead_kb here: {ra})")
    print(f"{'reader':30s} {'warm clips/s':>13s} {'cold clips/s':>13s} {'cold/warm':>10s} {'major faults/clip':>18s}")
    for name, _, _ in rows:
        w, c = best[(name, False)], best[(name, True)]
        print(f"{name:30s} {w['clips_s']:13.1f} {c['clips_s']:13.1f} {c['clips_s'] / w['clips_s']:10.3f} "
              f"{c['faults']:18.1f}")


__all__ = ["cold_read", "cold_table", "drop_from_page_cache"]
