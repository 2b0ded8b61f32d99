"""``python -m loaders.bench``: clips/s of every reader on the same synthetic clips, in one run.

Builds (or reuses, under ``--root``) synthetic videos and their raw, lz4 and
jpeg conversions on both backends, then times random 112 crops of 16-frame
clips at one batch size: through ``build_loader`` with 0, 1 and 2 DataLoader
workers and with 1, 2 and one-per-core reader threads (``threads=N``);
``--sections engines`` adds the threaded reads on torchdata.nodes and SPDL
against the hand-written pool:

  on-the-fly   OnTheFlyVideoDataset: PyAV decode in __getitem__ (the baseline)
  lmdb raw/lz4/jpeg   ClipDataset on each codec's LMDB shards
  dali native raw/jpeg   DaliTFRecordLoader on the TFRecord shards: DALI's own
               reader, decoder and crop on DALI's CPU backend (here "workers"
               are DALI's CPU threads, at least 1; each epoch's first batch,
               which builds the epoch's pipeline and fills its shuffle buffer,
               is not timed)
  tfrecord-pkg raw/jpeg  the ``tfrecord`` package's reader over the same
               record files in DataLoader workers (files split between them),
               decoded and cropped per clip in Python: TFRecord without DALI
  read+copy    every raw payload read from LMDB and copied into a batch buffer,
               nothing else: the bound for any reader of these shards

then a table of bytes on disk per clip for every backend and codec against
the source videos' bytes. Each configuration runs for ``--seconds`` after its
first batch (worker start-up is not timed), ``--rounds`` times, interleaved;
the best run is kept. The shards were just written, so they sit in the page
cache: this measures CPU cost, not disk. ``--sections cold`` reads every
clip once from shards dropped from the page cache first, against the same
reads warm, and LMDB with the kernel's read-around off (what the readers did
before). ``--sections smallcache`` reads every clip once through a page cache
smaller than the shards (a memory cgroup; needs root), in the sampler's random
order against its block-shuffled order (``order="blocks"``). Nothing is
asserted; the tables are the output.
"""

from __future__ import annotations

import argparse
import math
import os
import queue
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from convert.system import cpu_count

from .clipstore import open_clips
from .dataset import LmdbClipDataset, _batch_array, collate
from .factory import build_loader
from .sampler import DistributedClipSampler
from .onthefly import OnTheFlyVideoDataset
from .presets import ClipPreset

CODECS = ("raw", "lz4", "jpeg")
BACKENDS = ("lmdb", "tfrecord")
N_CLASSES = 5  # convert.synth makes five motion classes


class ReadCopyDataset(Dataset):
    """The bound: read each payload of a batch from the shards, copy it into one buffer, return that."""

    def __init__(self, root: str) -> None:
        self.store = open_clips(root)
        self.slot = math.prod(self.store.manifest["clip_shape"])

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, item: Any) -> dict:
        return self.__getitems__([item])

    def batch_fields(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"clip": ((self.slot,), torch.uint8), "bytes": ((), torch.int64)}

    def read_into(self, items: Sequence[Any], out: dict[str, np.ndarray]) -> dict[str, list]:
        """Copy each payload into its row of ``out["clip"]`` (the threaded loader calls this directly)."""
        indices = [it[1] if isinstance(it, tuple) else it for it in items]
        arr, sizes = out["clip"], out["bytes"]

        def copy(pos: int, header, payload: memoryview) -> None:
            n = len(payload)
            arr[pos, :n] = np.frombuffer(payload, dtype=np.uint8)
            sizes[pos] = n

        self.store.visit(indices, copy)
        return {}

    def __getitems__(self, items: Sequence[Any]) -> dict:
        buf = _batch_array((len(items), self.slot))
        sizes = np.zeros(len(items), dtype=np.int64)
        self.read_into(items, {"clip": buf.numpy(), "bytes": sizes})
        return {"clip": buf, "bytes": int(sizes.sum())}


class TFRecordPackageDataset(IterableDataset):
    """A TFRecord conversion through the ``tfrecord`` package's reader, as PyTorch code reads TFRecords without DALI.

    Each DataLoader worker reads its share of the record files in order; each
    record's payload is decoded (the codec's window) and cropped by the
    training preset, keyed by (epoch, k) for the worker's k-th record, per
    clip in Python.
    """

    def __init__(self, root: str, *, crop_size: int = 112) -> None:
        store = open_clips(root)
        self.codec = store.codec
        self.preset = ClipPreset(train=True, crop_size=crop_size)
        self.files = [(os.path.join(store.root, s["path"], f["path"]), os.path.join(store.root, s["path"], f["index"]))
                      for s in store.manifest["shards"] for f in s.get("files", [])]
        self.epoch = 0

    def __iter__(self):
        from tfrecord.reader import tfrecord_loader

        from .presets import apply

        info = get_worker_info()
        files = self.files if info is None else self.files[info.id::info.num_workers]
        k = 0
        for data, index in files:
            for rec in tfrecord_loader(data, index, {"payload": "byte", "shape": "int", "label": "int",
                                                      "video_id": "byte", "clip_index": "int"}):
                shape = tuple(int(v) for v in rec["shape"])
                p = self.preset.params(self.epoch, k, shape)
                frames = self.codec.window(rec["payload"], shape, p.t0, p.t)
                yield {"clip": torch.from_numpy(apply(frames, p, first=p.t0)),
                       "label": int(rec["label"][0]), "video_id": bytes(rec["video_id"]).decode("utf-8"),
                       "clip_index": int(rec["clip_index"][0]), "k": k}
                k += 1


def _as_is(batch: Any) -> Any:
    return batch


def build_data(root: str, videos: int, workers: int) -> dict[str, str]:
    """Synthetic videos under root/videos and one conversion per backend and codec; reused when present.

    Keys: ``videos``, the codec names (LMDB) and ``tfrecord_<codec>``.
    """
    from convert.plan import ConvertConfig
    from convert.synth import synthetic_conversions

    configs = {codec if backend == "lmdb" else f"{backend}_{codec}": ConvertConfig(backend=backend, codec=codec)
               for backend in BACKENDS for codec in CODECS}
    return synthetic_conversions(root, configs, per_class=max(1, math.ceil(videos / N_CLASSES)), seconds=2.0,
                                 workers=workers)


def timed(epoch_batches: Callable[[int], Iterable[dict]], seconds: float, *, untimed_each_epoch: bool = False) -> dict:
    """clips/s and MB/s over the batches of epochs 0, 1, ... until ``seconds`` have been timed.

    The first batch (worker start-up) is not timed; with
    ``untimed_each_epoch`` neither is the first batch of every later epoch.
    ``MB/s`` counts ``batch["bytes"]`` where a batch has it, else the clips'
    bytes.
    """
    clips = nbytes = 0
    done, start, epoch = 0.0, None, 0
    while True:
        batches = 0
        for batches, batch in enumerate(epoch_batches(epoch), 1):
            now = time.perf_counter()
            if start is None:
                start = now
                continue
            clips += batch["clip"].shape[0]
            nbytes += int(torch.as_tensor(batch["bytes"]).sum()) if "bytes" in batch else batch["clip"].numel()
            elapsed = done + now - start
            if elapsed >= seconds:
                return {"clips_s": clips / elapsed, "mb_s": nbytes / elapsed / 1e6, "clips": clips}
        if not batches:
            raise ValueError(f"epoch {epoch} gave no batch: fewer clips than one batch (use more --videos)")
        epoch += 1
        if untimed_each_epoch and start is not None:
            done, start = done + time.perf_counter() - start, None


# Draws per clip in one timed epoch. A training epoch is thousands of batches; the benchmark's few
# clips would make an epoch of 8 batches, and its start and end (the pipeline filling and draining)
# would weigh as they never do in training: two reader threads lost 6-8% of their rate to it.
EPOCH_DRAWS = 16


def steady_sampler(n: int) -> DistributedClipSampler:
    """Epochs of ``EPOCH_DRAWS * n`` uniform draws with replacement over ``n`` items, from the one sampler."""
    return DistributedClipSampler(np.zeros(n, dtype=np.int64), num_replicas=1, rank=0, seed=0, balanced=True,
                                  epoch_size=EPOCH_DRAWS * n)


def measure(dataset: Dataset, *, batch_size: int, workers: int, seconds: float, start_method: str | None,
            collate_fn: Any = None, threads: int | None = None) -> dict:
    """clips and bytes per second through build_loader, after one warm-up batch (``threads``: reader threads).

    Epochs are ``EPOCH_DRAWS`` draws per clip (``steady_sampler``), so the rate is the steady one.
    """
    sampler = steady_sampler(len(dataset))
    if threads is not None:
        loader = build_loader(dataset, batch_size=batch_size, threads=threads, pin_memory=False, drop_last=True,
                              sampler=sampler)
    else:
        kw = {"collate_fn": collate_fn} if collate_fn is not None else {}
        loader = build_loader(dataset, batch_size=batch_size, workers=workers, pin_memory=False,
                              prefetch_factor=2, start_method=start_method, drop_last=True, sampler=sampler, **kw)

    def epoch_batches(epoch: int):
        loader.sampler.set_epoch(epoch)
        return loader

    try:
        return timed(epoch_batches, seconds)
    finally:
        if threads is not None:
            loader.close()


def measure_iterable(dataset: IterableDataset, *, batch_size: int, workers: int, seconds: float,
                     start_method: str | None) -> dict:
    """clips and bytes per second of an iterable dataset through a plain DataLoader."""
    kw = {"prefetch_factor": 2, "persistent_workers": True} if workers else {}
    if workers and start_method:
        kw["multiprocessing_context"] = start_method
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, drop_last=True, **kw)

    def epoch_batches(epoch: int) -> DataLoader:
        dataset.epoch = epoch  # seen by workers started after this (persistent ones keep epoch 0's crops)
        return loader

    return timed(epoch_batches, seconds)


def measure_dali_native(root: str, *, batch_size: int, threads: int, seconds: float, crop_size: int = 112) -> dict:
    """clips and bytes per second of ``DaliTFRecordLoader`` (training crops, uint8).

    Each epoch's first batch (its pipeline's build and shuffle-buffer fill) is not timed.
    """
    from .dali_native import DaliTFRecordLoader

    preset = ClipPreset(train=True, crop_size=crop_size)
    with DaliTFRecordLoader(root, train=True, batch_size=batch_size, threads=threads, preset=preset) as loader:
        def epoch_batches(epoch: int) -> DaliTFRecordLoader:
            loader.set_epoch(epoch)
            return loader

        return timed(epoch_batches, seconds, untimed_each_epoch=True)


def _allocated(path: str) -> int:
    """Bytes the files under ``path`` occupy on disk (allocated blocks: LMDB's map file is sparse)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            total += os.stat(os.path.join(folder, name)).st_blocks * 512
    return total


def disk_table(paths: dict[str, str]) -> list[str]:
    """Lines of a table: bytes per clip of every backend and codec, against the source videos' bytes per clip."""
    src = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(paths["videos"]) for f in fs)
    lines = [f"{'backend':9s} {'codec':5s} {'clips':>6s} {'value B/clip':>13s} {'disk B/clip':>12s} "
             f"{'x source':>9s} {'x raw':>7s}"]
    raw_disk = None
    for backend in BACKENDS:
        for codec in CODECS:
            root = paths[codec if backend == "lmdb" else f"{backend}_{codec}"]
            manifest = open_clips(root).manifest
            clips = manifest["totals"]["clips"]
            disk = _allocated(os.path.join(root, "shards")) / clips
            raw_disk = disk if codec == "raw" else raw_disk
            lines.append(f"{backend:9s} {codec:5s} {clips:6d} {manifest['totals']['value_bytes'] / clips:13,.0f} "
                         f"{disk:12,.0f} {disk / (src / clips):8.1f}x {disk / raw_disk:6.2f}x")
    clips = open_clips(paths["raw"]).manifest["totals"]["clips"]
    lines.append(f"{'source':9s} {'h264':5s} {clips:6d} {'':>13s} {src / clips:12,.0f} {1.0:8.1f}x")
    return lines


def run(args: argparse.Namespace) -> int:
    root = args.root or tempfile.mkdtemp(prefix="loaders-bench-")
    cpus = cpu_count()
    print(f"data: {root} ({args.videos} synthetic videos; building or reusing shards)", flush=True)
    t = time.perf_counter()
    paths = build_data(root, args.videos, cpus)
    n_clips = len(open_clips(paths["raw"]))
    print(f"built in {time.perf_counter() - t:.1f} s: {n_clips} clips of 16x128x171x3 per codec and backend; "
          f"batch {args.batch_size}, {args.seconds:g} s per configuration, torch {torch.__version__}, "
          f"{cpus} CPUs, start method {args.start_method or 'default'}", flush=True)
    bs, secs, sm = args.batch_size, args.seconds, args.start_method
    # (name, Dataset maker, collate_fn): read through build_loader, by DataLoader workers or reader threads.
    datasets = {
        "on-the-fly PyAV": (lambda: OnTheFlyVideoDataset(paths["videos"], train=True), None),
        "lmdb raw": (lambda: LmdbClipDataset(paths["raw"], train=True), None),
        "lmdb lz4": (lambda: LmdbClipDataset(paths["lz4"], train=True), None),
        "lmdb jpeg": (lambda: LmdbClipDataset(paths["jpeg"], train=True), None),
        "read+copy bound (raw)": (lambda: ReadCopyDataset(paths["raw"]), _as_is),
    }
    # Readers with their own loop, timed per worker count only (no threaded variant).
    others: dict[str, Callable[[int], dict]] = {}
    if "dataloader" in args.sections and _dali_importable():
        for codec in ("raw", "jpeg"):  # lz4: DALI inflates on the GPU only
            others[f"dali native {codec}"] = lambda w, r=paths[f"tfrecord_{codec}"]: measure_dali_native(
                r, batch_size=bs, threads=max(1, w), seconds=secs)
    elif "dataloader" in args.sections:
        print("nvidia.dali not importable: the dali native rows are skipped", flush=True)
    if "dataloader" in args.sections:
        for codec in ("raw", "jpeg"):
            others[f"tfrecord-pkg {codec}"] = lambda w, r=paths[f"tfrecord_{codec}"]: measure_iterable(
                TFRecordPackageDataset(r), batch_size=bs, workers=w, seconds=secs, start_method=sm)
    names = list(datasets)[:-1] + list(others) + list(datasets)[-1:]  # the bound last
    # Every configuration once per round, rounds interleaved, the best kept: on a shared machine
    # other work only ever slows a configuration down.
    configs = [(name, "workers", w) for name in names for w in args.workers] if "dataloader" in args.sections else []
    threaded_names = [n for n in datasets if n != "on-the-fly PyAV"]
    if "threads" in args.sections:
        configs += [(name, "threads", n) for name in threaded_names for n in thread_counts(args.thread_counts, cpus)]
    results: dict[tuple[str, int], dict] = {}
    threaded: dict[tuple[str, int], dict] = {}
    # Every round's rate of every configuration, for ratios taken within one round (the machine's
    # state moves between rounds; a ratio of two bests may pair a good moment with a bad one).
    rounds: list[dict[tuple[str, str, int], float]] = []
    for _ in range(args.rounds):
        rounds.append({})
        for name, kind, n in configs:
            if name in others:
                r = others[name](n)
            else:
                make, collate_fn = datasets[name]
                r = measure(make(), batch_size=bs, workers=n if kind == "workers" else 0, seconds=secs,
                            start_method=sm, collate_fn=collate_fn, threads=n if kind == "threads" else None)
            into = results if kind == "workers" else threaded
            rounds[-1][(kind, name, n)] = r["clips_s"]
            if (name, n) not in into or r["clips_s"] > into[(name, n)]["clips_s"]:
                into[(name, n)] = r
            print(f"  {name:22s} {kind} {n}: {r['clips_s']:8.1f} clips/s", file=sys.stderr, flush=True)
    if "dataloader" in args.sections:
        dataloader_table(names, results, args)
        print()
        print("\n".join(disk_table(paths)))
        print("\nvalue: header + payload, equal on both backends; disk: allocated blocks of every shard file "
              "(LMDB's page and free-page overhead, TFRecord's Example framing and index files).")
    if "threads" in args.sections:
        thread_table(threaded_names, threaded, results, args, cpus, rounds)
    if "engines" in args.sections:
        engine_table(paths, args, cpus)
    if "cold" in args.sections:
        cold_table(paths, args)
    if "smallcache" in args.sections:
        small_cache_table(paths, args)
    if not args.root and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


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


def _data_files(root: str) -> list[str]:
    """Every file a reader of the conversion at ``root`` maps: LMDB data files, TFRecord record files."""
    return [os.path.join(d, f) for d, _, names in os.walk(os.path.join(root, "shards")) for f in names
            if f == "data.mdb" or f.endswith(".tfrecord")]


def _io_read_bytes() -> int:
    """Bytes this process has had read from storage (``/proc/self/io``; page faults' read-ahead included)."""
    with open("/proc/self/io") as fh:
        for line in fh:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    raise OSError("/proc/self/io has no read_bytes")


def cold_read(root: str, *, cold: bool = True, order: str = "random", block: int = 64, window: int = 16,
              join: str | None = None) -> dict:
    """Every clip of the conversion at ``root`` read and decoded once, one thread, in epoch 0's order of
    ``DistributedClipSampler(order=...)`` (a training epoch's access pattern), from a freshly opened store.

    ``cold`` drops the shard files from the page cache first; otherwise one
    untimed pass loads them. ``join``: a cgroup's ``cgroup.procs``, joined
    after the drop (so only what is read is charged to it). Returns clips/s,
    major page faults and MB read from storage per clip, and the clips read.
    """
    import resource

    from convert.format.lmdb import HANDLES

    def close_all(store) -> None:
        store.close()
        for path in store.shard_paths:  # handles an earlier section opened too: unmapped, reopened afresh
            HANDLES.forget(path)

    store = open_clips(root)
    storage = store.storage_order() if order == "blocks" else None
    indices = list(DistributedClipSampler(len(store), num_replicas=1, rank=0, seed=0, with_epoch=False,
                                          order=order, storage_order=storage, block=block, window=window))
    if cold:
        close_all(store)
        if not drop_from_page_cache(_data_files(root)):
            print(f"  {root}: could not drop every page from the cache; the cold row is partly warm",
                  file=sys.stderr, flush=True)
        if join:
            with open(join, "w") as fh:
                fh.write(str(os.getpid()))
        store = open_clips(root)
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
    close_all(store)
    n = len(indices)
    return {"clips_s": n / elapsed, "faults": faults / n, "mb_read": read / n / 1e6, "clips": n,
            "distinct": len(set(indices))}


def cold_table(paths: dict[str, str], args: argparse.Namespace) -> None:
    """Warm against cold reads per conversion, and LMDB with the kernel's read-around off (readers before it)."""
    import convert.format.lmdb as lmdb_format

    rows = [(f"lmdb {c}", paths[c], True) for c in ("raw", "lz4")]
    rows += [(f"lmdb {c}, read-around off", paths[c], False) for c in ("raw", "lz4")]
    rows += [(f"tfrecord {c}", paths[f"tfrecord_{c}"], True) for c in ("raw", "lz4")]
    best: dict[tuple[str, bool], dict] = {}
    for _ in range(args.rounds):
        for name, root, around in rows:
            for cold in (False, True):
                lmdb_format.READ_AROUND = around
                try:
                    r = cold_read(root, cold=cold)
                finally:
                    lmdb_format.READ_AROUND = True
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


class MemoryCgroup:
    """A memory cgroup of its own, limited to ``limit`` bytes (page cache included), removed on exit.

    What a page cache smaller than the shards looks like, on a machine with
    memory to spare: a process that joins it keeps at most ``limit`` bytes of
    what it reads in memory. cgroup v2 (``memory.max``) or v1
    (``memory.limit_in_bytes``); needs root. ``procs``: the file a process
    writes its pid to, to join.
    """

    def __init__(self, limit: int) -> None:
        name = f"videoclips-bench-{os.getpid()}"
        v2, v1 = "/sys/fs/cgroup", "/sys/fs/cgroup/memory"
        try:
            with open(os.path.join(v2, "cgroup.controllers")) as fh:
                unified = "memory" in fh.read().split()
        except OSError:
            unified = False
        if unified:
            with open(os.path.join(v2, "cgroup.subtree_control"), "w") as fh:
                fh.write("+memory")
            self.path, limit_file = os.path.join(v2, name), "memory.max"
        elif os.path.exists(os.path.join(v1, "memory.limit_in_bytes")):
            self.path, limit_file = os.path.join(v1, name), "memory.limit_in_bytes"
        else:
            raise OSError("no memory cgroup controller (cgroup v2 memory or v1 memory) is mounted")
        os.mkdir(self.path)
        try:
            with open(os.path.join(self.path, limit_file), "w") as fh:
                fh.write(str(int(limit)))
        except OSError:
            os.rmdir(self.path)
            raise
        self.procs = os.path.join(self.path, "cgroup.procs")

    def __enter__(self) -> "MemoryCgroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        for _ in range(50):  # the kernel frees a cgroup whose last process just exited a moment later
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def small_cache_table(paths: dict[str, str], args: argparse.Namespace) -> None:
    """Reads through a page cache smaller than the shards: the sampler's random order against its block order."""
    import json
    import subprocess

    rows = [("lmdb raw", paths["raw"]), ("lmdb lz4", paths["lz4"]), ("tfrecord raw", paths["tfrecord_raw"])]
    best: dict[tuple[str, str], dict] = {}
    settings: dict[str, tuple[int, int, int]] = {}
    for name, root in rows:
        shard_bytes = sum(os.path.getsize(f) for f in _data_files(root))
        clips = len(open_clips(root))
        cache = int(shard_bytes * args.cache_fraction)
        per_clip = shard_bytes / clips
        # Blocks whose window fills half the cache: the rest is for read-ahead past the window's edges.
        cache_clips = max(1, int(cache / per_clip))
        block = max(1, min(64, cache_clips // 8))
        settings[name] = (cache, block, max(1, cache_clips // (2 * block)))
    for _ in range(args.rounds):
        for name, root in rows:
            cache, block, window = settings[name]
            for order in ("random", "blocks"):
                try:
                    with MemoryCgroup(cache) as group:
                        out = subprocess.run(
                            [sys.executable, "-m", "loaders.bench", "--read-child",
                             json.dumps([root, order, block, window, group.procs])],
                            check=True, capture_output=True, text=True)
                except (OSError, subprocess.CalledProcessError) as exc:
                    detail = getattr(exc, "stderr", "") or ""
                    print(f"\nsmall page cache: skipped ({exc}{': ' + detail.strip().splitlines()[-1] if detail else ''}"
                          f"); it needs root and a memory cgroup")
                    return
                r = json.loads(out.stdout.strip().splitlines()[-1])
                if (name, order) not in best or r["clips_s"] > best[(name, order)]["clips_s"]:
                    best[(name, order)] = r
                print(f"  {name:14s} {order:6s}: {r['clips_s']:8.1f} clips/s, {r['mb_read']:.2f} MB read per clip",
                      file=sys.stderr, flush=True)
    print(f"\nshards larger than memory: every clip read and decoded once, one thread, through a page cache of "
          f"{args.cache_fraction:g} x the shards (a memory cgroup); read_ahead_kb here: {_read_ahead(paths['raw'])}")
    print(f"{'reader':14s} {'order':22s} {'clips/s':>9s} {'x random':>9s} {'MB read/clip':>13s} "
          f"{'major faults/clip':>18s}")
    for name, _ in rows:
        cache, block, window = settings[name]
        base = best[(name, "random")]["clips_s"]
        for order in ("random", "blocks"):
            r = best[(name, order)]
            label = "random" if order == "random" else f"blocks of {block} x {window}"
            print(f"{name:14s} {label:22s} {r['clips_s']:9.1f} {r['clips_s'] / base:8.2f}x {r['mb_read']:13.2f} "
                  f"{r['faults']:18.1f}")
    print(f"(cache per conversion: {', '.join(f'{n} {settings[n][0] / 1e6:.0f} MB' for n, _ in rows)}; "
          f"every clip read once in both orders)")


def _read_ahead(root: str) -> str:
    """The read_ahead_kb of the block device holding ``root`` ('?' when it cannot be read)."""
    try:
        dev = os.stat(root).st_dev
        with open(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/queue/read_ahead_kb") as fh:
            return fh.read().strip()
    except OSError:
        return "?"


def _dali_importable() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def dataloader_table(names: list[str], results: dict[tuple[str, int], dict], args: argparse.Namespace) -> None:
    """Every reader by worker count, against the on-the-fly baseline (first) and the read+copy bound (last)."""
    print()
    print(f"{'reader':22s} {'workers':>7s} {'clips/s':>9s} {'MB/s':>8s} {'x on-the-fly':>12s} {'of bound':>9s}")
    for name in names:
        for w in args.workers:
            r = results[(name, w)]
            base = results[(names[0], w)]["clips_s"]
            bound = results[(names[-1], w)]["clips_s"]
            print(f"{name:22s} {w:7d} {r['clips_s']:9.1f} {r['mb_s']:8.1f} {r['clips_s'] / base:11.1f}x "
                  f"{r['clips_s'] / bound:8.0%}")
    print("\nMB/s: uint8 bytes delivered (crops of 16x112x112x3; whole stored payloads for the bound). "
          "Ratios compare the same worker count; dali native: workers = DALI CPU threads (at least 1).")


# -- reader threads in the training process (ThreadedClipLoader) ---------------
def thread_counts(requested: list[int] | None, cpus: int) -> list[int]:
    """1 and 2 threads and one per core, unless given."""
    return sorted(set(requested or (1, 2, cpus)))


def paired(rounds: list[dict[tuple[str, str, int], float]], a: tuple[str, str, int],
           b: tuple[str, str, int]) -> float | None:
    """Median over rounds of rate ``a`` / rate ``b`` measured in the same round (None when never both)."""
    ratios = [r[a] / r[b] for r in rounds if a in r and b in r and r[b] > 0]
    return float(np.median(ratios)) if ratios else None


def thread_table(names: list[str], results: dict[tuple[str, int], dict], dataloader: dict[tuple[str, int], dict],
                 args: argparse.Namespace, cpus: int,
                 rounds: list[dict[tuple[str, str, int], float]] | None = None) -> None:
    """Each reader through ``build_loader(threads=N)``, against DataLoader workers and the in-process bound.

    The ratio columns are of the best rounds; the ``med`` columns are the
    medians of the ratios within each round (``paired``), the steadier
    figure on a noisy machine.
    """
    counts = thread_counts(args.thread_counts, cpus)
    rounds = rounds or []
    in_process = dataloader.get((names[-1], 0), {}).get("clips_s")

    def ratio(value: float | None, width: int) -> str:
        return f"{value:{width - 1}.2f}x" if value is not None else f"{'-':>{width}s}"

    print("\nReader threads in the training process (build_loader(threads=N)):")
    print(f"{'reader':22s} {'threads':>7s} {'clips/s':>9s} {'MB/s':>8s} {'x 1 thread':>10s} {'med':>6s} "
          f"{'x DataLoader':>12s} {'med':>6s} {'of bound':>9s}")
    for name in names:
        for n in counts:
            r = results[(name, n)]
            one = results[(name, counts[0])]["clips_s"]
            dl = dataloader.get((name, n))
            of_bound = f"{r['clips_s'] / in_process:8.0%}" if in_process else f"{'-':>9s}"
            print(f"{name:22s} {n:7d} {r['clips_s']:9.1f} {r['mb_s']:8.1f} {ratio(r['clips_s'] / one, 10)} "
                  f"{ratio(paired(rounds, ('threads', name, n), ('threads', name, counts[0])), 6)} "
                  f"{ratio(r['clips_s'] / dl['clips_s'] if dl else None, 12)} "
                  f"{ratio(paired(rounds, ('threads', name, n), ('workers', name, n)), 6)} {of_bound}")
    print("x DataLoader: against as many worker processes as threads; of bound: against the read+copy bound "
          "in one process (0 workers); med: median over rounds of the ratio within a round.")


# -- the same reads on thread-based loading libraries (why the loader is hand-written) --
class _Ring:
    """Batch slots for a library's thread pool: a reader takes a free one, the consumer gives it back."""

    def __init__(self, dataset: Any, batch_size: int, slots: int) -> None:
        self.dataset = dataset
        self.free: queue.Queue = queue.Queue()
        for _ in range(slots):
            self.free.put({k: np.empty((batch_size, *shape), dtype=torch.empty((), dtype=dt).numpy().dtype)
                           for k, (shape, dt) in dataset.batch_fields().items()})

    def read(self, items: list) -> tuple[dict, int]:
        # A timeout, not a hang, if the library ever held more batches than the ring has slots.
        slot = self.free.get(timeout=60)
        self.dataset.read_into(items, slot)
        return slot, len(items)


def _epochs(sampler: DistributedClipSampler, batch_size: int):
    """Batches of items, epoch after epoch (the libraries' source)."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        items = list(sampler)
        for k in range(0, len(items) - batch_size + 1, batch_size):
            yield items[k:k + batch_size]
        epoch += 1


def _time(batches, ring: _Ring | None, seconds: float) -> float:
    """clips/s over ``seconds`` after the first batch; slots go back to ``ring`` when the next one comes."""
    held = None
    clips, t0 = 0, None
    for batch in batches:
        if ring is not None:
            if held is not None:
                ring.free.put(held)
            held, n = batch
        else:
            n = batch["clip"].shape[0]
        if t0 is None:
            t0 = time.perf_counter()
            continue
        clips += n
        if time.perf_counter() - t0 >= seconds:
            return clips / (time.perf_counter() - t0)
    raise RuntimeError("the batch source ended")


def engine_rate(engine: str, dataset: Any, *, batch_size: int, threads: int, seconds: float,
                prefetch: int = 4) -> float:
    """clips/s of one engine reading ``dataset`` with ``threads`` threads.

    ``hand-written``: ``build_loader(threads=N)`` (slices of each batch across the threads, a ring of
    prefetch + 1 slots). ``torchdata``: ``torchdata.nodes`` Batcher -> ParallelMapper(method="thread")
    -> Prefetcher, each thread filling a whole batch into a slot of a ring. ``torchdata fresh``: the same
    mapping ``__getitems__`` (a new batch tensor each time, as the library is meant to be used).
    ``spdl``: SPDL's Pipeline with the thread stage at concurrency N, filling ring slots.
    """
    sampler = DistributedClipSampler(len(dataset), shuffle=True, seed=0, drop_last=True)
    if engine == "hand-written":
        loader = build_loader(dataset, batch_size=batch_size, sampler=sampler, threads=threads,
                              prefetch_factor=prefetch, pin_memory=False)

        def forever():
            epoch = 0
            while True:
                sampler.set_epoch(epoch)
                yield from loader
                epoch += 1

        try:
            return _time(forever(), None, seconds)
        finally:
            loader.close()
    # A library keeps up to 2 x threads batches in flight plus its prefetch: the ring must hold them all.
    ring = _Ring(dataset, batch_size, 2 * threads + prefetch + 4) if engine != "torchdata fresh" else None
    if engine.startswith("torchdata"):
        import torchdata.nodes as tn

        fn = ring.read if ring is not None else lambda items: collate(dataset.__getitems__(items))
        mapper = tn.ParallelMapper(tn.IterableWrapper(_epochs(sampler, batch_size)), map_fn=fn,
                                   num_workers=threads, method="thread", in_order=True)
        try:
            return _time(iter(tn.Loader(tn.Prefetcher(mapper, prefetch_factor=prefetch))), ring, seconds)
        finally:
            # Stop its threads here: left to the garbage collector, its iterator may be collected
            # in its own reading thread, which then fails to join itself.
            stop = getattr(getattr(mapper, "_it", None), "_shutdown", None)
            if stop is not None:
                stop()
    if engine == "spdl":
        from spdl.pipeline import PipelineBuilder

        pipeline = (PipelineBuilder().add_source(_epochs(sampler, batch_size))
                    .pipe(ring.read, concurrency=threads, output_order="input")
                    .add_sink(prefetch).build(num_threads=threads))
        with pipeline.auto_stop():
            return _time(pipeline.get_iterator(timeout=120), ring, seconds)
    raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")


ENGINES = ("hand-written", "torchdata", "torchdata fresh", "spdl")


def engine_table(paths: dict[str, str], args: argparse.Namespace, cpus: int) -> None:
    """Every engine on every codec, threads = one per core, rounds interleaved (best of them kept)."""
    rates: dict[tuple[str, str], float] = {}
    for _ in range(args.rounds):
        for codec in CODECS:
            for engine in ENGINES:
                try:
                    r = engine_rate(engine, LmdbClipDataset(paths[codec], train=True), batch_size=args.batch_size,
                                    threads=cpus, seconds=args.seconds)
                except ImportError as exc:
                    print(f"  {engine}: not installed ({exc})", file=sys.stderr)
                    continue
                rates[(codec, engine)] = max(r, rates.get((codec, engine), 0.0))
                print(f"  {engine:16s} lmdb {codec:5s} threads {cpus}: {r:8.1f} clips/s", file=sys.stderr, flush=True)
    print(f"\nThe same reads on thread-based loading libraries ({cpus} threads, best of {args.rounds} round(s)):")
    print(f"{'reader':10s} " + " ".join(f"{e:>16s}" for e in ENGINES))
    for codec in CODECS:
        base = rates.get((codec, ENGINES[0]))
        cells = [f"{rates[(codec, e)]:9.1f} ({rates[(codec, e)] / base:4.2f}x)" if (codec, e) in rates and base
                 else f"{'-':>16s}" for e in ENGINES]
        print(f"{'lmdb ' + codec:10s} " + " ".join(f"{c:>16s}" for c in cells))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loaders.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", help="folder for the synthetic videos and shards (kept; reused next time)")
    p.add_argument("--videos", type=int, default=20, help="synthetic videos (default 20, about 3 clips each)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per configuration (default 3)")
    p.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2],
                   help="comma-separated DataLoader worker counts (default 0,1,2)")
    p.add_argument("--start-method", choices=("fork", "spawn", "forkserver"), help="worker start method")
    p.add_argument("--thread-counts", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="comma-separated reader-thread counts (default 1,2 and one per core)")
    p.add_argument("--sections", type=lambda s: s.split(","), default=["dataloader", "threads"],
                   help="comma-separated tables: dataloader (worker processes), threads (build_loader(threads=N)), "
                        "engines (the threaded reads on torchdata.nodes and SPDL, if installed, against the "
                        "hand-written pool), cold (reads from shards dropped from the page cache first), "
                        "smallcache (reads through a page cache smaller than the shards, random against block "
                        "order; needs root); default dataloader,threads")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure every configuration this many times, rounds interleaved, and keep the best "
                        "(default 1; use 3 or more on a shared machine)")
    p.add_argument("--cache-fraction", type=float, default=0.25,
                   help="smallcache: the page cache as a fraction of each conversion's shard bytes (default 0.25)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    p.add_argument("--read-child", help=argparse.SUPPRESS)  # smallcache's reader process: JSON arguments
    args = p.parse_args(argv)
    if args.read_child:
        import json

        root, order, block, window, procs = json.loads(args.read_child)
        print(json.dumps(cold_read(root, order=order, block=block, window=window, join=procs)))
        return 0
    if args.videos < 1 or args.batch_size < 1 or args.seconds <= 0 or args.rounds < 1 or min(args.workers) < 0:
        p.error("--videos, --batch-size, --seconds and --rounds must be positive, --workers >= 0")
    unknown = set(args.sections) - {"dataloader", "threads", "engines", "cold", "smallcache"}
    if unknown:
        p.error(f"--sections: unknown {', '.join(sorted(unknown))}; choose from dataloader, threads, engines, cold, "
                f"smallcache")
    if not 0 < args.cache_fraction < 1:
        p.error("--cache-fraction must be between 0 and 1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
