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
  among them and bytes written; the job's overhead per video is its CPU per
  video less what decoding the same videos alone costs. From
  ``--synthesise-from`` on, the shards are written instead by the project's
  own writers in this process with one tiny clip per video and no decoding
  (``synthesise``: the same plan, shard writers and manifest as a
  conversion, for the sizes a 2-core machine cannot decode in time; its rows
  say ``synthesised``);
* the sizes of plan.json, manifest.json and report.jsonl;
* verify (every shard, every payload decoded);
* reader start-up, in a fresh process with its imports done first:
  ``open_clips``, ``ClipDataset`` and one sampler epoch; wall time, the
  growth of the process's peak RSS and of its heap (anonymous memory; the
  rest is pages of mapped files);
* trainer start-up, in the same process, its imports done first: from
  ``python -m train``'s entry to its first step (a narrow R3D-18 on the CPU,
  one step), then the checkpoint's size and the time to load it and save it
  again;
* opening the conversion as a URL (``file://``) through a fresh shard cache:
  wall time, heap growth, the shard data it downloaded (none: each shard is
  indexed from its small index files, LMDB's ``index.json`` here) and the
  bytes of those index files;
* shard start-up (``--shard-starts K``, its own table; ``--only-shard-starts``
  measures nothing else): on a plan of N videos in shards of 1,000 (written
  alone, no videos needed), K real shard processes started as the job starts
  them (``convert.job.supervise``, forked from the fork server) under
  ``--max-memory`` and without a limit, each way: sent its own shard's part of
  the plan (what the job does), and also parsing the whole plan.json first
  (what every shard process did before: ``parse_whole_plan``, put in through
  the shard hook at the very point the old code parsed it). Per way, the time
  from the start to the process's "ready", its peak RSS (``VmHWM``) and that
  less the fork server's RSS (what its children share), or the error it
  died of.

Then the growth of each stage: the exponent of N between the smallest and
the largest size (1 is linear), its cost per video at the largest, and a
projection to Kinetics-400 and Kinetics-700 on a ``--cores``-core node and on
a Dask cluster of ``--nodes`` such nodes, with real videos' decoding taken
from ``--frames-per-video`` and ``--cpu-ms-per-frame`` (docs/benchmarks.md,
conversion). Nothing here asserts a figure; docs/benchmarks.md records the
output.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import shutil
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from convert.worker.plan import Plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Heap: anonymous resident memory (Linux); the peak RSS also counts pages of mapped files (shards, libraries).
HEAP = r"""
def heap_mb():
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024
    except (OSError, StopIteration):
        return 0.0
"""

STARTUP = HEAP + r"""
import json, resource, sys, time
from convert.store import open_clips
from loaders import ClipDataset, DistributedClipSampler
out = sys.argv[1]
rss0, heap0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, heap_mb()
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
                  "reader_rss_growth_mb": (rss - rss0) / 1024, "reader_heap_mb": heap_mb() - heap0,
                  "clips": len(order)}))

# Then, in the same process (its imports already done), the trainer from its entry to its first step:
# ``train_one_epoch`` is wrapped to note when the loop first calls it; then the checkpoint the one step saved is
# loaded and saved again.
import os
import train.checkpoint as ck
import train.main as tm
run = sys.argv[2]
first = []
step = tm.train_one_epoch
def noted(*args, **kwargs):
    first.append(time.perf_counter())
    return step(*args, **kwargs)
tm.train_one_epoch = noted
t0 = time.perf_counter()
tm.run_argv(["--data", out, "--out", run, "--model", "r3d_18", "--model-width", "0.125", "--crop-size", "32",
             "--batch-size", "2", "--max-steps", "1", "--device", "cpu", "--no-progress", "--no-tensorboard",
             "--workers", "1", "--threads", "1"])
path = os.path.realpath(ck.latest_path(run))
t1 = time.perf_counter()
saved = ck.load(path)
t2 = time.perf_counter()
ck.save_checkpoint(saved, run + "_again", 1, 1)
t3 = time.perf_counter()
print(json.dumps({"trainer_start_s": first[0] - t0, "checkpoint_kb": os.path.getsize(path) / 1024,
                  "checkpoint_load_s": t2 - t1, "checkpoint_save_s": t3 - t2}))
"""

REMOTE = HEAP + r"""
import json, sys, time
from convert.format.backends import get_backend
from convert.store import CacheSettings, open_clips
url, cache_dir = sys.argv[1], sys.argv[2]
heap0 = heap_mb()
t0 = time.perf_counter()
store = open_clips(url, cache=CacheSettings(cache_dir=cache_dir))
t1 = time.perf_counter()
# A fresh cache indexes every shard from the small files its backend declares (where the shard has them): those.
files = get_backend(store.manifest.data.backend).files
index = sum(size for listed in store.cache.files for name, size in listed.items() if files.is_index(name))
print(json.dumps({"remote_open_s": t1 - t0, "remote_heap_mb": heap_mb() - heap0,
                  "remote_downloaded_mb": store.cache.fetched_bytes / 2**20, "remote_index_mb": index / 2**20,
                  "remote_clips": len(store)}))
"""


def _child(script: str, *args: str) -> dict:
    """Run ``script`` in a fresh Python (this checkout first on its path); the JSON objects it prints, merged."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    got = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env)
    if got.returncode != 0:
        raise SystemExit(f"scale: a measuring child failed: {got.stderr.strip().splitlines()[-1:]}")
    found: dict = {}
    for line in got.stdout.splitlines():
        if line.startswith("{"):
            found.update(json.loads(line))
    return found


def base_videos(work: str) -> list[str]:
    """A few short real H.264 videos (synthetic footage), written once."""
    from convert.synth import make_dataset

    root = os.path.join(work, "base")
    return sorted(make_dataset(root, per_class=1, seconds=0.6, seed=3))


def build(work: str, n: int, *, classes: int, missing: float, bases: list[str]) -> tuple[str, str]:
    """N annotated videos over ``classes`` classes (hard links to ``bases``), ``missing`` of them absent;
    returns (the CSV, the video folder)."""
    root = os.path.join(work, f"videos_{n}")
    for folder in (root, root + "_copies"):
        shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(root)
    step = max(1, round(1 / missing)) if missing > 0 else 0
    rows = ["label,youtube_id,time_start,time_end,split\n"]
    sources = list(bases)
    for i in range(n):
        yid = f"y{i:010d}"
        rows.append(f"class_{i % classes:03d},{yid},0,10,train\n")
        if step and i % step == step - 1:
            continue  # annotated, but this copy lacks it
        b = i % len(bases)
        try:
            os.link(sources[b], os.path.join(root, f"{yid}_000000_000010.mp4"))
        except OSError as exc:
            if exc.errno != errno.EMLINK:
                raise
            # A file system's limit of links per file (65,000 on ext4): link on from a fresh copy.
            os.makedirs(root + "_copies", exist_ok=True)
            sources[b] = os.path.join(root + "_copies", f"base_{b}_{i}.mp4")
            shutil.copyfile(bases[b], sources[b])
            os.link(sources[b], os.path.join(root, f"{yid}_000000_000010.mp4"))
    csv = os.path.join(work, f"train_{n}.csv")
    with open(csv, "w") as fh:
        fh.writelines(rows)
    return csv, root


def _bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


SIZE, CLIP_LEN = (32, 40), 8  # the converter's frames and clips here: one clip per video (--max-clips 1)
TINY = (1, 32, 32)  # a synthesised clip (frames, height, width): 650k of them fit a small disk, and the trainer's crop


def decode_ms_per_video(bases: list[str], rounds: int = 5) -> float:
    """CPU milliseconds of decoding one base video as the converter does here (its first clip's frames, at
    ``SIZE``), alone in this process: what the job's CPU per video is compared with."""
    from convert.worker.decode import FrameSpec, VideoDecoder

    t0 = time.process_time()
    for _ in range(rounds):
        for path in bases:
            with VideoDecoder(path, FrameSpec(size=SIZE)) as dec:
                for i, _frame in enumerate(dec):
                    if i + 1 >= CLIP_LEN:
                        break
    return 1000 * (time.process_time() - t0) / (rounds * len(bases))


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


def synthesise(csv: str, videos: str, out: str, *, shards: int) -> None:
    """The conversion of the CSV as ``python -m convert`` plans, writes and finishes it (the project's plan, shard
    writers and ``finalize``), with one constant tiny clip per video instead of decoded ones."""
    import numpy as np

    from convert.format import PLAN, SHARD_DIR, VideoRecord
    from convert.format.layout import write_json_atomic
    from convert.job.finalize import finalize
    from convert.worker.plan import ConvertConfig, admit, make_plan
    from convert.worker.shard_worker import open_writer
    from convert.worker.sources import from_csv

    config = ConvertConfig(size=TINY[1:], clip_len=TINY[0], max_clips=1)
    source = admit(from_csv(csv, videos), config.backend)
    plan = make_plan(source, config, shards, {"path": os.path.abspath(csv), "videos": os.path.abspath(videos),
                                              "split": None, "kind": source.kind})
    os.makedirs(os.path.join(out, SHARD_DIR))
    write_json_atomic(os.path.join(out, PLAN), plan.to_dict(), indent=1)
    clip = np.zeros((*TINY, 3), dtype=np.uint8)
    summaries = []
    for index, items in enumerate(plan.shards):
        writer = open_writer(out, plan.shard(index))
        try:
            for item in items:
                def produce(item=item):
                    yield 0, 0, clip
                    return VideoRecord(item.id, item.path, item.label, "ok", 1, TINY[0])

                writer.write_video(item.id, item.label, produce, clip.nbytes)
            summaries.append({**writer.finish(), "index": index})
        finally:
            writer.close()
    finalize(out, plan, summaries)


VIDEOS_PER_SHARD = 1000  # the plan's shard size at Kinetics' scale (``default_shards``)
_whole_plan = None  # what ``parse_whole_plan`` parsed, held for the process's life as the old shard process did


def parse_whole_plan() -> None:
    """The shard hook (``CONVERT_SHARD_HOOK``) of the rows that parse the whole plan: what a shard process did
    before it was sent its own part, at the same point of its start (after ``--max-memory`` is applied): read
    OUT's plan.json as it did then (``json.load``, ``Plan.from_dict``) and keep it."""
    global _whole_plan
    from convert.format import PLAN
    from convert.worker.plan import Plan

    out = sys.argv[1]  # the shard process's arguments: OUT, the shard's index, its options
    with open(os.path.join(out, PLAN)) as fh:
        _whole_plan = Plan.from_dict(json.load(fh))


def no_more() -> None:
    """The shard hook of the rows that start shard processes as the job does: nothing more."""


def write_start_plan(out: str, n: int, classes: int) -> Plan:
    """An OUT holding only the plan of N Kinetics-named videos (under a folder that need not exist) in shards of
    ``VIDEOS_PER_SHARD``, as the job plans them (``make_plan``, written as ``prepare`` writes it)."""
    from convert.format import PLAN, SHARD_DIR
    from convert.format.layout import write_json_atomic
    from convert.worker.plan import ConvertConfig, make_plan
    from convert.worker.sources import Source, VideoItem

    videos = os.path.join(os.path.dirname(os.path.abspath(out)), f"videos_{n}")
    items = [VideoItem(f"y{i:010d}_000000_000010", os.path.join(videos, f"y{i:010d}_000000_000010.mp4"),
                       i % classes) for i in range(n)]
    source = Source(items, [f"class_{c:03d}" for c in range(classes)], [], "csv")
    plan = make_plan(source, ConvertConfig(size=SIZE, clip_len=CLIP_LEN, max_clips=1),
                     math.ceil(n / VIDEOS_PER_SHARD), {"path": videos + ".csv", "videos": videos, "split": None,
                                                       "kind": "csv"})
    os.makedirs(os.path.join(out, SHARD_DIR))
    write_json_atomic(os.path.join(out, PLAN), plan.to_dict(), indent=1)
    return plan


def _proc_kb(pid: int, fields: tuple[str, ...], table: str = "status") -> int:
    """The sum of ``fields`` (in kB) of ``/proc/PID/TABLE``."""
    with open(f"/proc/{pid}/{table}") as fh:
        return sum(int(line.split()[1]) for line in fh if line.split(":")[0] in fields)


def shard_starts(work: str, n: int, args: argparse.Namespace) -> list[dict]:
    """``--shard-starts`` real shard processes on a plan of N videos, each way and memory limit: a row each."""
    from convert.format import PLAN
    from convert.worker.shard_worker import HOOK_ENV, plan_command

    out = os.path.join(work, f"starts_{n}")
    shutil.rmtree(out, ignore_errors=True)
    plan = write_start_plan(out, n, args.classes)
    count = len(plan.shards)
    k = min(args.shard_starts, count)
    indices = sorted({round(j * (count - 1) / max(1, k - 1)) for j in range(k)})  # spread over the plan
    common = {"videos": n, "shards": count, "plan_mb": os.path.getsize(os.path.join(out, PLAN)) / 2**20,
              "shard_plan_kb": len(json.dumps(plan_command(plan.shard(indices[0])))) / 1024}
    hook = os.environ.get(HOOK_ENV)
    rows = []
    try:
        for whole in (True, False):
            # Both ways through a hook of this module: each child imports it, so that costs both alike.
            os.environ[HOOK_ENV] = f"benchmarks.scale:{'parse_whole_plan' if whole else 'no_more'}"
            _start(out, plan, indices[:1], None)  # the fork server started and warm, as a job's is
            for limit in (args.max_memory, None):
                rows.append({**common, "way": "whole plan.json parsed" if whole else "own shard sent",
                             **_start(out, plan, indices, limit)})
    finally:
        if hook is None:
            os.environ.pop(HOOK_ENV, None)
        else:
            os.environ[HOOK_ENV] = hook
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return rows


def _start(out: str, plan: Plan, indices: list[int], limit: int | None) -> dict:
    """Shard processes of ``indices`` started one at a time with ``limit`` (``--max-memory``): their start-up time
    (median), peak RSS and their own memory once ready (not shared with the fork server; the largest of each),
    or the error they died of."""
    from convert.format.units import in_units
    from convert.job.supervise import ShardOptions, _Child

    times, peaks, own, errors = [], [], [], []
    for i in indices:
        shutil.rmtree(plan.shard_path(out, i), ignore_errors=True)  # every start a job's first
        t0 = time.perf_counter()
        child = _Child(out, plan.shard(i), ShardOptions(max_memory=limit))
        try:
            hello = child.read(timeout=600)
            elapsed = time.perf_counter() - t0
            if hello is None or not hello.get("ready"):
                errors.append(child.failure(child.reap()) if hello is None else json.dumps(hello))
                continue
            times.append(elapsed)
            pid = child.proc.pid
            peaks.append(_proc_kb(pid, ("VmHWM",)) / 1024)
            own.append(_proc_kb(pid, ("Private_Clean", "Private_Dirty"), "smaps_rollup") / 1024)
        finally:
            child.kill()
            child.close()
    return {"max_memory": in_units(limit) if limit else "none", "starts": len(indices), "started": len(times),
            "start_s": sorted(times)[len(times) // 2] if times else None,
            "peak_rss_mb": max(peaks) if peaks else None, "own_mb": max(own) if own else None,
            "error": errors[0] if errors else ""}


def _usage_of(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of ``fn()``."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def measure(work: str, n: int, args: argparse.Namespace, bases: list[str], decode_ms: float) -> dict:
    """Every stage for N videos."""
    from convert.store.verify import verify
    from convert.worker.plan import default_shards
    from convert.worker.sources import from_csv

    csv, videos = build(work, n, classes=args.classes, missing=args.missing, bases=bases)
    row: dict = {"videos": n}
    t0 = time.perf_counter()
    source = from_csv(csv, videos)
    row["plan_s"] = time.perf_counter() - t0
    present = len(source.items)
    out = os.path.join(work, f"out_{n}")
    shutil.rmtree(out, ignore_errors=True)
    synthesised = args.synthesise_from is not None and n >= args.synthesise_from
    row["conversion"] = "synthesised" if synthesised else "converted"
    if synthesised:
        row["convert_s"], row["convert_cpu_s"] = _usage_of(
            lambda: synthesise(csv, videos, out, shards=default_shards(present, args.workers)))
        row["convert_peak_rss_mb"] = 0.0  # this process's, not the job's: not comparable
        row["overhead_ms_per_video"] = 1000 * row["convert_cpu_s"] / max(present, 1)
    else:
        row["convert_s"], row["convert_cpu_s"], row["convert_peak_rss_mb"] = run_convert(
            [csv, out, "--videos", videos, "--workers", str(args.workers), *TINY_SETTINGS])
        row["overhead_ms_per_video"] = max(0.0, 1000 * row["convert_cpu_s"] / max(present, 1) - decode_ms)
    row["written_mb"] = _bytes(out) / 2**20
    row["cpu_ms_per_video"] = 1000 * row["convert_cpu_s"] / max(present, 1)
    for name in ("plan.json", "manifest.json", "report.jsonl"):
        row[f"{name}_kb"] = os.path.getsize(os.path.join(out, name)) / 1024
    t0 = time.perf_counter()
    problems, _ = verify(out, workers=args.workers)
    row["verify_s"] = time.perf_counter() - t0
    if problems:
        raise SystemExit(f"scale: verify found problems at N={n}: {problems[0]}")
    run = os.path.join(work, f"run_{n}")
    shutil.rmtree(run, ignore_errors=True)
    shutil.rmtree(run + "_again", ignore_errors=True)
    row.update(_child(STARTUP, out, run))
    cache = os.path.join(work, f"cache_{n}")
    shutil.rmtree(cache, ignore_errors=True)
    row.update(_child(REMOTE, "file://" + os.path.abspath(out), cache))
    if not args.keep:
        for folder in (out, videos, videos + "_copies", run, run + "_again", cache):
            shutil.rmtree(folder, ignore_errors=True)
    return row


STAGES = ("plan_s", "convert_s", "convert_cpu_s", "overhead_ms_per_video", "verify_s", "open_clips_s", "dataset_s",
          "sampler_epoch_s", "trainer_start_s", "checkpoint_load_s", "checkpoint_save_s", "remote_open_s",
          "manifest.json_kb", "plan.json_kb", "report.jsonl_kb", "checkpoint_kb", "reader_rss_growth_mb",
          "reader_heap_mb", "remote_heap_mb", "remote_downloaded_mb", "remote_index_mb")
# Kinetics' training sets (videos annotated), for the projection.
KINETICS = {"Kinetics-400": 240_000, "Kinetics-700": 650_000}


def growth(rows: list[dict]) -> dict[str, float]:
    """Per stage, the exponent of N between the smallest and the largest size (1: linear).

    Conversion figures are fitted over the rows of one kind (converted or synthesised), the largest kind present
    twice; the other stages over every row.
    """
    out = {}
    for key in STAGES:
        fit = rows
        if key in ("convert_s", "convert_cpu_s", "overhead_ms_per_video"):
            kinds = [[r for r in rows if r["conversion"] == kind] for kind in ("synthesised", "converted")]
            fit = next((k for k in kinds if len(k) > 1), [])
        if len(fit) < 2:
            continue
        first, last = fit[0], fit[-1]
        a, b = first[key], last[key]
        if a > 0 and b > 0 and last["videos"] > first["videos"]:
            out[key] = math.log(b / a) / math.log(last["videos"] / first["videos"])
    return out


def linear(rows: list[dict], key: str) -> tuple[float, float]:
    """(fixed cost, cost per video) of a stage, through its two largest sizes: what the projection extends."""
    if len(rows) < 2:
        return 0.0, rows[-1][key] / rows[-1]["videos"]
    (n1, y1), (n2, y2) = ((r["videos"], r[key]) for r in rows[-2:])
    per = max(0.0, (y2 - y1) / (n2 - n1))
    return y2 - per * n2, per


def projection(rows: list[dict], args: argparse.Namespace) -> list[str]:
    """Lines projecting to Kinetics-400/700: conversion on one ``--cores``-core node and on ``--nodes`` of them
    (Dask), reader and trainer start-up, heap, checkpoint and remote open, each extended linearly (``linear``)."""
    converted = [r for r in rows if r["conversion"] == "converted"]
    overhead = (converted or rows)[-1]["overhead_ms_per_video"]
    decode_ms = args.frames_per_video * args.cpu_ms_per_frame
    lines = [f"projection (decoding {args.frames_per_video} frames per video at {args.cpu_ms_per_frame} CPU ms a "
             f"frame plus the job's measured overhead of {overhead:.3g} ms per video; every other stage extended "
             f"linearly through N={rows[-2]['videos'] if len(rows) > 1 else 0} and N={rows[-1]['videos']}):"]
    for name, n in KINETICS.items():
        at = {key: max(rows[-1][key], a + b * n) for key in STAGES for a, b in [linear(rows, key)]}
        node_h = n * (decode_ms + overhead) / 1000 / 3600 / args.cores
        lines.append(
            f"  {name} ({n:,} videos): conversion {node_h:.2f} h on one {args.cores}-core node, "
            f"{node_h / args.nodes:.2f} h on a Dask cluster of {args.nodes}; reader start-up "
            f"{at['open_clips_s'] + at['dataset_s']:.1f} s, heap {at['reader_heap_mb']:.0f} MB; trainer start-up "
            f"{at['trainer_start_s']:.1f} s; checkpoint {at['checkpoint_kb'] / 1024:.1f} MB, loaded in "
            f"{at['checkpoint_load_s']:.2f} s; remote open {at['remote_open_s']:.1f} s")
    return lines


def main(argv: list[str] | None = None) -> int:
    from convert.format.units import in_units, parse_bytes
    from convert.options import MIN_MEMORY

    p = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000,10000", help="video counts, comma-separated (default 1000,10000)")
    p.add_argument("--classes", type=int, default=400, help="classes (default 400, Kinetics-400)")
    p.add_argument("--missing", type=float, default=0.08, help="share of annotated videos absent (default 0.08)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="shard processes (default: cores)")
    p.add_argument("--synthesise-from", type=int, default=None, metavar="N",
                   help="sizes of N videos or more are written by the shard writers without decoding (default: "
                        "every size converted)")
    p.add_argument("--cores", type=int, default=64, help="cores of a node, for the projection (default 64)")
    p.add_argument("--nodes", type=int, default=8, help="nodes of the Dask cluster projected (default 8)")
    p.add_argument("--frames-per-video", type=int, default=300,
                   help="frames decoded per real video, for the projection (default 300: 10 s at 30 fps)")
    p.add_argument("--cpu-ms-per-frame", type=float, default=0.636,
                   help="CPU ms to convert one real frame, for the projection (default 0.636: LMDB raw, "
                        "docs/benchmarks.md)")
    p.add_argument("--work", default="scale_work", help="scratch folder (default scale_work)")
    p.add_argument("--keep", action="store_true", help="keep each size's videos and conversion")
    p.add_argument("--shard-starts", type=int, default=3, metavar="K",
                   help="shard processes started per size, way and memory limit (default 3; 0: none)")
    p.add_argument("--max-memory", type=parse_bytes, default=MIN_MEMORY, metavar="BYTES",
                   help=f"the shard starts' --max-memory (default {in_units(MIN_MEMORY)}, the least convert takes)")
    p.add_argument("--only-shard-starts", action="store_true",
                   help="measure the shard starts alone (they need a plan, no videos)")
    args = p.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    if not sizes or sizes[0] < 10 or args.classes < 1 or not 0 <= args.missing < 1 or args.workers < 1 \
            or args.cores < 1 or args.nodes < 1 or args.shard_starts < int(args.only_shard_starts):
        p.error("--sizes of at least 10 videos, --classes >= 1, --missing in [0, 1), --workers, --cores and "
                "--nodes >= 1, --shard-starts >= 1 with --only-shard-starts")
    os.makedirs(args.work, exist_ok=True)
    if not args.only_shard_starts:
        stages(args, sizes)
    if args.shard_starts:
        starts = [row for n in sizes for row in shard_starts(args.work, n, args)]
        print(f"\nshard start-up: {args.shard_starts} shard process(es) per row, one at a time, forked as the job "
              f"forks them; plans in shards of {VIDEOS_PER_SHARD} videos\n")
        keys = ["videos", "shards", "plan_mb", "shard_plan_kb", "way", "max_memory", "started", "start_s",
                "peak_rss_mb", "own_mb", "error"]
        print("| " + " | ".join(keys) + " |")
        print("|" + "---|" * len(keys))
        for row in starts:
            print("| " + " | ".join(f"{row[k]:.3g}" if isinstance(row[k], float) else f"{row[k]}/{row['starts']}"
                                    if k == "started" else "-" if row[k] is None else str(row[k]) for k in keys)
                  + " |")
    return 0


def stages(args: argparse.Namespace, sizes: list[int]) -> None:
    """Every stage at every size, printed as JSON rows, a table, their growth and the projection."""
    bases = base_videos(args.work)
    decode_ms = decode_ms_per_video(bases)
    rows = []
    for n in sizes:
        rows.append(measure(args.work, n, args, bases, decode_ms))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.classes} classes, {args.missing:.0%} of the annotated videos missing, {args.workers} shard "
          f"process(es); decoding a base video alone: {decode_ms:.3g} CPU ms\n")
    keys = ["videos", "conversion", *STAGES, "cpu_ms_per_video", "convert_peak_rss_mb", "written_mb"]
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
    print()
    print("\n".join(projection(rows, args)))


if __name__ == "__main__":
    raise SystemExit(main())
