"""``python -m benchmarks.loaders``: the command line, dispatching to the sections (run from the repository root).

The package's docstring (``benchmarks/loaders/__init__.py``) says what each
section measures; docs/benchmarks.md records the tables.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time

import torch

import benchmarks.loaders
from convert.format.system import cpu_count
from convert.store import open_clips

from . import dataloader, threads
from .cold import cold_read, cold_table
from .common import Config, build_data, loader_datasets, run_rounds
from .engines import engine_table
from .smallcache import small_cache_table

SECTIONS = ("dataloader", "threads", "engines", "cold", "smallcache")


def run(args: argparse.Namespace) -> int:
    """Build (or reuse) the data, time the sections asked for, print their tables."""
    root = args.root or tempfile.mkdtemp(prefix="loaders-bench-")
    cpus = cpu_count()
    print(f"data: {root} ({args.videos} synthetic videos; building or reusing shards)", flush=True)
    t = time.perf_counter()
    paths = build_data(root, args.videos, cpus)
    n_clips = len(open_clips(paths["raw"]))
    print(f"built in {time.perf_counter() - t:.1f} s: {n_clips} clips of 16x128x171x3 per codec and backend; "
          f"batch {args.batch_size}, {args.seconds:g} s per configuration, torch {torch.__version__}, "
          f"{cpus} CPUs, start method {args.start_method or 'default'}", flush=True)
    # Read through build_loader, by DataLoader workers or reader threads.
    datasets = loader_datasets(paths)
    # Readers with their own loop, timed per worker count only (no threaded variant).
    others = dataloader.own_loop_readers(paths, args) if "dataloader" in args.sections else {}
    names = dataloader.reader_names(datasets, others)
    threaded_names = threads.threaded_names(datasets)
    # The two sections in the same interleaved rounds: the threads table divides by the DataLoader
    # rate of the same round.
    configs: list[Config] = dataloader.configs(names, args) if "dataloader" in args.sections else []
    if "threads" in args.sections:
        configs += threads.configs(threaded_names, args, cpus)
    results, threaded, rounds = run_rounds(configs, datasets, others, args)
    if "dataloader" in args.sections:
        dataloader.report(names, results, paths, args)
    if "threads" in args.sections:
        threads.thread_table(threaded_names, threaded, results, args, cpus, rounds)
    if "engines" in args.sections:
        engine_table(paths, args, cpus)
    if "cold" in args.sections:
        cold_table(paths, args)
    if "smallcache" in args.sections:
        small_cache_table(paths, args)
    if not args.root and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def _counts(text: str) -> list[int]:
    """A comma-separated list of counts."""
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    """The command line of ``python -m benchmarks.loaders``; the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.loaders",
                                description=(benchmarks.loaders.__doc__ or "").split("\n\n")[0])
    p.add_argument("--root", help="folder for the synthetic videos and shards (kept; reused next time)")
    p.add_argument("--videos", type=int, default=20, help="synthetic videos (default 20, about 3 clips each)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per configuration (default 3)")
    p.add_argument("--workers", type=_counts, default=[0, 1, 2],
                   help="comma-separated DataLoader worker counts (default 0,1,2)")
    p.add_argument("--start-method", choices=("fork", "spawn", "forkserver"), help="worker start method")
    p.add_argument("--thread-counts", type=_counts, default=None,
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
        root, order, block, window, procs = json.loads(args.read_child)
        print(json.dumps(cold_read(root, order=order, block=block, window=window, join=procs)))
        return 0
    if args.videos < 1 or args.batch_size < 1 or args.seconds <= 0 or args.rounds < 1 or min(args.workers) < 0:
        p.error("--videos, --batch-size, --seconds and --rounds must be positive, --workers >= 0")
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        p.error(f"--sections: unknown {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    if not 0 < args.cache_fraction < 1:
        p.error("--cache-fraction must be between 0 and 1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
