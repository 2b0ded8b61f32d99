"""Evaluation protocols: which stored clips and crops of each video are scored (``--eval-protocol``).

``clips`` scores every stored clip with one centre crop; ``10x3`` scores
``--eval-clips`` uniformly spaced stored clips per video, each with three
crops along the frame's long side, as papers report. The video score is the
mean softmax over a video's views either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PROTOCOLS = ("clips", "10x3")


def describe_protocol(name: str, clips_per_video: int, crop_size: int, spec: Any = None) -> dict[str, Any]:
    """The evaluation protocol as it goes into the console line and ``eval/*.json``; ``spec`` the samples'
    ``SampleSpec`` where they are samples of videos (``--sampling window`` or ``segments``)."""
    if spec is not None:
        crops = 1 if name == "clips" else 3
        views = {"window": f"{spec.views} {spec.frames}x{spec.step} window(s) spread evenly",
                 "segments": f"{spec.frames} segments, the centre frame of each"}[spec.rule]
        return {"name": f"{spec.views}x{crops}", "clips_per_video": spec.views, "spatial_crops": crops,
                "crop_size": crop_size, "sampling": spec.to_dict(),
                "text": f"per video {views} x {crops} {crop_size}x{crop_size} crop(s)"
                        f"{' along the long side' if crops == 3 else ', centred'}; video score = mean softmax"}
    if name == "clips":
        return {"name": "clips", "clips_per_video": "all", "spatial_crops": 1, "crop_size": crop_size,
                "text": f"every stored clip, centre {crop_size}x{crop_size} crop; video score = mean softmax"}
    return {"name": f"{clips_per_video}x3", "clips_per_video": clips_per_video, "spatial_crops": 3,
            "crop_size": crop_size,
            "text": f"{clips_per_video} uniformly spaced stored clips per video (all when fewer) x 3 spatial "
                    f"{crop_size}x{crop_size} crops along the long side; video score = mean softmax"}


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
