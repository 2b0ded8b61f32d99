"""What several sections of ``python -m benchmarks.loaders`` share.

The synthetic data (``build_data``), the timing of a loader (``timed``,
``measure`` over ``steady_sampler``'s long epochs), the read+copy bound
(``ReadCopyDataset``), the readers timed through ``build_loader``
(``loader_datasets``) and the interleaved rounds that time them
(``run_rounds``): the DataLoader and reader-thread tables are measured in the
same rounds, because the threads table divides each thread rate by the
DataLoader rate of the same round (``paired``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from benchmarks.onthefly import OnTheFlyVideoDataset
from convert.store import open_clips
from loaders import ClipDataset, DistributedClipSampler, build_loader
from loaders.dataset import _batch_array

CODECS = ("raw", "lz4", "jpeg")
VIDEO_CODECS = ("h264", "vp9")  # LMDB only, read through build_loader: the CPU's video decoding in a reader
BACKENDS = ("lmdb", "tfrecord")
N_CLASSES = 5  # convert.synth makes five motion classes
ON_THE_FLY = "on-the-fly PyAV"  # the baseline row: DataLoader workers only (it has no threaded variant)

# One timed configuration: (kind, reader name, count); kind "workers" counts DataLoader worker
# processes, "threads" reader threads in the training process.
Config = tuple[str, str, int]
# The best result of each (reader name, count) of one kind.
Results = dict[tuple[str, int], dict]
# Every round's clips/s of every configuration.
Rounds = list[dict[Config, float]]
# A reader's Dataset maker and the collate_fn build_loader is given for it (None: its default).
DatasetMaker = tuple[Callable[[], Dataset], Any]


class ReadCopyDataset(Dataset):
    """The bound: read each payload of a batch from the shards, copy it into one buffer, return that."""

    def __init__(self, root: str) -> None:
        self.store = open_clips(root)
        shape = self.store.manifest.data.clip_shape
        if shape is None:
            raise ValueError(f"{root}: clips of varying shape (short-side resizing): the bound needs one clip shape")
        self.slot = math.prod(shape)

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, item: Any) -> dict:
        return self.__getitems__([item])

    def batch_fields(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The fields of a batch, as the threaded loader allocates its slots: (shape per clip, dtype)."""
        return {"clip": ((self.slot,), torch.uint8), "bytes": ((), torch.int64)}

    def read_into(self, items: Sequence[Any], out: dict[str, np.ndarray]) -> dict[str, list]:
        """Copy each payload into its row of ``out["clip"]`` (the threaded loader calls this directly)."""
        indices = [it[1] if isinstance(it, tuple) else it for it in items]
        arr, sizes = out["clip"], out["bytes"]

        with contextlib.closing(self.store.read(indices)) as stored:
            for clip in stored:
                n = len(clip.payload)
                arr[clip.position, :n] = np.frombuffer(clip.payload, dtype=np.uint8)
                sizes[clip.position] = n
        return {}

    def __getitems__(self, items: Sequence[Any]) -> dict:
        buf = _batch_array((len(items), self.slot))
        sizes = np.zeros(len(items), dtype=np.int64)
        self.read_into(items, {"clip": buf.numpy(), "bytes": sizes})
        return {"clip": buf, "bytes": int(sizes.sum())}


def _as_is(batch: Any) -> Any:
    """A collate_fn for datasets whose ``__getitems__`` already returns the batch."""
    return batch


def build_data(root: str, videos: int, workers: int) -> dict[str, str]:
    """Synthetic videos under root/videos and one conversion per backend and codec; reused when present.

    Keys: ``videos``, the codec names (LMDB; the video codecs too) and ``tfrecord_<codec>``.
    """
    from convert.synth import synthetic_conversions
    from convert.worker.plan import ConvertConfig

    configs = {codec if backend == "lmdb" else f"{backend}_{codec}": ConvertConfig(backend=backend, codec=codec)
               for backend in BACKENDS for codec in CODECS}
    configs |= {codec: ConvertConfig(codec=codec) for codec in VIDEO_CODECS}
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
        for batches, batch in enumerate(epoch_batches(epoch), 1):  # noqa: B007 - read after the loop
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
# clips would make an epoch of a handful of batches, and its start and end (the pipeline filling and
# draining) would weigh in the rate as they never do in training (docs/benchmarks.md, reader threads).
EPOCH_DRAWS = 16


class SteadySampler(DistributedClipSampler):
    """Epochs of ``EPOCH_DRAWS`` shuffled passes over ``n`` items: the sampler's order over ``EPOCH_DRAWS * n``,
    each index taken modulo ``n``."""

    def __init__(self, n: int) -> None:
        super().__init__(EPOCH_DRAWS * n, num_replicas=1, rank=0, seed=0)
        self.items = n

    def __iter__(self) -> Iterator:
        return ((epoch, i % self.items) for epoch, i in super().__iter__())


def steady_sampler(n: int) -> SteadySampler:
    """Epochs of ``EPOCH_DRAWS * n`` draws over ``n`` items (``SteadySampler``)."""
    return SteadySampler(n)


def measure(dataset: Dataset, *, batch_size: int, workers: int, seconds: float, start_method: str | None,
            collate_fn: Any = None, threads: int | None = None) -> dict:
    """clips and bytes per second through build_loader, after one warm-up batch (``threads``: reader threads).

    Epochs are ``EPOCH_DRAWS`` draws per clip (``steady_sampler``), so the rate is the steady one.
    """
    assert isinstance(dataset, Sized)  # a map-style dataset
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


def loader_datasets(paths: dict[str, str]) -> dict[str, DatasetMaker]:
    """The readers timed through ``build_loader``, by name: the on-the-fly baseline first, the bound last."""
    return {
        ON_THE_FLY: (lambda: OnTheFlyVideoDataset(paths["videos"], train=True), None),
        "lmdb raw": (lambda: ClipDataset(paths["raw"], train=True), None),
        "lmdb lz4": (lambda: ClipDataset(paths["lz4"], train=True), None),
        "lmdb jpeg": (lambda: ClipDataset(paths["jpeg"], train=True), None),
        "lmdb h264": (lambda: ClipDataset(paths["h264"], train=True), None),
        "lmdb vp9": (lambda: ClipDataset(paths["vp9"], train=True), None),
        "read+copy bound (raw)": (lambda: ReadCopyDataset(paths["raw"]), _as_is),
    }


def run_rounds(configs: Sequence[Config], datasets: dict[str, DatasetMaker],
               others: dict[str, Callable[[int], dict]], args: argparse.Namespace) -> tuple[Results, Results, Rounds]:
    """Every configuration once per round, ``args.rounds`` rounds interleaved, the best of each kept.

    On a shared machine other work only ever slows a configuration down, so
    the best round is the one least disturbed. A reader of ``others`` runs its
    own loop (given the count); one of ``datasets`` goes through ``measure``.
    Returns the best results of the DataLoader-worker configurations and of
    the reader-thread ones, and every round's rate of every configuration, for
    ratios taken within one round (the machine's state moves between rounds;
    a ratio of two bests may pair a good moment with a bad one).
    """
    workers: Results = {}
    threaded: Results = {}
    rounds: Rounds = []
    for _ in range(args.rounds):
        rounds.append({})
        for name, kind, n in configs:
            if name in others:
                r = others[name](n)
            else:
                make, collate_fn = datasets[name]
                r = measure(make(), batch_size=args.batch_size, workers=n if kind == "workers" else 0,
                            seconds=args.seconds, start_method=args.start_method, collate_fn=collate_fn,
                            threads=n if kind == "threads" else None)
            into = workers if kind == "workers" else threaded
            rounds[-1][(kind, name, n)] = r["clips_s"]
            if (name, n) not in into or r["clips_s"] > into[(name, n)]["clips_s"]:
                into[(name, n)] = r
            print(f"  {name:22s} {kind} {n}: {r['clips_s']:8.1f} clips/s", file=sys.stderr, flush=True)
    return workers, threaded, rounds


def thread_counts(requested: list[int] | None, cpus: int) -> list[int]:
    """1 and 2 threads and one per core, unless given."""
    return sorted(set(requested or (1, 2, cpus)))


def paired(rounds: Rounds, a: Config, b: Config) -> float | None:
    """Median over rounds of rate ``a`` / rate ``b`` measured in the same round (None when never both)."""
    ratios = [r[a] / r[b] for r in rounds if a in r and b in r and r[b] > 0]
    return float(np.median(ratios)) if ratios else None


def _data_files(root: str) -> list[str]:
    """Every file a reader of the conversion at ``root`` maps: LMDB data files, TFRecord record files."""
    return [os.path.join(d, f) for d, _, names in os.walk(os.path.join(root, "shards")) for f in names
            if f == "data.mdb" or f.endswith(".tfrecord")]


def _read_ahead(root: str) -> str:
    """The read_ahead_kb of the block device holding ``root`` ('?' when it cannot be read)."""
    try:
        dev = os.stat(root).st_dev
        with open(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/queue/read_ahead_kb") as fh:
            return fh.read().strip()
    except OSError:
        return "?"


__all__ = ["BACKENDS", "CODECS", "VIDEO_CODECS", "EPOCH_DRAWS", "N_CLASSES", "ON_THE_FLY", "Config", "DatasetMaker",
           "ReadCopyDataset", "Results", "Rounds", "build_data", "loader_datasets", "measure", "paired", "run_rounds",
           "steady_sampler", "thread_counts", "timed"]
