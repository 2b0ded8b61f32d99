"""``python -m benchmarks.revisions BASE``: the conversion and ``verify`` of the same videos by two commits' code.

A change inside the shard writers or the verifier (what a shard's summary
reads back, what ``verify`` hashes) costs what it costs only in whole jobs:
this runs ``python -m convert SRC OUT`` and ``python -m convert verify OUT``
as a user does, once with the code of the git revision ``BASE`` (extracted
with ``git archive``, nothing in the repository touched) and once with this
working tree's (or ``--new``'s), on the same videos with the same options,
in interleaved rounds whose order alternates (each row shows its best
round: other work on a shared machine only ever slows a run down).

Rows, per codec and code: conversion frames/s and CPU milliseconds per
frame (every process of the job), ``verify`` clips/s, MB/s of clip values
and its CPU seconds (every checker), and every clip read through
``open_clips`` in one thread, pass after pass for a second (the reading
side's checks and decoding). The two sides must store the same
clips: their shards' header checksums are compared. Nothing here asserts a
figure; docs/benchmarks.md records the output.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator

from benchmarks import REPO_ROOT, scratch_folder
from benchmarks.conversion import DEFAULT_SHARED, SIZE, _stored_frames, build_tree
from benchmarks.scale import run_convert
from convert.format import read_manifest
from convert.format.system import cpu_count


def extract(rev: str, folder: str) -> str:
    """The tree of git revision ``rev`` of this repository, written under ``folder``; its path."""
    done = subprocess.run(["git", "-C", REPO_ROOT, "archive", "--format=tar", rev], capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"revisions: git archive {rev}: {done.stderr.decode(errors='replace').strip()}")
    root = os.path.join(folder, f"tree-{rev.replace('/', '_')}")
    shutil.rmtree(root, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(root, filter="data")
    return root


@contextlib.contextmanager
def code_of(root: str) -> Iterator[None]:
    """Children started inside run the package at ``root``: ``python -m`` puts the working folder first on the
    path, and its shard processes find it the same way (``convert.job.supervise.package_env``)."""
    here = os.getcwd()
    os.chdir(root)
    try:
        yield
    finally:
        os.chdir(here)


# Every clip of OUT read through open_clips in one thread, pass after pass for at least a second (one pass of a
# small conversion is too short to time); prints the seconds one pass took.
_READ_ALL = ("import sys, time\nfrom convert.store import open_clips\nstore = open_clips(sys.argv[1])\n"
             "passes, start = 0, time.perf_counter()\nwhile passes == 0 or time.perf_counter() - start < 1.0:\n"
             "    for i in range(len(store)):\n        store[i]\n    passes += 1\n"
             "print((time.perf_counter() - start) / passes)")


def one_side(root: str, tree: str, out: str, codec: str, backend: str, workers: int
             ) -> tuple[float, float, float, float, float, list[str]]:
    """Convert ``tree``, verify it and read it with the code at ``root``: (convert wall s, its CPU s, verify wall
    s, its CPU s, read s, the shards' header checksums)."""
    shutil.rmtree(out, ignore_errors=True)
    size = f"{SIZE[0]}x{SIZE[1]}"
    with code_of(root):
        wall, cpu, _ = run_convert([tree, out, "--codec", codec, "--backend", backend, "--size", size,
                                    "--workers", str(workers), "--no-progress"])
        v_wall, v_cpu, _ = run_convert(["verify", out])
        read = subprocess.run([sys.executable, "-c", _READ_ALL, out], capture_output=True, text=True, check=True)
    return wall, cpu, v_wall, v_cpu, float(read.stdout), [s.sha256 for s in read_manifest(out).shards]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.revisions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="the git revision to compare with (a commit, a tag, HEAD~1)")
    p.add_argument("--new", default=None, help="the git revision measured against it (default: this working tree)")
    p.add_argument("--codecs", default="raw,jpeg", help="comma-separated codecs (default raw,jpeg)")
    p.add_argument("--backend", default="lmdb", help="the backend (default lmdb)")
    p.add_argument("--videos", type=int, default=50, help="videos, the real test videos in turn (default 50)")
    p.add_argument("--workers", type=int, default=cpu_count(), help="processes (default: the CPUs usable)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best of each row is shown")
    p.add_argument("--shared", default=DEFAULT_SHARED, help="folder with the real test videos")
    p.add_argument("--tmp", default=None, help="scratch folder (default: a temp dir, removed after)")
    args = p.parse_args(argv)
    codecs = [c for c in args.codecs.split(",") if c.strip()]
    if not codecs or args.videos < 1 or args.rounds < 1:
        p.error("needs a codec, and --videos and --rounds of at least 1")
    with scratch_folder(args.tmp, "revisions-bench-") as scratch:
        roots = {args.base: extract(args.base, scratch),
                 args.new or "working tree": extract(args.new, scratch) if args.new else REPO_ROOT}
        tree = os.path.join(scratch, "videos")
        shutil.rmtree(tree, ignore_errors=True)
        build_tree(tree, args.shared, args.videos)
        runs: dict[tuple[str, str], list[tuple[float, float, float, float, float]]] = {}
        frames: dict[str, int] = {}
        values: dict[str, tuple[int, int]] = {}
        for r in range(args.rounds):
            for codec in codecs:
                sums = set()
                for name, root in (list(roots.items()) if r % 2 == 0 else list(roots.items())[::-1]):
                    out = os.path.join(scratch, "out")
                    c_wall, c_cpu, v_wall, v_cpu, read, shard_sums = one_side(root, tree, out, codec,
                                                                               args.backend, args.workers)
                    runs.setdefault((codec, name), []).append((c_wall, c_cpu, v_wall, v_cpu, read))
                    sums.add(tuple(shard_sums))
                    manifest = read_manifest(out)
                    frames[codec] = _stored_frames(out)
                    values[codec] = (manifest.totals.clips, manifest.totals.value_bytes)
                    shutil.rmtree(out)
                if len(sums) != 1:
                    raise SystemExit(f"revisions: the two sides stored different clips for {codec}")
        print(f"\n{args.videos} videos -> {SIZE[0]}x{SIZE[1]}, {args.backend}, {args.workers} processes, "
              f"best of {args.rounds} interleaved rounds\n")
        print(f"| {'codec':5} | {'code':28} | {'convert frames/s':>16} | {'CPU ms/frame':>12} | "
              f"{'verify clips/s':>14} | {'verify MB/s':>11} | {'verify CPU s':>12} | {'read clips/s':>12} |")
        print(f"|{'-' * 7}|{'-' * 30}|{'-' * 18}|{'-' * 14}|{'-' * 16}|{'-' * 13}|{'-' * 14}|{'-' * 14}|")
        for codec in codecs:
            clips, value_bytes = values[codec]
            best = {}
            for name in roots:
                rounds = runs[(codec, name)]
                best[name] = (frames[codec] / min(t[0] for t in rounds), min(t[1] for t in rounds) / frames[codec]
                              * 1e3, clips / min(t[2] for t in rounds), value_bytes / min(t[2] for t in rounds) / 1e6,
                              min(t[3] for t in rounds), clips / min(t[4] for t in rounds))
                fps, ms, cps, mbs, vcpu, rps = best[name]
                print(f"| {codec:5} | {name[:28]:28} | {fps:16.0f} | {ms:12.3f} | {cps:14.0f} | {mbs:11.0f} | "
                      f"{vcpu:12.2f} | {rps:12.0f} |")
            (a, b) = (best[name] for name in roots)
            print(f"| {codec:5} | {'ratio (second / first)':28} | {b[0] / a[0]:16.3f} | {b[1] / a[1]:12.3f} | "
                  f"{b[2] / a[2]:14.3f} | {b[3] / a[3]:11.3f} | {b[4] / a[4]:12.3f} | {b[5] / a[5]:12.3f} |")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
