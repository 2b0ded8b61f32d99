"""``python -m loaders.bench``: clips/s of every reader on the same synthetic clips, in one run.

Builds (or reuses, under ``--root``) synthetic videos and their raw, lz4 and
jpeg conversions, then times through ``build_loader`` with 0, 1 and 2
workers, at one batch size:

  on-the-fly   OnTheFlyVideoDataset: PyAV decode in __getitem__ (the baseline)
  lmdb raw/lz4/jpeg   LmdbClipDataset on each codec's shards
  read+copy    every raw value read from LMDB and copied into a batch buffer,
               nothing else: the bound for any reader of these shards

Each configuration runs for ``--seconds`` after its first batch (worker start
up is not timed). The shards were just written, so they sit in the page
cache: this measures CPU cost, not disk. Nothing is asserted; the table is
the output.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .clipstore import open_clips
from .dataset import LmdbClipDataset, _batch_array
from .factory import build_loader
from .onthefly import OnTheFlyVideoDataset

CODECS = ("raw", "lz4", "jpeg")
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


def _as_is(batch: Any) -> Any:
    return batch


def build_data(root: str, videos: int, workers: int) -> dict[str, str]:
    """Synthetic videos under root/videos and one conversion per codec; reused when present."""
    from convert.job import JobOptions, run_job
    from convert.plan import ConvertConfig
    from convert.synth import make_dataset

    src = os.path.join(root, "videos")
    make_dataset(src, per_class=max(1, math.ceil(videos / N_CLASSES)), seconds=2.0, seed=0)
    outs = {"videos": src}
    for codec in CODECS:
        out = os.path.join(root, f"clips_{codec}")
        run_job(src, out, ConvertConfig(codec=codec), JobOptions(workers=workers, progress=False))
        outs[codec] = out
    return outs


def measure(dataset: Dataset, *, batch_size: int, workers: int, seconds: float, start_method: str | None,
            collate_fn: Any = None) -> dict:
    """clips and bytes per second through build_loader, after one warm-up batch."""
    kw = {"collate_fn": collate_fn} if collate_fn is not None else {}
    loader = build_loader(dataset, batch_size=batch_size, workers=workers, pin_memory=False,
                          prefetch_factor=2, start_method=start_method, drop_last=True, **kw)
    epoch = 0
    clips = nbytes = 0
    t0 = None
    try:
        while True:
            loader.sampler.set_epoch(epoch)
            for batch in loader:
                if t0 is None:  # the first batch pays for worker start-up: not timed
                    t0 = time.perf_counter()
                    continue
                clips += batch["clip"].shape[0]
                nbytes += batch.get("bytes", batch["clip"].numel())
                if time.perf_counter() - t0 >= seconds:
                    elapsed = time.perf_counter() - t0
                    return {"clips_s": clips / elapsed, "mb_s": nbytes / elapsed / 1e6, "clips": clips}
            epoch += 1
    finally:
        del loader


def run(args: argparse.Namespace) -> int:
    root = args.root or tempfile.mkdtemp(prefix="loaders-bench-")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    print(f"data: {root} ({args.videos} synthetic videos; building or reusing shards)", flush=True)
    t = time.perf_counter()
    paths = build_data(root, args.videos, cpus)
    n_clips = len(open_clips(paths["raw"]))
    print(f"built in {time.perf_counter() - t:.1f} s: {n_clips} clips of 16x128x171x3 per codec; "
          f"batch {args.batch_size}, {args.seconds:g} s per configuration, torch {torch.__version__}, "
          f"{cpus} CPUs, start method {args.start_method or 'default'}", flush=True)
    readers = [
        ("on-the-fly PyAV", lambda: OnTheFlyVideoDataset(paths["videos"], train=True), None),
        ("lmdb raw", lambda: LmdbClipDataset(paths["raw"], train=True), None),
        ("lmdb lz4", lambda: LmdbClipDataset(paths["lz4"], train=True), None),
        ("lmdb jpeg", lambda: LmdbClipDataset(paths["jpeg"], train=True), None),
        ("read+copy bound (raw)", lambda: ReadCopyDataset(paths["raw"]), _as_is),
    ]
    results: dict[tuple[str, int], dict] = {}
    for name, make, collate_fn in readers:
        for w in args.workers:
            r = measure(make(), batch_size=args.batch_size, workers=w, seconds=args.seconds,
                        start_method=args.start_method, collate_fn=collate_fn)
            results[(name, w)] = r
            print(f"  {name:22s} workers {w}: {r['clips_s']:8.1f} clips/s", file=sys.stderr, flush=True)
    print()
    print(f"{'reader':22s} {'workers':>7s} {'clips/s':>9s} {'MB/s':>8s} {'x on-the-fly':>12s} {'of bound':>9s}")
    for name, _, _ in readers:
        for w in args.workers:
            r = results[(name, w)]
            base = results[(readers[0][0], w)]["clips_s"]
            bound = results[(readers[-1][0], w)]["clips_s"]
            print(f"{name:22s} {w:7d} {r['clips_s']:9.1f} {r['mb_s']:8.1f} {r['clips_s'] / base:11.1f}x "
                  f"{r['clips_s'] / bound:8.0%}")
    print("\nMB/s: uint8 bytes delivered (crops of 16x112x112x3; whole stored values for the bound). "
          "Ratios compare the same worker count.")
    if not args.root and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


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
