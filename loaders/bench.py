"""``python -m loaders.bench``: clips/s of every reader on the same synthetic clips, in one run.

Builds (or reuses, under ``--root``) synthetic videos and their raw, lz4 and
jpeg conversions, then times through ``build_loader`` with 0, 1 and 2
DataLoader workers and with 1, 2 and one-per-core reader threads
(``threads=N``), at one batch size; ``--sections engines`` adds the threaded
reads on torchdata.nodes and SPDL against the hand-written pool:

  on-the-fly   OnTheFlyVideoDataset: PyAV decode in __getitem__ (the baseline)
  lmdb raw/lz4/jpeg   LmdbClipDataset on each codec's shards
  read+copy    every raw value read from LMDB and copied into a batch buffer,
               nothing else: the bound for any reader of these shards

Each configuration runs for ``--seconds`` after its first batch (worker start
up is not timed), ``--rounds`` times, interleaved; the best run is kept. The shards were just written, so they sit in the page
cache: this measures CPU cost, not disk. Nothing is asserted; the table is
the output.
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
from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .clipstore import open_clips
from .dataset import LmdbClipDataset, _batch_array, collate
from .factory import build_loader
from .sampler import DistributedClipSampler
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
            collate_fn: Any = None, threads: int | None = None) -> dict:
    """clips and bytes per second through build_loader, after one warm-up batch (``threads``: reader threads)."""
    if threads is not None:
        loader = build_loader(dataset, batch_size=batch_size, threads=threads, pin_memory=False, drop_last=True)
    else:
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
                nbytes += int(torch.as_tensor(batch["bytes"]).sum()) if "bytes" in batch else batch["clip"].numel()
                if time.perf_counter() - t0 >= seconds:
                    elapsed = time.perf_counter() - t0
                    return {"clips_s": clips / elapsed, "mb_s": nbytes / elapsed / 1e6, "clips": clips}
            epoch += 1
    finally:
        if threads is not None:
            loader.close()
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
    # Every configuration once per round, rounds interleaved, the best kept: on a shared machine
    # other work only ever slows a configuration down.
    configs = [(name, "workers", w) for name, _, _ in readers for w in args.workers] \
        if "dataloader" in args.sections else []
    if "threads" in args.sections:
        configs += [(name, "threads", n) for name, _, _ in readers[1:] for n in thread_counts(args.thread_counts, cpus)]
    makers = {name: (make, collate_fn) for name, make, collate_fn in readers}
    results: dict[tuple[str, int], dict] = {}
    threaded: dict[tuple[str, int], dict] = {}
    for _ in range(args.rounds):
        for name, kind, n in configs:
            make, collate_fn = makers[name]
            r = measure(make(), batch_size=args.batch_size, workers=n if kind == "workers" else 0,
                        seconds=args.seconds, start_method=args.start_method, collate_fn=collate_fn,
                        threads=n if kind == "threads" else None)
            into = results if kind == "workers" else threaded
            if (name, n) not in into or r["clips_s"] > into[(name, n)]["clips_s"]:
                into[(name, n)] = r
            print(f"  {name:22s} {kind} {n}: {r['clips_s']:8.1f} clips/s", file=sys.stderr, flush=True)
    if "dataloader" in args.sections:
        dataloader_table(readers, results, args)
    if "threads" in args.sections:
        thread_table(readers[1:], threaded, results, args, cpus)
    if "engines" in args.sections:
        engine_table(paths, args, cpus)
    if not args.root and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def dataloader_table(readers: list, results: dict[tuple[str, int], dict], args: argparse.Namespace) -> None:
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


# -- reader threads in the training process (ThreadedClipLoader) ---------------
def thread_counts(requested: list[int] | None, cpus: int) -> list[int]:
    """1 and 2 threads and one per core, unless given."""
    return sorted(set(requested or (1, 2, cpus)))


def thread_table(readers: list, results: dict[tuple[str, int], dict], dataloader: dict[tuple[str, int], dict],
                 args: argparse.Namespace, cpus: int) -> None:
    """Each reader through ``build_loader(threads=N)``, against DataLoader workers and the in-process bound."""
    counts = thread_counts(args.thread_counts, cpus)
    bound_name = readers[-1][0]
    in_process = dataloader.get((bound_name, 0), {}).get("clips_s")
    print("\nReader threads in the training process (build_loader(threads=N)):")
    print(f"{'reader':22s} {'threads':>7s} {'clips/s':>9s} {'MB/s':>8s} {'x 1 thread':>10s} "
          f"{'x DataLoader':>12s} {'of bound':>9s}")
    for name, _, _ in readers:
        for n in counts:
            r = results[(name, n)]
            one = results[(name, counts[0])]["clips_s"]
            dl = dataloader.get((name, n))
            vs_dl = f"{r['clips_s'] / dl['clips_s']:11.1f}x" if dl else f"{'-':>12s}"
            of_bound = f"{r['clips_s'] / in_process:8.0%}" if in_process else f"{'-':>9s}"
            print(f"{name:22s} {n:7d} {r['clips_s']:9.1f} {r['mb_s']:8.1f} "
                  f"{r['clips_s'] / one:9.2f}x {vs_dl} {of_bound}")
    print("x DataLoader: against as many worker processes as threads; of bound: against the read+copy bound "
          "in one process (0 workers).")


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
                        "hand-written pool); default dataloader,threads")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure every configuration this many times, rounds interleaved, and keep the best "
                        "(default 1; use 3 or more on a shared machine)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = p.parse_args(argv)
    if args.videos < 1 or args.batch_size < 1 or args.seconds <= 0 or args.rounds < 1 or min(args.workers) < 0:
        p.error("--videos, --batch-size, --seconds and --rounds must be positive, --workers >= 0")
    unknown = set(args.sections) - {"dataloader", "threads", "engines"}
    if unknown:
        p.error(f"--sections: unknown {', '.join(sorted(unknown))}; choose from dataloader, threads, engines")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
