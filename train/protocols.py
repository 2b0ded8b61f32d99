"""Evaluation protocols: which views of each video are scored (``--eval-protocol``).

``clips`` scores every stored clip with one centre crop. ``NxM`` (the
protocols papers report: 10x3, 4x3, 5x3, 2x3, 8x1...) scores N temporal
views of each video (uniformly spaced stored clips, or with ``--sampling
window`` or ``segments`` N samples of the video's timeline spread evenly)
times M spatial crops: 1 (the centre), 3 (along the frame's long side) or
10 (the corners and the centre, each also flipped: TSN's 25x10).
``10x3`` takes its N from ``--eval-clips``, as before the other values
existed. The video score is the mean softmax over a video's views.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

SPATIAL = (1, 3, 10)
_NXM = re.compile(r"([1-9][0-9]{0,3})x([0-9]+)")


def parse_protocol(text: str) -> str:
    """``--eval-protocol``'s value checked: ``clips`` or ``NxM`` (N views in 1..9999, M spatial crops in
    ``SPATIAL``); an ArgumentTypeError in one line otherwise."""
    m = _NXM.fullmatch(text)
    if text == "clips" or (m is not None and int(m.group(2)) in SPATIAL):
        return text
    why = (f"{m.group(2)} spatial crops is not one of {', '.join(map(str, SPATIAL))}"
           if m is not None else "expected clips or NxM, e.g. 10x3, 4x3, 2x3, 8x1")
    raise argparse.ArgumentTypeError(f"--eval-protocol {text}: {why}")


def protocol_views(name: str, eval_clips: int) -> tuple[int, int]:
    """(temporal views per video, spatial crops) of protocol ``name`` (``clips``: (1, 1), one view of each
    stored clip); ``10x3`` takes its views from ``eval_clips``."""
    if name == "clips":
        return 1, 1
    parse_protocol(name)
    n, m = (int(part) for part in name.split("x"))
    return (eval_clips if name == "10x3" else n), m


def describe_protocol(name: str, clips_per_video: int, crop_size: int, spec: Any = None) -> dict[str, Any]:
    """The evaluation protocol as it goes into the console line and ``eval/*.json``; ``spec`` the samples'
    ``SampleSpec`` where they are samples of videos (``--sampling window`` or ``segments``)."""
    views, crops = protocol_views(name, clips_per_video)
    where = {1: "centred", 3: "along the long side", 10: "at the corners and centre, each also flipped"}[crops]
    if spec is not None:
        what = {"window": f"{spec.views} {spec.frames}x{spec.step} window(s) spread evenly",
                "segments": f"{spec.frames} segments, {spec.views} frame(s) of each spread evenly"}[spec.rule]
        return {"name": f"{spec.views}x{crops}", "clips_per_video": spec.views, "spatial_crops": crops,
                "crop_size": crop_size, "sampling": spec.to_dict(),
                "text": f"per video {what} x {crops} {crop_size}x{crop_size} crop{'s' if crops > 1 else ''}"
                        f" {where}; video score = mean softmax"}
    if name == "clips":
        return {"name": "clips", "clips_per_video": "all", "spatial_crops": 1, "crop_size": crop_size,
                "text": f"every stored clip, centre {crop_size}x{crop_size} crop; video score = mean softmax"}
    return {"name": f"{views}x{crops}", "clips_per_video": views, "spatial_crops": crops,
            "crop_size": crop_size,
            "text": f"{views} uniformly spaced stored clips per video (all when fewer) x {crops} spatial "
                    f"{crop_size}x{crop_size} crop{'s' if crops > 1 else ''} {where}; video score = mean softmax"}


def multiview_items(video_clips: Sequence[int], clips_per_video: int, crops: int = 3) -> list[tuple[int, int]]:
    """(spatial crop, clip index) of every view: per video, ``clips_per_video`` uniformly spaced clips x crops.

    Clip ``j`` of ``N`` in a video of ``n`` clips is the one at ``(2j + 1) n // 2N`` (the centres of N
    equal parts), so N distinct clips when ``n >= N``; all ``n`` clips otherwise.
    """
    items: list[tuple[int, int]] = []
    start = 0
    for n in (int(c) for c in video_clips):
        picks = range(n) if n <= clips_per_video else [(2 * j + 1) * n // (2 * clips_per_video)
                                                       for j in range(clips_per_video)]
        items += [(s, start + c) for c in picks for s in range(crops)]
        start += n
    return items
