"""``python -m benchmarks.scale``: every stage of the pipeline measured as the video count grows, side by side.

A Kinetics-shaped dataset is built without big disks: a few real H.264
videos (``convert.synth``), hard-linked under N Kinetics ids
(``<youtube_id>_<start:06d>_<end:06d>.mp4``) spread over ``--classes``
classes, and a Kinetics CSV naming all N of which a share (``--missing``)
has no file, as every real copy of Kinetics lacks some. For each N of
``--sizes`` (in one run, so the figures compare):

* plan: reading the CSV and indexing the video folder (``convert.worker.sources``);
* convert: ``python -m convert`` in a child process: wall and CPU time (of
  every process it started, also per video present), the largest peak RSS
  among them and bytes written;
* the sizes of plan.json, manifest.json and report.jsonl;
* verify (every shard, every payload decoded);
* reader start-up, in a fresh process with its imports done first:
  ``open_clips``, ``ClipDataset`` and one sampler epoch; wall time and the
  growth of the process's peak RSS.

Then the growth of each stage: the exponent of N between the smallest and
the largest size (1 is linear), and its time per video at the largest.
Nothing here asserts a figure; docs/benchmarks.md records the output.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

STARTUP = r"""
import json, resource, sys, time
from convert.format import open_clips
from loaders import ClipDataset, DistributedClipSampler
out = sys.argv[1]
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
store = open_clips(out)
t1 = time.perf_counter()
ds = ClipDataset(out, train=True, crop_size=16)
t2 = time.perf_counter()
sampler = DistributedClipSampler(len(ds), num_replicas=1, rank=0, seed=0)
order = list(sampler)
t3 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"open_clips_s": t1 - t0, "dataset_s": t2 - t1, "sampler_epoch_s": t3 - t2,
                  "reader_rss_growth_mb": (rss - rss0) / 1024, "clips": len(order)}))
"""


def base_videos(work: str) -> list[str]:
    """A few short real H.264 videos (synthetic footage), written once."""
    from convert.synth import make_dataset

    root = os.path.join(work, "base")
    return sorted(make_dataset(root, per_class=1, seconds=0.6, seed=3))


def build(work: str, n: int, *, classes: int, missing: float, bases: list[str]) -> tuple[str, str]:
    """N annotated videos over ``classes`` classes (hard links to ``bases``), ``missing`` of them absent;
    returns (the CSV, the video folder)."""
    root = os.path.join(work, f"videos_{n}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    step = max(1, round(1 / missing)) if missing > 0 else 0
    rows = ["label,youtube_id,time_start,time_end,split\n"]
    for i in range(n):
        yid = f"y{i:010d}"
        rows.append(f"class_{i % classes:03d},{yid},0,10,train\n")
        if step and i % step == step - 1:
            continue  # annotated, but this copy lacks it
        os.link(bases[i % len(bases)], os.path.join(root, f"{yid}_000000_000010.mp4"))
    csv = os.path.join(work, f"train_{n}.csv")
    with open(csv, "w") as fh:
        fh.writelines(rows)
    return csv, root


def _bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


# The conversion settings of these benchmarks: the least work per video, so a fixed cost weighs the most.
TINY_SETTINGS = ("--size", "32x40", "--clip-len", "8", "--max-clips", "1", "--no-progress")


def run_convert(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, float]:
    """``python -m convert ARGV`` as a user runs it, in a child process: (wall s, CPU s, peak RSS MB).

    Its CPU time and peak RSS include every process it started (the shard processes are its children's
    children, reaped before it ends). A failure exits with its last lines.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "convert", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's usage, its reaped descendants' included
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    if status != 0:
        raise SystemExit(f"python -m convert {' '.join(argv[:2])} failed: {err[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def measure(work: str, n: int, args: argparse.Namespace, bases: list[str]) -> dict:
    """Every stage for N videos."""
    from convert.format.verify import verify
    from convert.worker.sources import from_csv

    csv, videos = build(work, n, classes=args.classes, missing=args.missing, bases=bases)
    row: dict = {"videos": n}
    t0 = time.perf_counter()
    source = from_csv(csv, videos)
    row["plan_s"] = time.perf_counter() - t0
    present = len(source.items)
    out = os.path.join(work, f"out_{n}")
    shutil.rmtree(out, ignore_errors=True)
    row["convert_s"], row["convert_cpu_s"], row["convert_peak_rss_mb"] = run_convert(
        [csv, out, "--videos", videos, "--workers", str(args.workers), *TINY_SETTINGS])
    row["written_mb"] = _bytes(out) / 2**20
    row["cpu_ms_per_video"] = 1000 * row["convert_cpu_s"] / max(present, 1)
    for name in ("plan.json", "manifest.json", "report.jsonl"):
        row[f"{name}_kb"] = os.path.getsize(os.path.join(out, name)) / 1024
    t0 = time.perf_counter()
    problems, _ = verify(out, workers=args.workers)
    row["verify_s"] = time.perf_counter() - t0
    if problems:
        raise SystemExit(f"scale: verify found problems at N={n}: {problems[0]}")
    got = subprocess.run([sys.executable, "-c", STARTUP, out], capture_output=True, text=True, check=True)
    row.update(json.loads(got.stdout))
    if not args.keep:
        shutil.rmtree(out)
        shutil.rmtree(videos)
    return row


STAGES = ("plan_s", "convert_s", "convert_cpu_s", "verify_s", "open_clips_s", "dataset_s", "sampler_epoch_s",
          "manifest.json_kb", "plan.json_kb", "report.jsonl_kb", "reader_rss_growth_mb")


def growth(rows: list[dict]) -> dict[str, float]:
    """Per stage, the exponent of N between the smallest and the largest size (1: linear)."""
    first, last = rows[0], rows[-1]
    out = {}
    for key in STAGES:
        a, b = first[key], last[key]
        if a > 0 and b > 0 and last["videos"] > first["videos"]:
            out[key] = math.log(b / a) / math.log(last["videos"] / first["videos"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000,10000", help="video counts, comma-separated (default 1000,10000)")
    p.add_argument("--classes", type=int, default=400, help="classes (default 400, Kinetics-400)")
    p.add_argument("--missing", type=float, default=0.08, help="share of annotated videos absent (default 0.08)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="shard processes (default: cores)")
    p.add_argument("--work", default="scale_work", help="scratch folder (default scale_work)")
    p.add_argument("--keep", action="store_true", help="keep each size's videos and conversion")
    args = p.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    if not sizes or sizes[0] < 10 or args.classes < 1 or not 0 <= args.missing < 1 or args.workers < 1:
        p.error("--sizes of at least 10 videos, --classes >= 1, --missing in [0, 1), --workers >= 1")
    os.makedirs(args.work, exist_ok=True)
    bases = base_videos(args.work)
    rows = []
    for n in sizes:
        rows.append(measure(args.work, n, args, bases))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.classes} classes, {args.missing:.0%} of the annotated videos missing, {args.workers} shard "
          f"process(es)\n")
    keys = ["videos", *STAGES, "cpu_ms_per_video", "convert_peak_rss_mb", "written_mb"]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(f"{row[k]:.3g}" if isinstance(row[k], float) else str(row[k]) for k in keys) + " |")
    fit = growth(rows)
    if fit:
        print(f"\ngrowth from N={rows[0]['videos']} to N={rows[-1]['videos']} (exponent of N; 1 is linear):")
        for key, exponent in fit.items():
            per = rows[-1][key] / rows[-1]["videos"]
            print(f"  {key:28s} N^{exponent:.2f}   ({per * 1e3:.3g} per 1,000 videos at N={rows[-1]['videos']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
