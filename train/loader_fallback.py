"""Stand-in for the ``loaders`` training API while it is being written elsewhere.

``train.data`` imports ``ClipPreset``, ``LmdbClipDataset``,
``DistributedClipSampler``, ``build_loader`` and ``to_model_input`` from
``loaders`` and falls back to this module only when ``loaders`` does not have
them yet. It follows the agreed contract in the simplest way (uint8 crop and
flip keyed by (seed, epoch, index), standard interleaved rank split) so the
trainer can be built and tested before the real readers land. Delete it, and
the fallback import in ``train.data``, once ``loaders`` provides the API.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from loaders import open_clips

# Kinetics-400 statistics in 0..255 units (as torchvision's video models use).
KINETICS_MEAN = (110.2008, 100.63983, 95.99475)
KINETICS_STD = (58.14765, 56.46975, 55.332195)


@dataclass
class ClipPreset:
    """Crop size, clip length, flip and normalisation shared by every reader."""

    train: bool
    crop_size: int = 112
    clip_len: int | None = None
    flip: bool = True
    multiscale: tuple[float, ...] | None = None
    mean: tuple[float, ...] = KINETICS_MEAN
    std: tuple[float, ...] = KINETICS_STD
    seed: int = 0

    def apply(self, clip: np.ndarray, epoch: int, index: int) -> np.ndarray:
        t, h, w, _ = clip.shape
        size = self.crop_size
        if size > h or size > w:
            raise ValueError(f"crop {size} larger than stored frames {h}x{w}")
        length = self.clip_len or t
        if self.train:
            rng = np.random.default_rng([self.seed, epoch, index])
            t0 = int(rng.integers(0, t - length + 1))
            y0 = int(rng.integers(0, h - size + 1))
            x0 = int(rng.integers(0, w - size + 1))
            flip = self.flip and bool(rng.integers(0, 2))
        else:
            t0, y0, x0, flip = (t - length) // 2, (h - size) // 2, (w - size) // 2, False
        out = clip[t0:t0 + length, y0:y0 + size, x0:x0 + size]
        if flip:
            out = out[:, :, ::-1]
        return np.ascontiguousarray(out)


class LmdbClipDataset(Dataset):
    """Clips of a conversion as dicts; items are ``i`` or ``(epoch, i)``."""

    def __init__(self, root: str, *, train: bool, preset: ClipPreset | None = None, crop_size: int = 112,
                 clip_len: int | None = None, seed: int = 0) -> None:
        self.store = open_clips(root)
        self.preset = preset or ClipPreset(train=train, crop_size=crop_size, clip_len=clip_len, seed=seed)
        self.classes = self.store.classes

    def __len__(self) -> int:
        return len(self.store)

    def labels(self) -> np.ndarray:
        return self.store.labels()

    def video_index(self) -> np.ndarray:
        return self.store.video_index()

    def __getitem__(self, item) -> dict:
        epoch, i = item if isinstance(item, tuple) else (0, item)
        s = self.store[int(i)]
        clip = self.preset.apply(s.clip, int(epoch), int(i))
        return {"clip": torch.from_numpy(clip), "label": int(s.label), "video_id": s.video_id,
                "clip_index": int(s.clip_index), "index": int(i)}


class DistributedClipSampler(Sampler):
    """Shuffled by (seed, epoch); rank r takes every R-th index; resumable by position."""

    def __init__(self, n_or_labels, *, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, balanced: bool = False,
                 with_epoch: bool = True) -> None:
        self.n = n_or_labels if isinstance(n_or_labels, int) else len(n_or_labels)
        if num_replicas is None or rank is None:
            dist = torch.distributed
            ready = dist.is_available() and dist.is_initialized()
            num_replicas = dist.get_world_size() if ready else 1
            rank = dist.get_rank() if ready else 0
        self.replicas, self.rank, self.shuffle, self.seed = num_replicas, rank, shuffle, seed
        self.drop_last, self.with_epoch = drop_last, with_epoch
        self.epoch, self.position = 0, 0
        per = self.n // num_replicas if drop_last else math.ceil(self.n / num_replicas)
        self.num_samples = per

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def set_position(self, position: int) -> None:
        self.position = position

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        total = self.num_samples * self.replicas
        order = order[:total] if self.drop_last else (order * math.ceil(total / max(self.n, 1)))[:total]
        return order[self.rank:total:self.replicas]

    def __iter__(self) -> Iterator:
        for i in self.indices()[self.position:]:
            yield (self.epoch, i) if self.with_epoch else i

    def __len__(self) -> int:
        return self.num_samples


def build_loader(dataset: Dataset, *, batch_size: int, sampler: Sampler | None = None, train: bool = True,
                 workers: int | None = None, pin_memory: bool | None = None, persistent_workers: bool = True,
                 prefetch_factor: int = 4, drop_last: bool | None = None,
                 start_method: str | None = None) -> DataLoader:
    workers = 0 if workers is None else workers
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                      pin_memory=bool(pin_memory) if pin_memory is not None else torch.cuda.is_available(),
                      persistent_workers=persistent_workers and workers > 0,
                      prefetch_factor=prefetch_factor if workers > 0 else None,
                      drop_last=train if drop_last is None else drop_last,
                      multiprocessing_context=start_method if workers > 0 else None)


def to_model_input(clips: torch.Tensor, *, mean: Sequence[float], std: Sequence[float],
                   device: torch.device | str | None = None, channels_last: bool = False,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    x = clips.to(device, non_blocking=True) if device is not None else clips
    x = x.permute(0, 4, 1, 2, 3).to(dtype)
    shape = (1, -1, 1, 1, 1)
    x = (x - torch.tensor(mean, dtype=dtype, device=x.device).view(shape)) / torch.tensor(
        std, dtype=dtype, device=x.device).view(shape)
    return x.contiguous(memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)
