"""``python -m benchmarks.conversion``: conversion speed against decode-only and decord, side by side.

Everything is measured in one run, on the same videos and the same number of
processes, in interleaved rounds (these machines are noisy: each row shows its
best round). Rows give frames/s and the ratio to decode-only (PyAV decode +
resize, nothing written), to the raw LMDB conversion (what the lz4, jpeg,
h264 and vp9 codecs cost on top of it, each at its default quality) and to
decord's decode + resize, the outside reference (when installed). The
conversions are whole jobs (``run_job``: plan, shard processes, writing,
manifest); decode-only and decord run in an
already warm joblib pool, so the job's fixed start-up cost is measured on its
own, on one and two tiny videos in a fresh process (imports, ``run_job`` and
``python -m convert`` as a whole).

Each row also gives CPU milliseconds per frame, best round: of the decoding
workers for decode-only and decord, of every process of the job (the job,
its fork server, the shard processes) for a conversion. On a machine shared
with other work the CPU time moves much less than the wall-clock rate, so
its ratio is the steadier measure of what conversion adds to decoding.

Run it from the repository root; docs/benchmarks.md records its tables.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import time
from collections.abc import Callable

from joblib import Parallel, delayed

from benchmarks import REPO_ROOT, scratch_folder
from convert.format import get_backend, read_manifest
from convert.format.system import cpu_count
from convert.job.run import JobOptions, run_job
from convert.job.supervise import package_env
from convert.worker import forkserver
from convert.worker.decode import FrameSpec, VideoDecoder, open_video
from convert.worker.plan import ConvertConfig

REAL = ["mmaction2__demo.mp4", "mmaction2__test.avi", "mmcv__test.mp4", "moviepy__big_buck_bunny_432_433.webm"]
TINY = "mmaction2__part_0.mp4"  # 32 frames: the start-up measurement's video
DEFAULT_SHARED = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "testdata", "videos"))
SIZE = (128, 171)
BASE = "decode-only: PyAV + filter-graph resize"
DECORD = "decord: decode + resize (reference)"
RAW = "convert -> LMDB, raw"
# The lossy codecs at their default qualities, LMDB only: the backend's cost is the raw and lz4 rows' to compare.
CONVERSIONS = {RAW: ("lmdb", "raw"), "convert -> LMDB, lz4": ("lmdb", "lz4"),
               "convert -> TFRecord, raw": ("tfrecord", "raw"), "convert -> TFRecord, lz4": ("tfrecord", "lz4"),
               "convert -> LMDB, jpeg": ("lmdb", "jpeg"), "convert -> LMDB, h264": ("lmdb", "h264"),
               "convert -> LMDB, vp9": ("lmdb", "vp9")}


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


def _timed(fn: Callable[[str, tuple[int, int]], int]) -> Callable[[str, tuple[int, int]], tuple[int, float]]:
    """``fn`` returning also the CPU seconds it took in its (worker) process."""
    def run(path: str, size: tuple[int, int]) -> tuple[int, float]:
        t0 = time.process_time()
        return fn(path, size), time.process_time() - t0
    run.__name__ = fn.__name__
    return run


def _pyav_decode(path: str, size: tuple[int, int]) -> int:
    with VideoDecoder(path, FrameSpec(size=size)) as dec:
        return sum(1 for _ in dec)


def _pyav_reformat(path: str, size: tuple[int, int]) -> int:
    n = 0
    with open_video(path) as c:
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


def _parallel(fn, paths: list[str], workers: int) -> tuple[int, float, float]:
    """(frames, wall seconds, CPU seconds of the workers) of decoding ``paths`` in a warm joblib pool."""
    t0 = time.perf_counter()
    done = Parallel(n_jobs=workers)(delayed(_timed(fn))(p, SIZE) for p in paths)
    return sum(f for f, _ in done), time.perf_counter() - t0, sum(c for _, c in done)


def _cpu_so_far() -> float:
    """CPU seconds of this process and of every child it has waited for."""
    import resource

    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))


def _stored_frames(out: str) -> int:
    """Frames of every video the shards at ``out`` hold a record of (what the conversion decoded)."""
    manifest = read_manifest(out)
    backend = get_backend(manifest.data.backend)
    frames = 0
    for shard in manifest.shards:
        reader = backend.reader(manifest.shard_path(out, shard.index))
        try:
            frames += sum(r.frames for r in reader.records())
        finally:
            reader.close()
    return frames


def _convert(tree: str, out: str, workers: int, backend: str, codec: str) -> tuple[int, float, float]:
    """(frames, wall seconds, CPU seconds of every process) of a whole job, as a fresh CLI job pays it.

    The fork server is stopped after each job, so each pays its start (and is
    reaped, which brings its and its shard processes' CPU time into ours).
    """
    shutil.rmtree(out, ignore_errors=True)
    forkserver.stop()
    cpu0, t0 = _cpu_so_far(), time.perf_counter()
    run_job(tree, out, ConvertConfig(backend=backend, codec=codec), JobOptions(workers=workers, progress=False))
    elapsed = time.perf_counter() - t0
    forkserver.stop()
    cpu = _cpu_so_far() - cpu0
    if read_manifest(out).totals.videos == 0:
        raise SystemExit(f"{out}: the conversion stored no video")
    return _stored_frames(out), elapsed, cpu


_FRESH_JOB = """
import sys, time
t0 = time.perf_counter()
from convert.job.run import JobOptions, run_job
from convert.worker.plan import ConvertConfig
t1 = time.perf_counter()
run_job(sys.argv[1], sys.argv[2], ConvertConfig(), JobOptions(workers=int(sys.argv[3]), progress=False))
print(t1 - t0, time.perf_counter() - t1)
"""


def _fresh(tree: str, out: str, workers: int) -> tuple[float, float, float]:
    """A job in a new process, as a user starts one: (its imports, its run_job, ``python -m convert`` in all)."""
    import subprocess

    env = package_env()
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", _FRESH_JOB, tree, out, str(workers)], check=True, env=env,
                          capture_output=True, text=True)
    imports, job = map(float, done.stdout.split())
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "convert", tree, out, "--workers", str(workers), "--no-progress"],
                   check=True, stdout=subprocess.DEVNULL, env=env)
    return imports, job, time.perf_counter() - t0


def write_speed(folder: str, mib: int = 256) -> float:
    """MB/s of writing new data into a fresh file here: the page-cache cost every writer pays, decode-only none."""
    block = os.urandom(1 << 20)
    path = os.path.join(folder, "write-speed.tmp")
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        fh.writelines(block for _ in range(mib))
    elapsed = time.perf_counter() - t0
    os.remove(path)
    return mib * (1 << 20) / elapsed / 1e6


def _stored_mb(out: str) -> float:
    """MB of clip values (headers and payloads) the conversion at ``out`` stores."""
    return read_manifest(out).totals.value_bytes / 1e6


def _rows(paths: list[str], tree: str, scratch: str, workers: int, with_decord: bool
          ) -> dict[str, Callable[[], tuple[int, float, float]]]:
    runs: dict[str, Callable[[], tuple[int, float, float]]] = {BASE: lambda: _parallel(_pyav_decode, paths, workers)}
    for name, (backend, codec) in CONVERSIONS.items():
        out = os.path.join(scratch, f"{backend}-{codec}")
        runs[name] = functools.partial(_convert, tree, out, workers, backend, codec)
    runs["decode-only: PyAV + VideoFrame.reformat"] = lambda: _parallel(_pyav_reformat, paths, workers)
    if with_decord:
        runs[DECORD] = lambda: _parallel(_decord_decode, paths, workers)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.conversion", description=__doc__)
    p.add_argument("--shared", default=DEFAULT_SHARED, help="folder with the real test videos")
    p.add_argument("--videos", default="50,200",
                   help="comma-separated job sizes: each uses the real videos in turn, as that many videos")
    p.add_argument("--workers", type=int, default=cpu_count(),
                   help="processes (default: the CPUs this process may use)")
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
    with scratch_folder(args.tmp, "convert-bench-") as scratch:
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
            tiny[n] = (tree, build_tree(tree, args.shared, n, [TINY]))
        _parallel(_pyav_decode, build_tree(os.path.join(scratch, "warm"), args.shared, 4), args.workers)
        rows: dict[int, dict[str, list[tuple[int, float, float]]]] = {n: {} for n in sizes}
        starts: dict[int, list[tuple[float, ...]]] = {n: [] for n in tiny}
        for _ in range(args.rounds):
            for n, (tree, paths) in tiny.items():
                decode = _parallel(_pyav_decode, paths, args.workers)[1]
                starts[n].append((*_fresh(tree, os.path.join(scratch, f"tiny-out-{n}"), args.workers), decode))
            for n in sizes:
                for name, fn in plans[n].items():
                    rows[n].setdefault(name, []).append(fn())
        speed = max(write_speed(scratch) for _ in range(args.rounds))
        for n in sizes:
            best = {name: max(f / t for f, t, _ in r) for name, r in rows[n].items()}
            cpu = {name: min(c / f for f, _, c in r) * 1e3 for name, r in rows[n].items()}  # CPU ms per frame
            base, ref = best[BASE], best.get(DECORD)
            frames = rows[n][BASE][0][0]
            print(f"\n{n} videos, {frames} frames -> {SIZE[0]}x{SIZE[1]} RGB, {args.workers} processes, "
                  f"best of {args.rounds} interleaved rounds\n")
            print(f"| {'measure':42} | {'frames/s':>9} | {'vs decode-only':>14} | {'vs LMDB raw':>11} | "
                  f"{'vs decord':>9} | {'CPU ms/frame':>12} | {'CPU vs decode-only':>18} | {'CPU vs LMDB raw':>15} |")
            print(f"|{'-' * 44}|{'-' * 11}|{'-' * 16}|{'-' * 13}|{'-' * 11}|{'-' * 14}|{'-' * 20}|{'-' * 17}|")
            for name, fps in best.items():
                vs_ref = f"{fps / ref:9.2f}" if ref else f"{'-':>9}"
                print(f"| {name:42} | {fps:9.0f} | {fps / base:14.2f} | {fps / best[RAW]:11.2f} | {vs_ref} | "
                      f"{cpu[name]:12.3f} | {cpu[BASE] / cpu[name]:18.2f} | {cpu[RAW] / cpu[name]:15.2f} |")
            mbs = {c: _stored_mb(os.path.join(scratch, f"out-{n}", f"{b}-{c}"))
                   for b, c in CONVERSIONS.values() if b == "lmdb"}
            print("\nstored: " + ", ".join(f"{c} {mb:.0f} MB" for c, mb in mbs.items()) + f"; at this machine's "
                  f"{speed:.0f} MB/s for new file data, writing raw alone takes "
                  f"{mbs['raw'] / speed / args.workers:.2f} s "
                  f"per process, decoding {frames / base:.2f} s")
        print(f"\nfixed start-up: a job on tiny videos ({TINY}, 32 frames each) in a fresh process, "
              f"best of {args.rounds}; seconds\n")
        print(f"| {'videos':6} | {'imports':>7} | {'run_job':>7} | {'of it decoding':>14} | {'fixed':>5} | "
              f"{'python -m convert':>17} |")
        print(f"|{'-' * 8}|{'-' * 9}|{'-' * 9}|{'-' * 16}|{'-' * 7}|{'-' * 19}|")
        for n, runs in starts.items():
            imports, job, cli, decode = (min(r[k] for r in runs) for k in range(4))
            print(f"| {n:6} | {imports:7.3f} | {job:7.3f} | {decode:14.3f} | {job - decode:5.3f} | {cli:17.3f} |")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
