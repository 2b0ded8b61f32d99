"""``--sections dataloader``: every reader by DataLoader worker count, and the bytes on disk per clip.

Besides the readers timed through ``build_loader`` (``common.loader_datasets``)
it times two that run their own loop: DALI's own TFRecord reader
(``measure_dali_native``; "workers" are DALI's CPU threads) and the
``tfrecord`` package's reader in DataLoader workers
(``TFRecordPackageDataset``), TFRecord as PyTorch code reads it without DALI.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from convert.store import open_clips
from loaders import ClipPreset

from .common import BACKENDS, CODECS, VIDEO_CODECS, Config, DatasetMaker, Results, timed


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
        self.files = [(os.path.join(store.root, s.path, f["path"]), os.path.join(store.root, s.path, f["index"]))
                      for s in store.manifest.shards for f in s.extras.get("files", [])]
        self.epoch = 0

    def __iter__(self):
        from tfrecord.reader import tfrecord_loader

        from loaders.presets import apply

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


def measure_iterable(dataset: TFRecordPackageDataset, *, batch_size: int, workers: int, seconds: float,
                     start_method: str | None) -> dict:
    """clips and bytes per second of an iterable dataset through a plain DataLoader."""
    kw: dict[str, Any] = {"prefetch_factor": 2, "persistent_workers": True} if workers else {}
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
    from loaders.dali import DaliTFRecordLoader

    preset = ClipPreset(train=True, crop_size=crop_size)
    with DaliTFRecordLoader(root, train=True, batch_size=batch_size, threads=threads, preset=preset) as loader:
        def epoch_batches(epoch: int) -> DaliTFRecordLoader:
            loader.set_epoch(epoch)
            return loader

        return timed(epoch_batches, seconds, untimed_each_epoch=True)


def own_loop_readers(paths: dict[str, str], args: argparse.Namespace) -> dict[str, Callable[[int], dict]]:
    """The readers with their own loop, by name, each timed given a worker count (no threaded variant).

    The DALI rows are left out, with a line saying why, where DALI cannot be used.
    """
    from loaders.dali import missing

    bs, secs, sm = args.batch_size, args.seconds, args.start_method
    others: dict[str, Callable[[int], dict]] = {}
    reason = missing()
    if reason is None:
        for codec in ("raw", "jpeg"):  # lz4: DALI inflates on the GPU only
            def dali(w: int, r: str = paths[f"tfrecord_{codec}"]) -> dict:
                return measure_dali_native(r, batch_size=bs, threads=max(1, w), seconds=secs)

            others[f"dali native {codec}"] = dali
    else:
        print(f"DALI not usable ({reason}): the dali native rows are skipped", flush=True)
    for codec in ("raw", "jpeg"):
        def package(w: int, r: str = paths[f"tfrecord_{codec}"]) -> dict:
            return measure_iterable(TFRecordPackageDataset(r), batch_size=bs, workers=w, seconds=secs,
                                    start_method=sm)

        others[f"tfrecord-pkg {codec}"] = package
    return others


def reader_names(datasets: dict[str, DatasetMaker], others: dict[str, Callable[[int], dict]]) -> list[str]:
    """The table's rows in order: the on-the-fly baseline first, then the readers, the read+copy bound last."""
    return list(datasets)[:-1] + list(others) + list(datasets)[-1:]


def configs(names: list[str], args: argparse.Namespace) -> list[Config]:
    """Every reader at every ``--workers`` count."""
    return [(name, "workers", w) for name in names for w in args.workers]


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
    header = (f"{'backend':9s} {'codec':5s} {'clips':>6s} {'value B/clip':>13s} {'disk B/clip':>12s} "
              f"{'x source':>9s} {'x raw':>7s}")
    lines = [header]
    raw_disk: dict[str, float] = {}  # by backend ("x raw": against the same backend's raw conversion)
    rows = [(backend, codec) for backend in BACKENDS for codec in CODECS]
    rows += [("lmdb", codec) for codec in VIDEO_CODECS if codec in paths]
    for backend, codec in rows:  # raw first on each backend (CODECS)
        root = paths[codec if backend == "lmdb" else f"{backend}_{codec}"]
        totals = open_clips(root).manifest.totals
        clips = totals.clips
        disk = _allocated(os.path.join(root, "shards")) / clips
        if codec == "raw":
            raw_disk[backend] = disk
        lines.append(f"{backend:9s} {codec:5s} {clips:6d} {totals.value_bytes / clips:13,.0f} "
                     f"{disk:12,.0f} {disk / (src / clips):8.1f}x {disk / raw_disk[backend]:6.2f}x")
    clips = open_clips(paths["raw"]).manifest.totals.clips
    lines.append(f"{'source':9s} {'h264':5s} {clips:6d} {'':>13s} {src / clips:12,.0f} {1.0:8.1f}x")
    return lines


def dataloader_table(names: list[str], results: Results, args: argparse.Namespace) -> None:
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


def report(names: list[str], results: Results, paths: dict[str, str], args: argparse.Namespace) -> None:
    """The section's output: the worker table, then the bytes-on-disk table and its note."""
    dataloader_table(names, results, args)
    print()
    print("\n".join(disk_table(paths)))
    print("\nvalue: header + payload, equal on both backends; disk: allocated blocks of every shard file "
          "(LMDB's page and free-page overhead, TFRecord's Example framing and index files).")


__all__ = ["TFRecordPackageDataset", "configs", "dataloader_table", "disk_table", "measure_dali_native",
           "measure_iterable", "own_loop_readers", "reader_names", "report"]
