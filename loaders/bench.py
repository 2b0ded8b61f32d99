"""``python -m loaders.bench``: clips/s of every reader on the same synthetic clips, in one run.

Builds (or reuses, under ``--root``) synthetic videos and their raw, lz4 and
jpeg conversions on both backends, then times with 0, 1 and 2 workers, at
one batch size, random 112 crops of 16-frame clips:

  on-the-fly   OnTheFlyVideoDataset: PyAV decode in __getitem__ (the baseline)
  lmdb raw/lz4/jpeg   LmdbClipDataset on each codec's LMDB shards
  read+copy    every raw value read from LMDB and copied into a batch buffer,
               nothing else: the bound for any reader of these shards
  dali native raw/jpeg   DaliTFRecordLoader on the TFRecord shards: DALI's own
               reader, decoder and crop on DALI's CPU backend (here "workers"
               are DALI's CPU threads, at least 1; each epoch's first batch,
               which builds the epoch's pipeline and fills its shuffle buffer,
               is not timed)
  tfrecord-pkg raw/jpeg  the ``tfrecord`` package's reader over the same
               record files in DataLoader workers (files split between them),
               decoded and cropped per clip in Python: TFRecord without DALI

then a table of bytes on disk per clip for every backend and codec against
the source videos' bytes. The first batch of a configuration (worker start
up) is not timed. The shards were just written, so they sit in the page
cache: this measures CPU cost, not disk. Nothing is asserted; the tables are
the output.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Sequence

from typing import Callable, Iterable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from .clipstore import open_clips
from .dataset import LmdbClipDataset, _batch_array
from .factory import build_loader
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

    def __getitems__(self, items: Sequence[Any]) -> dict:
        indices = [it[1] if isinstance(it, tuple) else it for it in items]
        buf = _batch_array((len(indices), self.slot))
        arr = buf.numpy()
        sizes = np.zeros(len(indices), dtype=np.int64)

        def copy(pos: int, header, payload: memoryview) -> None:
            n = len(payload)
            arr[pos, :n] = np.frombuffer(payload, dtype=np.uint8)
            sizes[pos] = n

        self.store.visit(indices, copy)
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
                yield {"clip": torch.from_numpy(apply(frames, dataclasses.replace(p, t0=0))),
                       "label": int(rec["label"][0]), "video_id": bytes(rec["video_id"]).decode("utf-8"),
                       "clip_index": int(rec["clip_index"][0]), "k": k}
                k += 1


def _as_is(batch: Any) -> Any:
    return batch


def build_data(root: str, videos: int, workers: int) -> dict[str, str]:
    """Synthetic videos under root/videos and one conversion per backend and codec; reused when present.

    Keys: ``videos``, the codec names (LMDB) and ``tfrecord_<codec>``.
    """
    from convert.job import JobOptions, run_job
    from convert.plan import ConvertConfig
    from convert.synth import make_dataset

    src = os.path.join(root, "videos")
    make_dataset(src, per_class=max(1, math.ceil(videos / N_CLASSES)), seconds=2.0, seed=0)
    outs = {"videos": src}
    for backend in BACKENDS:
        for codec in CODECS:
            name = codec if backend == "lmdb" else f"{backend}_{codec}"
            out = os.path.join(root, f"clips_{name}")
            run_job(src, out, ConvertConfig(backend=backend, codec=codec),
                    JobOptions(workers=workers, progress=False))
            outs[name] = out
    return outs


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
            nbytes += batch.get("bytes", batch["clip"].numel())
            elapsed = done + now - start
            if elapsed >= seconds:
                return {"clips_s": clips / elapsed, "mb_s": nbytes / elapsed / 1e6, "clips": clips}
        if not batches:
            raise ValueError(f"epoch {epoch} gave no batch: fewer clips than one batch (use more --videos)")
        epoch += 1
        if untimed_each_epoch and start is not None:
            done, start = done + time.perf_counter() - start, None


def measure(dataset: Dataset, *, batch_size: int, workers: int, seconds: float, start_method: str | None,
            collate_fn: Any = None) -> dict:
    """clips and bytes per second through build_loader, after one warm-up batch."""
    kw = {"collate_fn": collate_fn} if collate_fn is not None else {}
    loader = build_loader(dataset, batch_size=batch_size, workers=workers, pin_memory=False,
                          prefetch_factor=2, start_method=start_method, drop_last=True, **kw)

    def epoch_batches(epoch: int) -> DataLoader:
        loader.sampler.set_epoch(epoch)
        return loader

    try:
        return timed(epoch_batches, seconds)
    finally:
        del loader


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

    try:
        return timed(epoch_batches, seconds)
    finally:
        del loader


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
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    print(f"data: {root} ({args.videos} synthetic videos; building or reusing shards)", flush=True)
    t = time.perf_counter()
    paths = build_data(root, args.videos, cpus)
    n_clips = len(open_clips(paths["raw"]))
    print(f"built in {time.perf_counter() - t:.1f} s: {n_clips} clips of 16x128x171x3 per codec and backend; "
          f"batch {args.batch_size}, {args.seconds:g} s per configuration, torch {torch.__version__}, "
          f"{cpus} CPUs, start method {args.start_method or 'default'}", flush=True)
    bs, secs, sm = args.batch_size, args.seconds, args.start_method

    def mapped(make: Callable[[], Dataset], collate_fn: Any = None) -> Callable[[int], dict]:
        return lambda w: measure(make(), batch_size=bs, workers=w, seconds=secs, start_method=sm,
                                 collate_fn=collate_fn)

    readers: list[tuple[str, Callable[[int], dict]]] = [
        ("on-the-fly PyAV", mapped(lambda: OnTheFlyVideoDataset(paths["videos"], train=True))),
        ("lmdb raw", mapped(lambda: LmdbClipDataset(paths["raw"], train=True))),
        ("lmdb lz4", mapped(lambda: LmdbClipDataset(paths["lz4"], train=True))),
        ("lmdb jpeg", mapped(lambda: LmdbClipDataset(paths["jpeg"], train=True))),
    ]
    if _dali_importable():
        for codec in ("raw", "jpeg"):  # lz4: DALI inflates on the GPU only
            root = paths[f"tfrecord_{codec}"]
            readers.append((f"dali native {codec}", lambda w, root=root: measure_dali_native(
                root, batch_size=bs, threads=max(1, w), seconds=secs)))
    else:
        print("nvidia.dali not importable: the dali native rows are skipped", flush=True)
    for codec in ("raw", "jpeg"):
        root = paths[f"tfrecord_{codec}"]
        readers.append((f"tfrecord-pkg {codec}", lambda w, root=root: measure_iterable(
            TFRecordPackageDataset(root), batch_size=bs, workers=w, seconds=secs, start_method=sm)))
    readers.append(("read+copy bound (raw)", mapped(lambda: ReadCopyDataset(paths["raw"]), _as_is)))
    results: dict[tuple[str, int], dict] = {}
    for name, run_one in readers:
        for w in args.workers:
            r = run_one(w)
            results[(name, w)] = r
            print(f"  {name:22s} workers {w}: {r['clips_s']:8.1f} clips/s", file=sys.stderr, flush=True)
    print()
    print(f"{'reader':22s} {'workers':>7s} {'clips/s':>9s} {'MB/s':>8s} {'x on-the-fly':>12s} {'of bound':>9s}")
    for name, _ in readers:
        for w in args.workers:
            r = results[(name, w)]
            base = results[(readers[0][0], w)]["clips_s"]
            bound = results[(readers[-1][0], w)]["clips_s"]
            print(f"{name:22s} {w:7d} {r['clips_s']:9.1f} {r['mb_s']:8.1f} {r['clips_s'] / base:11.1f}x "
                  f"{r['clips_s'] / bound:8.0%}")
    print("\nMB/s: uint8 bytes delivered (crops of 16x112x112x3; whole stored values for the bound). "
          "Ratios compare the same worker count; dali native: workers = DALI CPU threads (at least 1).")
    print()
    print("\n".join(disk_table(paths)))
    print("\nvalue: header + payload, equal on both backends; disk: allocated blocks of every shard file "
          "(LMDB's page and free-page overhead, TFRecord's Example framing and index files).")
    if not args.root and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def _dali_importable() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loaders.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", help="folder for the synthetic videos and shards (kept; reused next time)")
    p.add_argument("--videos", type=int, default=20, help="synthetic videos (default 20, about 3 clips each)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per configuration (default 3)")
    p.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2],
                   help="comma-separated DataLoader worker counts (default 0,1,2)")
    p.add_argument("--start-method", choices=("fork", "spawn", "forkserver"), help="worker start method")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = p.parse_args(argv)
    if args.videos < 1 or args.batch_size < 1 or args.seconds <= 0 or min(args.workers) < 0:
        p.error("--videos, --batch-size and --seconds must be positive, --workers >= 0")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
