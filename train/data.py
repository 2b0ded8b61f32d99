"""The seam between the trainer and the readers in ``loaders`` (LMDB) or ``loaders.dali``.

The trainer sees a ``TrainData``: batches of ``{"clip": uint8 (N, T, H, W, C),
"label", "video_id", "index", ...}`` for one optimizer step, plus the sampler
controls exact resume needs (``set_epoch``, ``set_position``,
``state_dict``). Evaluation gets an ``EvalData`` over a fixed, unpadded split
of the clips by rank, so gathered results hold each clip exactly once.
"""

from __future__ import annotations

import importlib.util
import os
import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
from torch.utils.data import Sampler

from loaders import (ClipPreset, DatasetError, DistributedClipSampler, LmdbClipDataset, build_loader, loader_meter,
                     to_model_input)

from .dist import DistInfo
from .errors import TrainError

__all__ = ["ClipPreset", "EvalData", "TrainData", "build_eval_data", "build_train_data", "check_dataset",
           "to_model_input"]


def check_dataset(root: str | None, what: str) -> str:
    """The folder, or a one-line error when it is not a finished conversion."""
    if not root:
        raise TrainError(f"{what}: no folder given")
    if not os.path.isfile(os.path.join(root, "manifest.json")):
        raise TrainError(f"{what} {root}: manifest.json missing (not a finished conversion; "
                         f"run python -m convert SRC {root} first)")
    return root


class RankSplit(Sampler):
    """Clips ``rank, rank + world, ...``: every clip on exactly one rank, no padding."""

    def __init__(self, n: int, rank: int, world: int) -> None:
        self.ids = list(range(rank, n, world))

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class TrainData:
    """Training batches (one optimizer step each) and the sampler state behind them."""

    loader: Any
    sampler: Any
    classes: list[str]
    mean: Sequence[float]
    std: Sequence[float]
    batch_size: int
    steps_per_epoch: int
    extra: dict = field(default_factory=dict)
    meter: Any = None  # loaders.loader_meter(loader), made on first use

    def loader_stats(self) -> dict:
        """The loader's own clips/s and queue depth since the last call (``loaders.loader_meter``)."""
        if self.meter is None:
            self.meter = loader_meter(self.loader)
        return self.meter()

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def set_position(self, position: int) -> None:
        self.sampler.set_position(position)

    def state_dict(self, consumed: int) -> dict:
        """``{"epoch", "position"}`` with ``consumed`` samples of this rank's epoch used (prefetch runs ahead)."""
        return self.sampler.state_dict(consumed=consumed)

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)

    def __iter__(self) -> Iterator[dict]:
        # DataLoader draws its workers' base seed from the global torch RNG when
        # an iterator starts; forking keeps that draw out of the stream dropout
        # uses, so a resumed run sees the same dropout masks as an unbroken one.
        with torch.random.fork_rng(devices=[]):
            it = iter(self.loader)
        return it


@dataclass
class EvalData:
    loader: Any
    classes: list[str]
    mean: Sequence[float]
    std: Sequence[float]
    num_clips: int


def make_preset(args, train: bool) -> Any:
    kwargs: dict[str, Any] = {"train": train, "crop_size": args.crop_size, "clip_len": args.clip_len,
                              "seed": args.seed}
    if train:
        kwargs["flip"] = not args.no_flip
    return ClipPreset(**kwargs)


def dali_installed() -> bool:
    """Whether ``nvidia.dali`` can be imported (looked up, not imported: importing it is slow)."""
    return importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None


def dali_builder():
    """``loaders.dali.build_dali_loader``, or a one-line error when DALI or the module is missing."""
    if not dali_installed():
        raise TrainError("--loader dali needs NVIDIA DALI, which is not installed "
                         "(pip install nvidia-dali-cuda120, or use --loader lmdb)")
    try:
        from loaders.dali import build_dali_loader
    except ImportError as exc:
        raise TrainError(f"--loader dali: loaders.dali.build_dali_loader is not available ({exc})") from exc
    return build_dali_loader


def _dali_device(info: DistInfo) -> int | None:
    # DALI's GPU backend on this rank's GPU; on the CPU its CPU backend (same pixels, slower).
    return info.device.index if info.device.type == "cuda" else None


@contextlib.contextmanager
def _reader_errors(flag: str, root: str):
    """The readers' ValueError / DatasetError (a crop that does not fit, a bad seed...) as one-line TrainErrors."""
    try:
        yield
    except (ValueError, DatasetError) as exc:
        raise TrainError(f"{flag} {root}: {exc}") from exc


def _readers(args) -> dict:
    """``--loader threads``: ``--workers`` reader threads; ``processes``: DataLoader worker processes."""
    return {"threads": args.workers} if args.loader == "threads" else {"workers": args.workers}


def build_train_data(args, info: DistInfo) -> TrainData:
    """The training loader chosen by ``--loader`` for this rank."""
    root = check_dataset(args.data, "--data")
    with _reader_errors("--data", root):
        return _train_data(root, args, info)


def _train_data(root: str, args, info: DistInfo) -> TrainData:
    preset = make_preset(args, train=True)
    if args.loader == "dali":
        # The DALI reader shards by rank itself (DistributedClipSampler's order)
        # and offers the sampler's set_epoch / set_position / state_dict.
        loader = dali_builder()(root, train=True, batch_size=args.batch_size, preset=preset, rank=info.rank,
                                 world_size=info.world_size, device_id=_dali_device(info), seed=args.seed,
                                 workers=args.workers)
        return TrainData(loader, loader, list(loader.classes), preset.mean, preset.std, args.batch_size,
                         int(loader.steps_per_epoch))
    ds = LmdbClipDataset(root, train=True, preset=preset, seed=args.seed)
    sampler = DistributedClipSampler(len(ds), num_replicas=info.world_size, rank=info.rank, shuffle=True,
                                     seed=args.seed, drop_last=True)
    steps = len(sampler) // args.batch_size
    if steps < 1:
        raise TrainError(f"--data {root}: {len(ds)} clips give this rank {len(sampler)}, fewer than one "
                         f"batch of {args.batch_size}")
    loader = build_loader(ds, batch_size=args.batch_size, sampler=sampler, train=True, drop_last=True,
                          pin_memory=info.device.type == "cuda", **_readers(args))
    return TrainData(loader, sampler, list(ds.classes), preset.mean, preset.std, args.batch_size, steps)


def build_eval_data(root: str, args, info: DistInfo) -> EvalData:
    """Centre-cropped clips of ``root``, split over ranks without padding."""
    check_dataset(root, "--val-data")
    with _reader_errors("--val-data", root):
        return _eval_data(root, args, info)


def _eval_data(root: str, args, info: DistInfo) -> EvalData:
    preset = make_preset(args, train=False)
    batch = args.eval_batch_size or args.batch_size
    if args.loader == "dali":
        loader = dali_builder()(root, train=False, batch_size=batch, preset=preset, rank=info.rank,
                                 world_size=info.world_size, device_id=_dali_device(info), seed=args.seed,
                                 workers=args.workers)
        return EvalData(loader, list(loader.classes), preset.mean, preset.std, int(loader.num_clips))
    ds = LmdbClipDataset(root, train=False, preset=preset, seed=args.seed)
    sampler = RankSplit(len(ds), info.rank, info.world_size)
    # Not persistent: evaluation runs now and then; idle workers would hold memory between runs.
    loader = build_loader(ds, batch_size=batch, sampler=sampler, train=False, pin_memory=info.device.type == "cuda",
                          persistent_workers=False, drop_last=False, **_readers(args))
    return EvalData(loader, list(ds.classes), preset.mean, preset.std, len(ds))
