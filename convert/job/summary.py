"""What a finished job prints: the summary of its result and the first problems of its report."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from ..format import REPORT


def describe_shape(clip_shape: Sequence[int] | None, clip_len: int, short_side: int | None) -> str:
    """A clip's shape in words: fixed ``16 x 128 x 171 x 3``, or ``16 x short side 120 x 3, ...``."""
    if clip_shape:
        return " x ".join(str(n) for n in clip_shape)
    return f"{clip_len} x short side {short_side} x 3, the long side varies with each video's aspect"


def _shape_of(result: dict) -> str:
    if result.get("clip_shape"):
        return describe_shape(result["clip_shape"], 0, None)
    return describe_shape(None, result["clip"]["clip_len"], result["frame_size"]["short_side"])


PROBLEM_STATUSES = ("failed", "partial", "missing", "rejected")
# Not converted either, by the --short policy's choice: listed after the problems, so these come first.
SKIPPED_STATUSES = ("short",)


def first_problems(out: str, n: int = 5) -> tuple[list[dict], int]:
    """The first ``n`` records of report.jsonl of videos not converted whole, and how many there are.

    The problems (``PROBLEM_STATUSES``) come first, then the videos skipped
    as too short: every video the summary's counts show as not converted is
    listed or counted. A ``padded`` video is converted (its clips looped or
    padded), so it is neither.
    """
    problems: list[dict] = []
    skipped: list[dict] = []
    total = 0
    try:
        with open(os.path.join(out, REPORT)) as fh:
            for line in fh:
                rec = json.loads(line)
                status = rec.get("status")
                if status in PROBLEM_STATUSES or status in SKIPPED_STATUSES:
                    total += 1
                    kept = problems if status in PROBLEM_STATUSES else skipped
                    if len(kept) < n:
                        kept.append(rec)
    except (OSError, ValueError):
        pass  # the summary above still holds; the report's own problem shows when it is opened
    return (problems + skipped)[:n], total


def print_summary(out: str, result: dict, as_json: bool) -> None:
    """Print the result of ``run_job`` (plus an upload's counts): counts by status, clips, time, the first
    videos not converted whole with their reasons, where everything is; or, ``as_json``, the result as JSON."""
    if as_json:
        print(json.dumps(result, indent=1))
        return
    st = result["status_counts"]
    tot = result["totals"]
    short = st.get("short", 0) + st.get("padded", 0)
    if result.get("already_complete"):
        print(f"{out}: already complete, nothing to do")
    secs = result.get("seconds", 0.0)
    # A partial video is not a failed one: its clips before the damage are stored and read.
    print(f"videos: {st.get('ok', 0)} ok, {short} short ({st.get('padded', 0)} padded), "
          f"{st.get('partial', 0)} partial (clips kept up to the damage), {st.get('failed', 0)} failed, "
          f"{st.get('missing', 0)} missing, {st.get('rejected', 0)} rejected")
    print(f"clips:  {tot['clips']} in {len(result['shards'])} {result['backend']} shard(s), codec {result['codec']}, "
          f"shape {_shape_of(result)}, {tot['value_bytes'] / 2**20:.1f} MiB")
    if secs:
        # Only what this run converted: a rerun after a kill must not count the clips before it.
        new = result.get("converted", {}).get("clips", tot["clips"])
        print(f"time:   {secs:.1f} s, {new} clips converted in this run, {new / secs:.1f} clips/s")
    if "uploaded" in result:
        print(f"upload: {result['uploaded']} file(s) uploaded, {result.get('already_there', 0)} already there with "
              f"the same content, {result.get('removed', 0)} object(s) removed")
    report = os.path.join(out, REPORT)
    # OUT a URL: the report is read from the staging folder, where the job wrote it before the upload.
    problems, total = first_problems(result.get("staging", out))
    if problems:
        print(f"not converted, or only partly ({total}; all in {report}):")
        for rec in problems:
            print(f"  {rec['status']}: {rec['path']}: {rec['reason']}")
        if total > len(problems):
            print(f"  ... and {total - len(problems)} more")
    print(f"shards: {os.path.join(out, 'shards')}  manifest: {os.path.join(out, 'manifest.json')}  "
          f"report: {report}")


__all__ = ["PROBLEM_STATUSES", "SKIPPED_STATUSES", "describe_shape", "first_problems", "print_summary"]
