"""``python -m benchmarks.forkserver``: one production-sized shard converted with the fork server and without.

The fork server (``convert/worker/forkserver.py``) spares each shard process
and the space check's probe process the start of an interpreter and its
imports. Without it (``CONVERT_FORKSERVER=0``, the plain way it replaces)
each is started as ``python -m convert.worker.<module>``. The saving is paid
once per process, not per video, so what it is worth depends on the videos
a shard holds: in production, 1,000 (``convert.worker.plan.default_shards``).

This converts one shard of ``--videos`` videos both ways in the same run,
paired: each round runs both, the first of the pair alternating between
rounds. The videos are the scale benchmark's (a few real H.264 videos
hard-linked under many ids) converted with its settings, the least work per
video (``benchmarks.scale.TINY_SETTINGS``), so the fixed saving weighs the
most it can; on real footage its share is smaller. The two conversions must
be the same bytes (their content fingerprints are compared).

Printed: each run's wall and CPU seconds (every process of the job), then
the medians, the ratio fork server / plain, the saving per video and as a
share of the whole job. Nothing here asserts a figure; docs/benchmarks.md
records the output.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics

from benchmarks.scale import TINY_SETTINGS, base_videos, build, run_convert

MODES = {"fork server": "1", "plain": "0"}


def convert_once(work: str, csv: str, videos: str, mode: str) -> tuple[float, float, str]:
    """One conversion of the whole set into one shard, ``mode`` of ``MODES``: (wall s, CPU s, fingerprint)."""
    from convert.format import read_manifest

    out = os.path.join(work, "out")
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, CONVERT_FORKSERVER=MODES[mode])
    wall, cpu, _ = run_convert([csv, out, "--videos", videos, "--workers", "1", "--shards", "1", *TINY_SETTINGS],
                               env=env)
    fingerprint = read_manifest(out).fingerprint or ""
    shutil.rmtree(out)
    return wall, cpu, fingerprint


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.forkserver", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--videos", type=int, default=1000, help="videos in the shard (default 1000, production's)")
    p.add_argument("--rounds", type=int, default=3, help="pairs of runs (default 3)")
    p.add_argument("--work", default="forkserver_work", help="scratch folder (default forkserver_work)")
    args = p.parse_args(argv)
    if args.videos < 1 or args.rounds < 1:
        p.error("--videos and --rounds of at least 1")
    os.makedirs(args.work, exist_ok=True)
    csv, videos = build(args.work, args.videos, classes=5, missing=0.0, bases=base_videos(args.work))
    runs: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    fingerprints = set()
    print(f"one shard of {args.videos} videos, {args.rounds} rounds\n")
    print("| round | mode | wall s | CPU s |\n|---|---|---:|---:|")
    for r in range(args.rounds):
        for mode in (list(MODES) if r % 2 == 0 else list(MODES)[::-1]):
            wall, cpu, fingerprint = convert_once(args.work, csv, videos, mode)
            runs[mode].append((wall, cpu))
            fingerprints.add(fingerprint)
            print(f"| {r + 1} | {mode} | {wall:.2f} | {cpu:.2f} |", flush=True)
    if len(fingerprints) != 1:
        raise SystemExit(f"forkserver: the two ways wrote different conversions: {sorted(fingerprints)}")
    print("\n| median | wall s | CPU s |\n|---|---:|---:|")
    median = {mode: tuple(statistics.median(run[k] for run in runs[mode]) for k in (0, 1)) for mode in MODES}
    for mode in MODES:
        print(f"| {mode} | {median[mode][0]:.2f} | {median[mode][1]:.2f} |")
    fork, plain = median["fork server"], median["plain"]
    for k, what in enumerate(("wall", "CPU")):
        saving = plain[k] - fork[k]
        print(f"{what}: fork server / plain {fork[k] / plain[k]:.4f}; saving {saving:+.3f} s a job, "
              f"{1000 * saving / args.videos:+.3f} ms a video, {saving / plain[k]:+.2%} of the whole job")
    shutil.rmtree(videos)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
