"""A small labelled video dataset the project makes itself: no downloads.

Each class is a direction of motion (a textured square drifting right, left,
up, down, or spinning in place). Colours, textures, positions, speeds, frame
sizes and frame rates are random per video and shared by all classes, so no
single frame tells the class: a model has to look at motion. The files are
real h264 MP4s written by PyAV, at several sizes and frame rates, so the
conversion path is exercised as on real data.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING

import av
import numpy as np

if TYPE_CHECKING:
    from .worker.plan import ConvertConfig

CLASSES = ("move_down", "move_left", "move_right", "move_up", "spin")
SIZES = ((240, 320), (256, 340), (180, 320), (288, 352))
RATES = (Fraction(25), Fraction(30000, 1001), Fraction(30))
_DIRS = {"move_right": (0, 1), "move_left": (0, -1), "move_down": (1, 0), "move_up": (-1, 0), "spin": (0, 0)}


def render(cls: str, rng: np.random.Generator, n_frames: int, height: int, width: int) -> np.ndarray:
    """(n_frames, H, W, 3) uint8 frames of one video of class ``cls``."""
    yy, xx = np.mgrid[0:height, 0:width]
    bg_col = rng.integers(0, 256, 3)
    fg_col = rng.integers(0, 256, 3)
    bg_noise = rng.integers(-20, 21, (height, width, 1))
    side = int(rng.integers(height // 4, height // 2))
    speed = float(rng.uniform(2.0, 5.0)) * height / 240
    dy, dx = _DIRS[cls]
    cy = rng.uniform(side, height - side)
    cx = rng.uniform(side, width - side)
    # Start where the motion has room to run for the whole video.
    travel = speed * n_frames
    if dx:
        cx = float(np.clip(width / 2 - dx * travel / 2, side / 2, width - side / 2))
    if dy:
        cy = float(np.clip(height / 2 - dy * travel / 2, side / 2, height - side / 2))
    stripes = rng.integers(4, 12)
    frames = np.empty((n_frames, height, width, 3), np.uint8)
    for t in range(n_frames):
        y0, x0 = cy + dy * speed * t, cx + dx * speed * t
        ang = 0.15 * t if cls == "spin" else 0.0
        ry = (yy - y0) * np.cos(ang) - (xx - x0) * np.sin(ang)
        rx = (yy - y0) * np.sin(ang) + (xx - x0) * np.cos(ang)
        inside = (np.abs(ry) < side / 2) & (np.abs(rx) < side / 2)
        texture = ((rx // max(side // stripes, 1)) % 2).astype(np.int64)[..., None]
        img = np.clip(bg_col + bg_noise, 0, 255)
        fg = np.clip(fg_col * (0.6 + 0.4 * texture), 0, 255)
        img = np.where(inside[..., None], fg, img)
        frames[t] = img.astype(np.uint8)
    return frames


def write_mp4(path: str, frames: np.ndarray, rate: Fraction) -> None:
    """Encode frames as h264 (yuv420p) in MP4, as most real datasets are."""
    with av.open(path, "w") as out:
        stream = out.add_stream("libx264", rate=rate)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "20", "preset": "veryfast", "tune": "zerolatency"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def _render_to(path: str, cls: str, seed: int, n: int, height: int, width: int, rate: Fraction) -> None:
    tmp = path + ".part.mp4"
    write_mp4(tmp, render(cls, np.random.default_rng(seed), n, height, width), rate)
    os.replace(tmp, path)


def make_dataset(root: str, *, per_class: int = 8, seconds: float = 2.0, seed: int = 0,
                 classes: tuple[str, ...] = CLASSES, workers: int = 1) -> list[str]:
    """Write ``root/<class>/<class>_<k>.mp4``; returns the paths. Skips files already there.

    Every video's size, rate, length and content are drawn from ``seed`` in
    one sequence, so ``workers`` (videos rendered in parallel through joblib)
    changes nothing but the time it takes.
    """
    rng = np.random.default_rng(seed)
    paths, todo = [], []
    for cls in classes:
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        for k in range(per_class):
            h, w = SIZES[int(rng.integers(len(SIZES)))]
            rate = RATES[int(rng.integers(len(RATES)))]
            n = max(1, round(seconds * float(rate) * rng.uniform(0.8, 1.25)))
            sub = int(rng.integers(1 << 62))
            path = os.path.join(root, cls, f"{cls}_{k:03d}.mp4")
            if not os.path.exists(path):
                todo.append((path, cls, sub, n, h, w, rate))
            paths.append(path)
    if workers > 1 and len(todo) > 1:
        from joblib import Parallel, delayed

        Parallel(n_jobs=min(workers, len(todo)))(delayed(_render_to)(*job) for job in todo)
    else:
        for job in todo:
            _render_to(*job)
    return paths


def synthetic_conversions(root: str, configs: Mapping[str, ConvertConfig], *, per_class: int,
                          seconds: float = 2.0, seed: int = 0, videos: str = "videos", workers: int = 0,
                          shards: int | None = None, progress: bool = False,
                          report: Callable[[str, str, dict], None] | None = None) -> dict[str, str]:
    """The project's synthetic datasets, converted: the one builder the demo, benchmarks, checks and tests use.

    Makes ``per_class`` videos per motion class under ``root/<videos>`` (once)
    and converts them with each named config into ``root/clips_<name>``; a
    finished conversion there is reused as it is. Returns ``{"videos": the
    video folder, name: conversion folder, ...}``. ``workers``: processes for
    rendering and converting (0: every core). ``report(name, folder, result)``
    is called after each conversion this call runs (``run_job``'s result).
    """
    from .format.system import cpu_count
    from .job.run import JobOptions, run_job

    src = os.path.join(root, videos)
    make_dataset(src, per_class=per_class, seconds=seconds, seed=seed, workers=workers or cpu_count())
    out = {"videos": src}
    for name, config in configs.items():
        dst = out[name] = os.path.join(root, f"clips_{name}")
        if not os.path.exists(os.path.join(dst, "manifest.json")):
            result = run_job(src, dst, config, JobOptions(workers=workers, shards=shards, progress=progress))
            if report is not None:
                report(name, dst, result)
    return out
