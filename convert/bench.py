"""``python -m convert.bench``: conversion speed against decode-only, side by side.

Everything is measured in one run, on the same videos and the same number of
processes, in interleaved rounds (these machines are noisy); the table gives
frames/s and the ratio to decode-only (PyAV decode + resize, nothing
written). decord's decode + resize is the outside reference when installed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from joblib import Parallel, delayed

from .decode import FrameSpec, VideoDecoder
from .job import JobOptions, run_job
from .plan import ConvertConfig

REAL = ["mmaction2__demo.mp4", "mmaction2__test.avi", "mmcv__test.mp4", "moviepy__big_buck_bunny_432_433.webm"]
DEFAULT_SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared",
                              "testdata", "videos")


def build_tree(root: str, shared: str, copies: int) -> list[str]:
    """Class folders of symlinks: each real video ``copies`` times under distinct names."""
    paths = []
    for k in range(copies):
        cls = os.path.join(root, f"class_{k % 4}")
        os.makedirs(cls, exist_ok=True)
        for name in REAL:
            src = os.path.join(shared, name)
            if os.path.exists(src):
                dst = os.path.join(cls, f"{k:03d}_{name}")
                os.symlink(os.path.abspath(src), dst)
                paths.append(dst)
    if not paths:
        raise SystemExit(f"no benchmark videos found in {shared}")
    return paths


def _pyav_decode(path: str, size: tuple[int, int]) -> int:
    with VideoDecoder(path, FrameSpec(size=size)) as dec:
        return sum(1 for _ in dec)


def _pyav_reformat(path: str, size: tuple[int, int]) -> int:
    import av

    n = 0
    with av.open(path) as c:
        for frame in c.decode(video=0):
            frame.reformat(width=size[1], height=size[0], format="rgb24").to_ndarray()
            n += 1
    return n


def _decord_decode(path: str, size: tuple[int, int]) -> int:
    import decord

    vr = decord.VideoReader(path, width=size[1], height=size[0], num_threads=1)
    n = 0
    for start in range(0, len(vr), 64):
        n += len(vr.get_batch(list(range(start, min(start + 64, len(vr))))).asnumpy())
    return n


def _parallel(fn, paths: list[str], workers: int, size: tuple[int, int]) -> tuple[int, float]:
    t0 = time.perf_counter()
    frames = sum(Parallel(n_jobs=workers)(delayed(fn)(p, size) for p in paths))
    return frames, time.perf_counter() - t0


def _convert(tree: str, out: str, workers: int, codec: str) -> tuple[int, float]:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    run_job(tree, out, ConvertConfig(codec=codec), JobOptions(workers=workers, progress=False))
    elapsed = time.perf_counter() - t0
    from loaders import open_clips

    store = open_clips(out)
    frames = sum(r.frames for si in range(len(store.shard_paths)) for r in store.reader(si).records())
    return frames, elapsed


def write_speed(folder: str, mib: int = 512) -> float:
    """MB/s of writing new data into a fresh file here: the page-cache cost every writer pays."""
    block = os.urandom(1 << 20)
    path = os.path.join(folder, "write-speed.tmp")
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        for _ in range(mib):
            fh.write(block)
    elapsed = time.perf_counter() - t0
    os.remove(path)
    return mib * (1 << 20) / elapsed / 1e6


def _stored_mb(out: str) -> float:
    import json

    with open(os.path.join(out, "manifest.json")) as fh:
        return json.load(fh)["totals"]["value_bytes"] / 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m convert.bench", description=__doc__)
    p.add_argument("--shared", default=DEFAULT_SHARED, help="folder with the real test videos")
    p.add_argument("--copies", type=int, default=12, help="times each real video is used")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best of each row is shown")
    p.add_argument("--tmp", default=None, help="scratch folder (default: a temp dir, removed after)")
    args = p.parse_args(argv)
    size = (128, 171)
    scratch = args.tmp or tempfile.mkdtemp(prefix="convert-bench-")
    try:
        tree = os.path.join(scratch, "videos")
        shutil.rmtree(tree, ignore_errors=True)
        paths = build_tree(tree, args.shared, args.copies)
        rows: dict[str, list[tuple[int, float]]] = {}
        runs = {
            "decode-only: PyAV + filter-graph resize": lambda: _parallel(_pyav_decode, paths, args.workers, size),
            "convert -> LMDB, raw": lambda: _convert(tree, os.path.join(scratch, "raw"), args.workers, "raw"),
            "convert -> LMDB, lz4": lambda: _convert(tree, os.path.join(scratch, "lz4"), args.workers, "lz4"),
            "decode-only: PyAV + VideoFrame.reformat": lambda: _parallel(_pyav_reformat, paths, args.workers, size),
        }
        try:
            import decord  # noqa: F401

            runs["decord: decode + resize (reference)"] = lambda: _parallel(_decord_decode, paths, args.workers, size)
        except ImportError:
            print("decord not installed: its reference row is left out")
        _parallel(_pyav_decode, paths, args.workers, size)  # warm the page cache and the pool
        for _ in range(args.rounds):
            for name, fn in runs.items():
                rows.setdefault(name, []).append(fn())
        best = {name: max(f / t for f, t in r) for name, r in rows.items()}
        base = best["decode-only: PyAV + filter-graph resize"]
        frames = rows["decode-only: PyAV + filter-graph resize"][0][0]
        print(f"\n{len(paths)} videos, {frames} frames -> 128x171 RGB, {args.workers} processes, "
              f"best of {args.rounds} interleaved rounds\n")
        print(f"| {'measure':42} | {'frames/s':>9} | {'vs decode-only':>14} |")
        print(f"|{'-' * 44}|{'-' * 11}|{'-' * 16}|")
        for name, fps in best.items():
            print(f"| {name:42} | {fps:9.0f} | {fps / base:14.2f} |")
        speed = write_speed(scratch)
        for codec in ("raw", "lz4"):
            mb = _stored_mb(os.path.join(scratch, codec))
            print(f"\n{codec}: {mb:.0f} MB stored; at this machine's {speed:.0f} MB/s for fresh writes that alone "
                  f"is {mb / speed / args.workers:.2f} s per process, vs {frames / base:.2f} s of decoding", end="")
        print()
        return 0
    finally:
        if args.tmp is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
