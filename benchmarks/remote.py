"""``python -m benchmarks.remote``: reading shards from an S3 endpoint through the shard cache, against the folder.

One run, side by side: clips/s of one epoch read from the local folder, and
from a local S3 endpoint (moto's standalone server on 127.0.0.1, through
s3fs) with a cold cache, a warm cache, and a cache smaller than the data;
for each, the bytes downloaded during the epoch against the dataset's size,
in random, block and shard-windowed order (``DistributedClipSampler(order=...)``). The
endpoint is on the same machine, so the figures show what the cache costs
(download, verification on arrival, renames), not a network's bandwidth.
Needs the ``dev`` extra (moto[server], s3fs).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time

ORDERS = ("random", "blocks", "shards")
SHARD_WINDOW = 2  # shards resident at a time in the shard-windowed order


def _build(root: str, videos: int, shards: int) -> str:
    from convert.job.run import JobOptions, run_job
    from convert.synth import CLASSES, make_dataset
    from convert.worker.plan import ConvertConfig

    src = os.path.join(root, "videos")
    make_dataset(src, per_class=max(1, videos // len(CLASSES)), seconds=2.0, seed=3, workers=2)
    out = os.path.join(root, "tfrecord")
    if not os.path.exists(os.path.join(out, "manifest.json")):
        run_job(src, out, ConvertConfig(backend="tfrecord", codec="raw", max_clips=2),
                JobOptions(workers=2, shards=shards, progress=False))
    return out


def _epoch(root: str, order: str, *, cache, threads: int, batch: int) -> tuple[float, float, int, int]:
    """(seconds to open, clips/s of one epoch after it, bytes downloaded opening, bytes downloaded reading)."""
    from loaders import ClipDataset, DistributedClipSampler, build_loader

    t_open = time.perf_counter()
    ds = ClipDataset(root, train=True, crop_size=112, seed=0, cache=cache)
    opened = ds.store.cache.fetched_bytes if ds.store.cache else 0
    t0 = time.perf_counter()
    t_open = t0 - t_open
    from loaders.sampler import clip_shards

    settings: dict = {
        "random": {},
        "blocks": {"storage_order": ds.store.storage_order(), "block": 16, "window": 2},
        # SHARD_WINDOW shards resident at a time; the small cache holds two windows (one read, one prefetched).
        "shards": {"clip_shards": clip_shards(ds.store), "shard_window": SHARD_WINDOW},
    }[order]
    sampler = DistributedClipSampler(len(ds), num_replicas=1, rank=0, seed=0, order=order, **settings)
    loader = build_loader(ds, batch_size=batch, sampler=sampler, train=True, threads=threads, drop_last=False)
    n = 0
    for b in loader:
        n += int(b["clip"].shape[0])
    seconds = time.perf_counter() - t0
    fetched = ds.store.cache.fetched_bytes - opened if ds.store.cache else 0
    loader.close()
    ds.store.close()
    return t_open, n / seconds, opened, fetched


def run(args: argparse.Namespace) -> int:
    from convert.store import open_clips
    from convert.store.cache import CacheSettings
    from tests.remote_fixtures import S3_ENV, S3Server

    work = args.root or tempfile.mkdtemp(prefix="remote-bench-")
    local = _build(work, args.videos, args.shards)
    store = open_clips(local)
    sizes = [sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(p) for f in fs)
             for p in store.shard_paths]
    total = sum(sizes)
    os.environ.update(S3_ENV)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the server's request log
    server = S3Server()
    os.environ["AWS_ENDPOINT_URL"] = server.endpoint
    url = server.upload(local, server.bucket())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"data: {len(store)} clips of {store.manifest.data.clip_shape} raw, {len(sizes)} TFRecord shards, "
          f"{total / 1e6:.1f} MB; {args.threads} reader threads, batch {args.batch}; endpoint {server.endpoint}; "
          f"commit {commit}", flush=True)
    # Two windows of the shard-windowed order (the one read, the next prefetched), for every order.
    small = 2 * SHARD_WINDOW * max(sizes)
    rows = []
    for order in ORDERS:
        base = None
        for label, make in (("local folder", None),
                            ("s3, cold cache", "cold"),
                            ("s3, warm cache", "warm"),
                            (f"s3, cache {small / total:.0%} of data", "small")):
            best = None
            for _ in range(args.rounds):
                cache_dir = os.path.join(work, f"cache-{order}-{make}")
                if make in ("cold", "small"):
                    shutil.rmtree(cache_dir, ignore_errors=True)
                if make == "warm" and not os.path.exists(cache_dir):
                    _epoch(url, order, cache=CacheSettings(cache_dir=cache_dir, prefetch=SHARD_WINDOW),
                           threads=args.threads, batch=args.batch)
                cache = None if make is None else CacheSettings(cache_dir=cache_dir, prefetch=SHARD_WINDOW,
                                                                limit=small if make == "small" else None)
                got = _epoch(local if make is None else url, order, cache=cache, threads=args.threads,
                             batch=args.batch)
                best = got if best is None or got[1] > best[1] else best
            assert best is not None
            t_open, rate, opened, fetched = best
            base = base or rate
            rows.append((order, label, t_open, rate, rate / base, opened / total, fetched / total))
    print(f"\n{'order':<8} {'source':<28} {'open s':>7} {'clips/s':>8} {'x local':>8} {'open: bytes/data':>17} "
          f"{'epoch: bytes/data':>18}")
    for order, label, t_open, rate, ratio, opened_share, fetched_share in rows:
        print(f"{order:<8} {label:<28} {t_open:7.2f} {rate:8.1f} {ratio:8.2f} {opened_share:17.2f} "
              f"{fetched_share:18.2f}")
    server.shutdown()
    if not args.root:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.remote", description=__doc__.split("\n\n")[0])
    p.add_argument("--videos", type=int, default=60, help="synthetic videos (2 clips each; default 60)")
    p.add_argument("--shards", type=int, default=12, help="TFRecord shards (default 12)")
    p.add_argument("--threads", type=int, default=2, help="reader threads (default 2)")
    p.add_argument("--batch", type=int, default=8, help="clips per batch (default 8)")
    p.add_argument("--rounds", type=int, default=2, help="epochs per configuration, the best kept (default 2)")
    p.add_argument("--root", help="keep the data (and caches) here, reused by a later run")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
