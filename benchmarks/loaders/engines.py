"""``--sections engines``: the same threaded reads on thread-based loading libraries (why the loader is hand-written).

``build_loader(threads=N)`` against ``torchdata.nodes`` and SPDL (each where
installed), every codec's LMDB shards, one thread per core.
"""

from __future__ import annotations

import argparse
import queue
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from loaders import ClipDataset, DistributedClipSampler, build_loader
from loaders.dataset import collate

from .common import CODECS


class _Ring:
    """Batch slots for a library's thread pool: a reader takes a free one, the consumer gives it back."""

    def __init__(self, dataset: Any, batch_size: int, slots: int) -> None:
        self.dataset = dataset
        self.free: queue.Queue = queue.Queue()
        for _ in range(slots):
            self.free.put({k: np.empty((batch_size, *shape), dtype=torch.empty((), dtype=dt).numpy().dtype)
                           for k, (shape, dt) in dataset.batch_fields().items()})

    def read(self, items: list) -> tuple[dict, int]:
        """Fill a free slot with the clips of ``items``; (the slot, its clip count)."""
        # A timeout, not a hang, if the library ever held more batches than the ring has slots.
        slot = self.free.get(timeout=60)
        self.dataset.read_into(items, slot)
        return slot, len(items)


def _epochs(sampler: DistributedClipSampler, batch_size: int) -> Iterator[list]:
    """Batches of items, epoch after epoch (the libraries' source)."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        items = list(sampler)
        for k in range(0, len(items) - batch_size + 1, batch_size):
            yield items[k:k + batch_size]
        epoch += 1


def _time(batches: Iterable[Any], ring: _Ring | None, seconds: float) -> float:
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

        def forever() -> Iterator[dict]:
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

        assert ring is not None  # every engine but "torchdata fresh" has one
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
                    r = engine_rate(engine, ClipDataset(paths[codec], train=True), batch_size=args.batch_size,
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


__all__ = ["ENGINES", "engine_rate", "engine_table"]
