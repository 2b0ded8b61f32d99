"""``--sections smallcache``: reads through a page cache smaller than the shards (a memory cgroup; needs root).

Every clip read once, one thread, in the sampler's random order against its
block-shuffled order (``order="blocks"``). Each read runs in a child process
(``python -m benchmarks.loaders --read-child ...``, started in the repository
root so that it can import ``benchmarks``) that joins a memory cgroup of its
own, limited to ``--cache-fraction`` of the conversion's shard bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from benchmarks import REPO_ROOT
from convert.store import open_clips

from .common import _data_files, _read_ahead

if TYPE_CHECKING:
    from typing_extensions import Self


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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        for _ in range(50):  # the kernel frees a cgroup whose last process just exited a moment later
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def read_child_command(root: str, order: str, block: int, window: int, procs: str) -> list[str]:
    """The command line of the reader child: ``cold_read`` of ``root`` in one process that joins ``procs``."""
    return [sys.executable, "-m", "benchmarks.loaders", "--read-child", json.dumps([root, order, block, window, procs])]


def small_cache_table(paths: dict[str, str], args: argparse.Namespace) -> None:
    """Reads through a page cache smaller than the shards: the sampler's random order against its block order."""
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
                        # Absolute paths: the child starts in the repository root, not in our folder.
                        out = subprocess.run(read_child_command(os.path.abspath(root), order, block, window,
                                                                group.procs),
                                             check=True, capture_output=True, text=True, cwd=REPO_ROOT)
                except (OSError, subprocess.CalledProcessError) as exc:
                    detail = getattr(exc, "stderr", "") or ""
                    last = ": " + detail.strip().splitlines()[-1] if detail else ""
                    print(f"\nsmall page cache: skipped ({exc}{last}); it needs root and a memory cgroup")
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


__all__ = ["MemoryCgroup", "read_child_command", "small_cache_table"]
