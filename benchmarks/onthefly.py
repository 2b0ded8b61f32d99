"""``OnTheFlyVideoDataset``: the baseline this project replaces, decoding videos in ``__getitem__``.

One item per video: decode with PyAV (the converter's own decoder, frames
resized to ``size`` as the shards store them), take a ``clip_len`` window,
then apply the same ``ClipPreset`` as ``ClipDataset``. It exists to be
measured against (``python -m benchmarks.loaders``): a benchmark's baseline,
not part of the installed packages.

Training picks a random window from the container's frame-count estimate and
decodes from the start only up to the window's end (no seeking: keyframe
seeks are approximate, and short Kinetics clips are usually read from the
start). Evaluation decodes the whole video and takes the exact centre window.
A video shorter than ``clip_len`` is looped.
"""

from __future__ import annotations

import operator
from collections import deque
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from convert.format import FormatError
from convert.worker.decode import FrameSpec, VideoDecoder, VideoError
from convert.worker.sources import load_source
from loaders.keyed import KeyedDraws
from loaders.presets import ClipPreset


class OnTheFlyVideoDataset(Dataset):
    """Videos of a source (folder of class folders, Kinetics CSV with ``videos``, or list file).

    Items are ``i`` or ``(epoch, i)`` and come back as ``ClipDataset``'s do:
    ``{"clip", "label", "video_id", "clip_index" (always 0), "index"}``.
    """

    def __init__(self, src: str, *, train: bool, preset: ClipPreset | None = None, clip_len: int = 16,
                 size: tuple[int, int] = (128, 171), videos: str | None = None, seed: int = 0,
                 threads: int = 1) -> None:
        if not isinstance(clip_len, int) or clip_len < 1:
            raise ValueError(f"clip_len must be an int >= 1, got {clip_len!r}")
        if preset is None:
            preset = ClipPreset(train=train, seed=seed)
        elif preset.train != train:
            raise ValueError(f"train={train} but the preset has train={preset.train}")
        source = load_source(src, videos=videos)
        if not source.items:
            raise FormatError(f"{src}: no usable videos ({len(source.problems)} rejected or missing)")
        self.items = source.items
        self.classes: list[str] = source.classes
        self.problems = source.problems
        self.train = train
        self.preset = preset
        self.clip_len = clip_len
        self.seed = seed
        height, width = size
        self.spec = FrameSpec(size=(height, width), threads=threads)
        self.epoch = 0
        self.clip_shape = preset.out_shape(clip_len)
        preset.params(0, 0, (clip_len, height, width))  # fail now if the crop cannot fit

    def __len__(self) -> int:
        return len(self.items)

    def set_epoch(self, epoch: int) -> None:
        """Epoch used for plain int items."""
        self.epoch = int(epoch)

    def labels(self) -> np.ndarray:
        """Label of every video, in index order."""
        return np.asarray([it.label for it in self.items], dtype=np.int64)

    def video_index(self) -> np.ndarray:
        """One item per video: item i is video i."""
        return np.arange(len(self.items))

    def window(self, i: int, epoch: int = 0) -> tuple[int, np.ndarray]:
        """(first frame, uint8 (clip_len, H, W, 3) frames) of video ``i`` before the preset."""
        item = self.items[i]
        try:
            with VideoDecoder(item.path, self.spec) as dec:
                if self.train:
                    estimate = dec.probe().frames_estimate
                    # A stream of its own, so the window does not shift the preset's draws.
                    t0 = KeyedDraws(self.seed, int(epoch), int(i), 1).integers(max(estimate - self.clip_len, 0) + 1)
                    kept: deque = deque(maxlen=self.clip_len)
                    seen = 0
                    for frame in dec:
                        kept.append(frame)
                        seen += 1
                        if seen >= t0 + self.clip_len:
                            break
                    frames = list(kept)
                    t0 = seen - len(frames)  # the estimate may have been long: the last frames then
                else:
                    frames = list(dec)
                    t0 = max(0, round((len(frames) - self.clip_len) / 2.0))
                    frames = frames[t0:t0 + self.clip_len]
        except VideoError as exc:
            raise FormatError(f"{item.path}: {exc}") from exc
        if not frames:
            raise FormatError(f"{item.path}: no frames decoded")
        while len(frames) < self.clip_len:
            frames = frames + frames[: self.clip_len - len(frames)]
        return t0, np.stack(frames)

    def __getitem__(self, item: Any) -> dict:
        if isinstance(item, (tuple, list)):
            epoch, i = operator.index(item[0]), operator.index(item[1])
        else:
            epoch, i = self.epoch, operator.index(item)
        if not 0 <= i < len(self.items):
            raise IndexError(f"video {i} out of range for {len(self.items)} videos")
        _, frames = self.window(i, epoch)
        clip = self.preset.apply(frames, self.preset.params(epoch, i, frames.shape))
        return {"clip": torch.from_numpy(clip), "label": int(self.items[i].label),
                "video_id": self.items[i].id, "clip_index": 0, "index": i}


__all__ = ["OnTheFlyVideoDataset"]
