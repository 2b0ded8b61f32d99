"""``python -m convert.bench``: conversion speed against decode-only and decord, side by side.

Everything is measured in one run, on the same videos and the same number of
processes, in interleaved rounds (these machines are noisy: each row shows its
best round). Rows give frames/s and the ratio to decode-only (PyAV decode +
resize, nothing written) and to decord's decode + resize, the outside
reference (when installed). The conversions are whole jobs (``run_job``: plan,
shard processes, writing, manifest); decode-only and decord run in an
already warm joblib pool, so the job's fixed start-up cost is measured on its
own, on one and two tiny videos.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Callable

from joblib import Parallel, delayed

from .decode import FrameSpec, VideoDecoder
from .job import JobOptions, run_job
from .plan import ConvertConfig

REAL = ["mmaction2__demo.mp4", "mmaction2__test.avi", "mmcv__test.mp4", "moviepy__big_buck_bunny_432_433.webm"]
TINY = "mmaction2__part_0.mp4"  # 32 frames: the start-up measurement's video
DEFAULT_SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared",
                              "testdata", "videos")
SIZE = (128, 171)
BASE = "decode-only: PyAV + filter-graph resize"
DECORD = "decord: decode + resize (reference)"
CONVERSIONS = {"convert -> LMDB, raw": ("lmdb", "raw"), "convert -> LMDB, lz4": ("lmdb", "lz4"),
               "convert -> TFRecord, raw": ("tfrecord", "raw"), "convert -> TFRecord, lz4": ("tfrecord", "lz4")}


def build_tree(root: str, shared: str, n_videos: int, names: list[str] = REAL) -> list[str]:
    """Class folders of ``n_videos`` symlinks to the real videos ``names``, used in turn under distinct names."""
    found = [name for name in names if os.path.exists(os.path.join(shared, name))]
    if not found:
        raise SystemExit(f"no benchmark videos found in {shared}")
    paths = []
    for k in range(n_videos):
        name = found[k % len(found)]
        cls = os.path.join(root, f"class_{k // len(found) % 4}")
        os.makedirs(cls, exist_ok=True)
        dst = os.path.join(cls, f"{k // len(found):03d}_{name}")
        os.symlink(os.path.abspath(os.path.join(shared, name)), dst)
        paths.append(dst)
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


def _parallel(fn, paths: list[str], workers: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    frames = sum(Parallel(n_jobs=workers)(delayed(fn)(p, SIZE) for p in paths))
    return frames, time.perf_counter() - t0


def _convert(tree: str, out: str, workers: int, backend: str, codec: str) -> tuple[int, float]:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    manifest = run_job(tree, out, ConvertConfig(backend=backend, codec=codec),
                       JobOptions(workers=workers, progress=False))
    elapsed = time.perf_counter() - t0
    from loaders import open_clips

    store = open_clips(out)
    frames = sum(r.frames for si in range(len(store.shard_paths)) for r in store.reader(si).records())
    if manifest["totals"]["videos"] == 0:
        raise SystemExit(f"{out}: the conversion stored no video")
    return frames, elapsed


def _cli_convert(tree: str, out: str, workers: int) -> tuple[int, float]:
    """``python -m convert`` as a user runs it: the interpreter's and the imports' start-up included."""
    import subprocess

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "convert", tree, out, "--workers", str(workers), "--no-progress"],
                   check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(
                       filter(None, [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                     os.environ.get("PYTHONPATH")]))})
    return 0, time.perf_counter() - t0


def _stored_mb(out: str) -> float:
    import json

    with open(os.path.join(out, "manifest.json")) as fh:
        return json.load(fh)["totals"]["value_bytes"] / 1e6


def _rows(paths: list[str], tree: str, scratch: str, workers: int, with_decord: bool
          ) -> dict[str, Callable[[], tuple[int, float]]]:
    runs: dict[str, Callable[[], tuple[int, float]]] = {BASE: lambda: _parallel(_pyav_decode, paths, workers)}
    for name, (backend, codec) in CONVERSIONS.items():
        out = os.path.join(scratch, f"{backend}-{codec}")
        runs[name] = lambda out=out, b=backend, c=codec: _convert(tree, out, workers, b, c)
    runs["decode-only: PyAV + VideoFrame.reformat"] = lambda: _parallel(_pyav_reformat, paths, workers)
    if with_decord:
        runs[DECORD] = lambda: _parallel(_decord_decode, paths, workers)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m convert.bench", description=__doc__)
    p.add_argument("--shared", default=DEFAULT_SHARED, help="folder with the real test videos")
    p.add_argument("--videos", default="50,200",
                   help="comma-separated job sizes: each uses the real videos in turn, as that many videos")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best of each row is shown")
    p.add_argument("--tmp", default=None, help="scratch folder (default: a temp dir, removed after)")
    args = p.parse_args(argv)
    sizes = [int(v) for v in args.videos.split(",") if v.strip()]
    if not sizes or min(sizes) < 1:
        p.error(f"--videos needs positive counts, got {args.videos!r}")
    try:
        import decord  # noqa: F401

        with_decord = True
    except ImportError:
        with_decord = False
        print("decord not installed (pip install decord): its reference row is left out")
    scratch = args.tmp or tempfile.mkdtemp(prefix="convert-bench-")
    try:
        plans = {}
        for n in sizes:
            tree = os.path.join(scratch, f"videos-{n}")
            shutil.rmtree(tree, ignore_errors=True)
            paths = build_tree(tree, args.shared, n)
            plans[n] = _rows(paths, tree, os.path.join(scratch, f"out-{n}"), args.workers, with_decord)
        tiny = {}
        for n in (1, 2):
            tree = os.path.join(scratch, f"tiny-{n}")
            shutil.rmtree(tree, ignore_errors=True)
            paths = build_tree(tree, args.shared, n, [TINY])
            out = os.path.join(scratch, f"tiny-out-{n}")
            tiny[f"run_job, {n} tiny video{'s' * (n > 1)}"] = (
                lambda tree=tree, out=out: _convert(tree, out, args.workers, "lmdb", "raw"))
            tiny[f"decode-only, the same {n}"] = lambda paths=paths: _parallel(_pyav_decode, paths, args.workers)
            tiny[f"python -m convert, {n} tiny video{'s' * (n > 1)}"] = (
                lambda tree=tree, out=out: _cli_convert(tree, out, args.workers))
        _parallel(_pyav_decode, build_tree(os.path.join(scratch, "warm"), args.shared, 4), args.workers)
        rows: dict[int, dict[str, list[tuple[int, float]]]] = {n: {} for n in sizes}
        starts: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, fn in tiny.items():
                starts.setdefault(name, []).append(fn()[1])
            for n in sizes:
                for name, fn in plans[n].items():
                    rows[n].setdefault(name, []).append(fn())
        for n in sizes:
            best = {name: max(f / t for f, t in r) for name, r in rows[n].items()}
            base, ref = best[BASE], best.get(DECORD)
            frames = rows[n][BASE][0][0]
            print(f"\n{n} videos, {frames} frames -> {SIZE[0]}x{SIZE[1]} RGB, {args.workers} processes, "
                  f"best of {args.rounds} interleaved rounds\n")
            print(f"| {'measure':42} | {'frames/s':>9} | {'vs decode-only':>14} | {'vs decord':>9} |")
            print(f"|{'-' * 44}|{'-' * 11}|{'-' * 16}|{'-' * 11}|")
            for name, fps in best.items():
                vs_ref = f"{fps / ref:9.2f}" if ref else f"{'-':>9}"
                print(f"| {name:42} | {fps:9.0f} | {fps / base:14.2f} | {vs_ref} |")
            mbs = {c: _stored_mb(os.path.join(scratch, f"out-{n}", f"lmdb-{c}")) for c in ("raw", "lz4")}
            print("\nstored: " + ", ".join(f"{c} {mb:.0f} MB" for c, mb in mbs.items()))
        print(f"\nfixed start-up (best of {args.rounds}; seconds of wall time)\n")
        for name, times in starts.items():
            print(f"  {name:36} {min(times):6.3f} s")
        return 0
    finally:
        if args.tmp is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
