"""The seam between the trainer and the readers in ``loaders`` (LMDB) or ``loaders.dali``.

The trainer sees a ``TrainData``: batches of ``{"clip": uint8 (N, T, H, W, C),
"label", "video_id", "index", ...}`` for one optimizer step, plus the sampler
controls exact resume needs (``set_epoch``, ``set_position``,
``state_dict``). Evaluation gets an ``EvalData`` over a fixed, unpadded split
of the clips by rank, so gathered results hold each clip exactly once.
"""

from __future__ import annotations

import importlib.util
import contextlib
import os
import signal
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

from loaders import (ClipPreset, DatasetError, DistributedClipSampler, LmdbClipDataset, build_loader, loader_meter,
                     open_clips, to_model_input)
from loaders.sampler import VideoEpochSampler

from .dist import DistInfo
from .errors import TrainError

__all__ = ["ClipPreset", "DataShape", "EvalData", "TrainData", "build_eval_data", "build_train_data",
           "check_dataset", "dataset_info", "to_model_input"]


def check_dataset(root: str | None, what: str) -> str:
    """The folder, or a one-line error when it is not a finished conversion."""
    if not root:
        raise TrainError(f"{what}: no folder given")
    if not os.path.isfile(os.path.join(root, "manifest.json")):
        raise TrainError(f"{what} {root}: manifest.json missing (not a finished conversion; "
                         f"run python -m convert SRC {root} first)")
    return root


@dataclass(frozen=True)
class DataShape:
    """What the model is built for: class names and the stored clips' length and frame size.

    ``frame`` is (H, W) when every clip has that size, or None when frames keep
    their aspect ratio (``--short-side`` conversions); ``short_side`` is then the
    short side every frame has.
    """

    classes: list[str]
    clip_len: int
    frame: tuple[int, int] | None
    short_side: int | None


def dataset_info(root: str, crop_size: int, flag: str = "--data") -> DataShape:
    """Classes and clip shape of a conversion, read through the reader; one-line errors when they do not suit.

    The manifest gives the clip length (``clip_shape``, or ``clip.clip_len`` when
    frames keep their aspect); the first stored clip of every shard is checked
    against it (a header read each), so a conversion whose clips differ in
    length fails here rather than in a loader worker. ``crop_size`` must fit the
    frames (the short side, for ``--short-side`` conversions).
    """
    check_dataset(root, flag)
    try:
        store = open_clips(root)
        manifest = store.manifest
        shape = manifest.get("clip_shape")
        clip_len = int(shape[0]) if shape else int(manifest["clip"]["clip_len"])
        starts = np.concatenate(([0], np.cumsum(store.video_clips)[:-1]))
        first_of_shard = np.flatnonzero(np.diff(store.video_shard, prepend=-1))
        sample = [int(starts[v]) for v in first_of_shard]
        seen: dict[int, tuple[int, ...]] = {}
        store.visit(sample, lambda pos, header, payload: seen.__setitem__(pos, header.shape))
    except (DatasetError, KeyError, TypeError, ValueError) as exc:
        raise TrainError(f"{flag} {root}: cannot read the clip shape: {exc}") from exc
    lengths = sorted({s[0] for s in seen.values()} | {clip_len})
    if len(lengths) > 1:
        raise TrainError(f"{flag} {root}: stored clips have {' and '.join(map(str, lengths))} frames; the model "
                         f"needs one clip length (convert again with one --clip-len)")
    frame = (int(shape[1]), int(shape[2])) if shape else None
    short = None if shape else (manifest.get("frame_size") or {}).get("short_side")
    smallest = min(frame) if frame else (int(short) if short else min(min(s[1:3]) for s in seen.values()))
    if crop_size > smallest:
        where = f"frames of {frame[0]}x{frame[1]}" if frame else f"frames whose short side is {smallest}"
        raise TrainError(f"{flag} {root}: --crop-size {crop_size} does not fit {where}")
    return DataShape(list(store.classes), clip_len, frame, int(short) if short else None)


class RankSplit(Sampler):
    """Items ``rank, rank + world, ...`` of ``items`` (or of ``range(items)``): each on exactly one rank, no padding."""

    def __init__(self, items: int | Sequence, rank: int, world: int) -> None:
        items = range(items) if isinstance(items, int) else items
        self.ids = list(items[rank::world])

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
    """Evaluation batches split over ranks, and the protocol they follow (stated in every report)."""

    loader: Any
    classes: list[str]
    mean: Sequence[float]
    std: Sequence[float]
    num_clips: int  # views over all ranks: clips, or clips x spatial crops
    protocol: dict = field(default_factory=dict)


PROTOCOLS = ("clips", "10x3")


def describe_protocol(name: str, clips_per_video: int, crop_size: int) -> dict:
    """The evaluation protocol as it goes into the console line and ``eval/*.json``."""
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


def make_preset(args, train: bool) -> Any:
    kwargs: dict[str, Any] = {"train": train, "crop_size": args.crop_size, "clip_len": args.clip_len,
                              "seed": args.seed}
    if train:
        kwargs["flip"] = not args.no_flip
    elif args.eval_protocol != "clips":
        kwargs["spatial_crops"] = 3
    return ClipPreset(**kwargs)


def dali_installed() -> bool:
    """Whether ``nvidia.dali`` can be imported (looked up, not imported: importing it is slow)."""
    return importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None


def dali_builder():
    """``loaders.dali.build_dali_loader``, or a one-line error when DALI or the module is missing."""
    if not dali_installed():
        raise TrainError("--loader dali needs NVIDIA DALI, which is not installed "
                         "(pip install -e .[dali]: nvidia-dali-cuda120; .[dali-cu13] for DALI's CUDA 13 build; "
                         "or use --loader lmdb)")
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


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader workers ignore SIGTERM/SIGUSR1: a cluster signals the whole process group on preemption,
    and the trainer (which saves at the next step, see train.main.stop_signals) still needs its workers'
    batches until then; the workers end when the trainer closes the loader."""
    for s in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, signal.SIG_IGN)


def _readers(args) -> dict:
    """``--loader threads``: ``--workers`` reader threads; ``processes``: DataLoader worker processes."""
    if args.loader == "threads":
        return {"threads": args.workers}
    return {"workers": args.workers, "worker_init_fn": ignore_stop_signals}


def build_train_data(args, info: DistInfo) -> TrainData:
    """The training loader chosen by ``--loader`` for this rank."""
    root = check_dataset(args.data, "--data")
    with _reader_errors("--data", root):
        return _train_data(root, args, info)


def _train_data(root: str, args, info: DistInfo) -> TrainData:
    preset = make_preset(args, train=True)
    if args.loader == "dali":
        if args.epoch_mode != "clips":
            raise TrainError("--epoch-mode videos needs --loader lmdb (the DALI reader samples clips)")
        # The DALI reader shards by rank itself (DistributedClipSampler's order)
        # and offers the sampler's set_epoch / set_position / state_dict.
        loader = dali_builder()(root, train=True, batch_size=args.batch_size, preset=preset, rank=info.rank,
                                 world_size=info.world_size, device_id=_dali_device(info), seed=args.seed,
                                 workers=args.workers)
        return TrainData(loader, loader, list(loader.classes), preset.mean, preset.std, args.batch_size,
                         int(loader.steps_per_epoch))
    ds = LmdbClipDataset(root, train=True, preset=preset, seed=args.seed)
    if args.epoch_mode == "videos":
        sampler = VideoEpochSampler(ds.video_index(), clips_per_video=args.clips_per_video,
                                    num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=args.seed,
                                    drop_last=True)
    else:
        sampler = DistributedClipSampler(len(ds), num_replicas=info.world_size, rank=info.rank, shuffle=True,
                                         seed=args.seed, drop_last=True)
    steps = len(sampler) // args.batch_size
    if steps < 1:
        unit = "clips" if args.epoch_mode == "clips" else f"clips ({args.clips_per_video} per video)"
        raise TrainError(f"--data {root}: an epoch of {sampler.epoch_size} {unit} gives this rank {len(sampler)}, "
                         f"fewer than one batch of {args.batch_size}")
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
    protocol = describe_protocol(args.eval_protocol, args.eval_clips, args.crop_size)
    if args.loader == "dali" and args.eval_protocol != "clips":
        raise TrainError(f"--eval-protocol {args.eval_protocol} needs --loader lmdb (the DALI reader cuts one "
                         f"crop per clip)")
    if args.loader == "dali":
        loader = dali_builder()(root, train=False, batch_size=batch, preset=preset, rank=info.rank,
                                 world_size=info.world_size, device_id=_dali_device(info), seed=args.seed,
                                 workers=args.workers)
        return EvalData(loader, list(loader.classes), preset.mean, preset.std, int(loader.num_clips), protocol)
    ds = LmdbClipDataset(root, train=False, preset=preset, seed=args.seed)
    # Items are clip indices, or (spatial crop, clip index) pairs: the Dataset's (epoch, index) items,
    # whose first element the 3-crop preset reads as the crop.
    items = len(ds) if args.eval_protocol == "clips" else multiview_items(ds.store.video_clips, args.eval_clips)
    sampler = RankSplit(items, info.rank, info.world_size)
    # Not persistent: evaluation runs now and then; idle workers would hold memory between runs.
    loader = build_loader(ds, batch_size=batch, sampler=sampler, train=False, pin_memory=info.device.type == "cuda",
                          persistent_workers=False, drop_last=False, **_readers(args))
    return EvalData(loader, list(ds.classes), preset.mean, preset.std, len(ds) if isinstance(items, int) else
                    len(items), protocol)
