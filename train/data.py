"""The seam between the trainer and the readers in ``loaders`` (LMDB) or ``loaders.dali``.

The trainer sees a ``TrainData``: batches of ``{"clip": uint8 (N, T, H, W, C),
"label", "video_id", "index", ...}`` for one optimizer step, plus the sampler
controls exact resume needs (``set_epoch``, ``set_position``,
``state_dict``). Evaluation gets an ``EvalData`` over a fixed, unpadded split
of the clips by rank, so gathered results hold each clip exactly once.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Sampler

from convert.store.cache import CacheSettings
from convert.store.remote import RemoteError, is_url
from convert.worker.sources import VIDEO_EXTENSIONS  # the file names python -m convert takes for videos
from loaders import (
    ClipDataset,
    ClipPreset,
    DistributedClipSampler,
    FormatError,
    build_loader,
    loader_meter,
    open_clips,
)
from loaders.dali import route_for  # imports no DALI (loaders.dali.missing says whether it is usable)
from loaders.dali.sharding import epoch_steps, shard_sizes
from loaders.sampler import VideoEpochSampler, clip_shards
from loaders.sampling import SampleSpec

from .dist import DistInfo
from .errors import TrainError
from .models import model_spec
from .protocols import describe_protocol, multiview_items, protocol_views
from .readerrors import reader_errors
from .workers import ignore_stop_signals

if TYPE_CHECKING:
    from .config import TrainConfig

__all__ = ["DataShape", "EvalData", "TrainData", "build_eval_data", "build_train_data", "check_dataset",
           "cache_settings", "dali_route", "data_identity", "dataset_info", "epoch_share",
           "train_sampler"]


def cache_settings(options: Any) -> CacheSettings:
    """The shard cache of a conversion at a URL, from ``--cache-dir`` and ``--cache-limit`` (``options``: the
    parsed options or the TrainConfig). With ``--order shards`` it prefetches a whole window ahead: the next
    window's shards download while the current one is read."""
    prefetch = CacheSettings.prefetch
    if getattr(options, "order", None) == "shards":
        prefetch = max(prefetch, int(options.order_shards))
    return CacheSettings(cache_dir=options.cache_dir, limit=options.cache_limit, prefetch=prefetch)


def check_dataset(root: str | None, what: str) -> str:
    """The folder, or a one-line error when it is not a finished conversion (a URL is checked as it is opened)."""
    if not root:
        raise TrainError(f"{what}: no folder given")
    if is_url(root):
        return root
    if os.path.isfile(root) and os.path.basename(root) == "manifest.json":
        raise TrainError(f"{what} {root}: name the conversion's folder, not its manifest: {what} "
                         f"{os.path.dirname(root) or '.'}")
    if os.path.isfile(root):
        raise TrainError(f"{what} {root}: a file, not a conversion (a folder with a manifest.json); if it lists "
                         f"videos, convert them first: python -m convert {root} OUT, then {what} OUT")
    if not os.path.isfile(os.path.join(root, "manifest.json")):
        videos = _videos_in(root)
        if videos == "flat":
            # Converting into the folder of the videos would mix the shards with them: name another.
            out = _beside(root)
            raise TrainError(f"{what} {root}: a folder of videos, not a conversion (no manifest.json); convert "
                             f"them into another folder first, with their labels (a Kinetics CSV or a list "
                             f"file): python -m convert LABELS {out} --videos {root}, then {what} {out}")
        if videos == "classes":
            out = _beside(root)
            raise TrainError(f"{what} {root}: a folder of class folders of videos, not a conversion (no "
                             f"manifest.json); convert it into another folder first: python -m convert {root} "
                             f"{out}, then {what} {out}")
        raise TrainError(f"{what} {root}: manifest.json missing (not a finished conversion; "
                         f"run python -m convert SRC {root} first)")
    return root


def _beside(root: str) -> str:
    """A folder beside ``root`` for its conversion: ``videos/`` -> ``videos_clips``."""
    return os.path.normpath(root) + "_clips"


def _videos_in(root: str, limit: int = 200) -> str | None:
    """What videos folder ``root`` holds: "flat" (video files in it), "classes" (in its sub-folders, which
    ``python -m convert`` reads as class folders) or None. Looks at ``limit`` entries of each folder at most, so
    a huge folder costs little."""
    def entries(folder: str) -> list[os.DirEntry]:
        try:
            with os.scandir(folder) as it:
                return [e for _, e in zip(range(limit), it)]
        except OSError:
            return []

    def is_video(entry: os.DirEntry) -> bool:
        return os.path.splitext(entry.name)[1].lower() in VIDEO_EXTENSIONS

    top = entries(root)
    if any(is_video(e) for e in top):
        return "flat"
    for entry in top:
        try:
            folder = entry.is_dir()
        except OSError:
            continue
        if folder and any(is_video(e) for e in entries(entry.path)):
            return "classes"
    return None


@dataclass(frozen=True)
class DataShape:
    """What the model is built for: class names and the stored clips' length and frame size.

    ``frame`` is (H, W) when every clip has that size, or None when frames keep
    their aspect ratio (``--short-side`` conversions); ``short_side`` is then the
    short side every frame has. ``video_clips``: the stored clips of each video,
    in the reader's order (what the training sampler deals out); ``identity``:
    what identifies the conversion (``data_identity``); ``fingerprint``: its content fingerprint
    (``data_fingerprint``).
    """

    classes: list[str]
    clip_len: int
    frame: tuple[int, int] | None
    short_side: int | None
    video_clips: tuple[int, ...] = ()
    identity: Mapping[str, Any] = field(default_factory=dict)
    fingerprint: str | None = None


def data_identity(manifest: Any) -> dict[str, Any]:
    """What identifies a conversion's clips, in whatever folder it lies: its totals and the SHA-256 of its
    shards' SHA-256s in the manifest's order. A checkpoint records it and a resume compares it
    (``train.checkpoint.check_settings``): the same class names do not make the same data."""
    h = hashlib.sha256()
    for shard in manifest.shards:
        h.update(f"{shard.sha256};".encode())
    return {"clips": int(manifest.totals.clips), "videos": int(manifest.totals.videos),
            "shards": len(manifest.shards), "sha256": h.hexdigest()}


def data_fingerprint(manifest: Any) -> str | None:
    """The conversion's content fingerprint (FORMAT.md, *Content fingerprint*): the same for the same clips
    however they were sharded, so two runs (or two labs) can tell whether they trained on the same data. None
    for a conversion written before fingerprints were recorded."""
    return getattr(manifest, "fingerprint", None)


def dataset_info(root: str, crop_size: int, flag: str = "--data", cache: CacheSettings | None = None) -> DataShape:
    """Classes and clip shape of a conversion, read through the reader; one-line errors when they do not suit.

    The manifest gives the clip length (``clip_shape``, or ``clip.clip_len`` when
    frames keep their aspect); the first stored clip of every shard is checked
    against it (a header read each), so a conversion whose clips differ in
    length fails here rather than in a loader worker (from a URL: of every
    shard in the cache, else of the first shard). ``crop_size`` must fit the
    frames (the short side, for ``--short-side`` conversions).
    """
    check_dataset(root, flag)
    try:
        store = open_clips(root, cache=cache)
        manifest = store.manifest
        shape = manifest.data.clip_shape
        clip_len = int(shape[0]) if shape else manifest.data.clip.clip_len
        starts = np.concatenate(([0], np.cumsum(store.video_clips)[:-1]))
        first_of_shard = np.flatnonzero(np.diff(store.video_shard, prepend=-1))
        if store.cache is not None:
            # From a URL, a check must not download the data: the shards already in the cache, else the first
            # (which training reads anyway); the loaders check every clip's shape as they read.
            cached = [v for v in first_of_shard if store.cache.present(int(store.video_shard[v]))]
            first_of_shard = np.asarray(cached or first_of_shard[:1], dtype=np.int64)
        sample = [int(starts[v]) for v in first_of_shard]
        seen = {clip.position: clip.header.shape for clip in store.read(sample)}
    except (FormatError, ValueError) as exc:
        raise TrainError(f"{flag} {root}: cannot read the clip shape: {exc}") from exc
    except RemoteError as exc:  # the message names the URL and the reason
        raise TrainError(f"{flag}: {exc}") from exc
    finally:
        if "store" in locals():
            store.close()  # lets go of the shards it holds in the cache
    lengths = sorted({s[0] for s in seen.values()} | {clip_len})
    if len(lengths) > 1:
        raise TrainError(f"{flag} {root}: stored clips have {' and '.join(map(str, lengths))} frames; the model "
                         f"needs one clip length (convert again with one --clip-len)")
    frame = (int(shape[1]), int(shape[2])) if shape else None
    short = None if shape else manifest.data.frame_size.short_side
    smallest = min(frame) if frame else (int(short) if short else min(min(s[1:3]) for s in seen.values()))
    if crop_size > smallest:
        where = f"frames of {frame[0]}x{frame[1]}" if frame else f"frames whose short side is {smallest}"
        raise TrainError(f"{flag} {root}: --crop-size {crop_size} does not fit {where}")
    return DataShape(list(store.classes), clip_len, frame, int(short) if short else None,
                     tuple(int(n) for n in store.video_clips), data_identity(manifest), data_fingerprint(manifest))


def train_sampler(video_clips: Sequence[int], *, epoch_mode: str, clips_per_video: int, world_size: int, rank: int,
                  seed: int, order: str = "random", storage_order: np.ndarray | None = None, block: int = 64,
                  window: int = 16, clip_shards: np.ndarray | None = None, shard_window: int = 4,
                  sampling: str = "clips") -> DistributedClipSampler:
    """One rank's training order over videos of ``video_clips`` stored clips each.

    ``epoch_mode`` clips: every stored clip once per epoch; videos:
    ``clips_per_video`` of each video's clips, chosen anew each epoch. Shuffled
    by (seed, epoch), in random order or, with ``order="blocks"``, in blocks
    of ``block`` clips that lie side by side (``storage_order``), ``window``
    blocks shuffled together, or, with ``order="shards"``, whole shards
    (``clip_shards``: each clip's shard) ``shard_window`` at a time; the last
    partial share is dropped, so every rank
    has the same ``len()``, the clips it trains on per epoch. With
    ``sampling`` other than clips (``--sampling``), the items are
    ``clips_per_video`` samples of each video (``ClipDataset(spec=)``'s), each
    once per epoch.
    """
    kw: dict[str, Any] = {"num_replicas": world_size, "rank": rank, "shuffle": True, "seed": seed, "drop_last": True,
                          "order": order, "storage_order": storage_order, "block": block, "window": window,
                          "clip_shards": clip_shards, "shard_window": shard_window}
    if sampling != "clips":
        return DistributedClipSampler(len(video_clips) * clips_per_video, **kw)
    if epoch_mode == "videos":
        index = np.repeat(np.arange(len(video_clips)), np.asarray(video_clips, dtype=np.int64))
        return VideoEpochSampler(index, clips_per_video=clips_per_video, **kw)
    return DistributedClipSampler(int(sum(video_clips)), **kw)


def epoch_share(root: str, shape: DataShape, *, loader: str, epoch_mode: str, clips_per_video: int, seed: int,
                info: DistInfo, sampling: str = "clips", dali_route: str = "auto") -> tuple[bool, int]:
    """(whether the training loader pads an epoch's last batch, the samples of this rank's epoch it counts).

    What ``TrainConfig.epoch_steps`` counts the steps of, as the loader
    ``build_train_data`` makes for ``loader`` counts them: DALI's native
    TFRecord reader (``loaders.dali.route_for``) pads every rank's shard to
    the largest, in whole batches (``loaders.dali.sharding``); the samplers'
    loaders (threads, processes, DALI's source route) drop the partial share
    and the partial last batch (``train_sampler``, which also counts the
    samples of videos of a ``sampling`` other than clips: DALI reads those
    through its source route). ``dali_route``: the route ``--loader dali``
    takes (``dali_route``).
    """
    if loader == "dali" and epoch_mode == "clips":
        if route_for(root, dali_route) == "native":
            return True, max(shard_sizes(int(sum(shape.video_clips)), info.world_size))
    try:
        sampler = train_sampler(shape.video_clips, epoch_mode=epoch_mode, clips_per_video=clips_per_video,
                                world_size=info.world_size, rank=info.rank, seed=seed, sampling=sampling)
    except ValueError as exc:  # the sampler's own checks (of the rank and world size...)
        raise TrainError(f"--data {root}: {exc}") from exc
    return False, len(sampler)


class RankSplit(Sampler):
    """Items ``rank, rank + world, ...`` of ``items`` (or of ``range(items)``): each on exactly one rank, no padding."""

    def __init__(self, items: int | Sequence, rank: int, world: int) -> None:
        items = range(items) if isinstance(items, int) else items
        self.ids = list(items[rank::world])

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


def close_loader(loader: Any) -> None:
    """Stop a loader's threads or pipelines now (DALI pipelines, reader threads); a DataLoader has
    nothing to close (its workers end with its iterator)."""
    close = getattr(loader, "close", None)
    if close is not None:
        close()


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
    # state_dict(consumed) may be behind what the loader has read (a step abandoned for a signal is read again
    # on resume); DALI's native reader saves only where its pipeline stands.
    rewinds: bool = True

    def loader_stats(self) -> dict:
        """The loader's own clips/s and queue depth since the last call (``loaders.loader_meter``)."""
        if self.meter is None:
            self.meter = loader_meter(self.loader)
        stats: dict = self.meter()
        return stats

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def set_position(self, position: int) -> None:
        self.sampler.set_position(position)

    def state_dict(self, consumed: int) -> dict:
        """``{"epoch", "position"}`` with ``consumed`` samples of this rank's epoch used (prefetch runs ahead)."""
        state: dict = self.sampler.state_dict(consumed=consumed)
        return state

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)

    def close(self) -> None:
        """Stop the loader's threads or pipelines now (``close_loader``)."""
        close_loader(self.loader)

    def __iter__(self) -> Iterator[dict]:
        # DataLoader draws its workers' base seed from the global torch RNG when
        # an iterator starts; forking keeps that draw out of the stream dropout
        # uses, so a resumed run sees the same dropout masks as an unbroken one.
        with torch.random.fork_rng(devices=[]):
            it: Iterator[dict] = iter(self.loader)
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

    def close(self) -> None:
        """Stop the loader's threads or pipelines now (``close_loader``)."""
        close_loader(self.loader)


def make_sample_spec(cfg: TrainConfig, train: bool) -> SampleSpec | None:
    """Which frames a sample is, from ``--sampling``, ``--clip-len``, ``--frame-step``, ``--clips-per-video`` and
    (evaluation) ``--eval-clips`` views with ``--eval-protocol 10x3``, else the one centre window; None for
    ``--sampling clips`` (the stored clips). Held nowhere but in those settings, which the checkpoint keeps."""
    if cfg.sampling == "clips":
        return None
    views = protocol_views(cfg.eval_protocol, cfg.eval_clips)[0]
    return SampleSpec(frames=cfg.clip_len, step=cfg.frame_step, rule=cfg.sampling,
                      clips_per_video=cfg.clips_per_video, views=1 if train else views)


def make_preset(cfg: TrainConfig, train: bool) -> ClipPreset:
    """The crop of training (random, of --crop-scales when given, flipped unless --no-flip) or evaluation
    (centre, or 3 along the long side), normalised as the ``--model`` expects (``ModelSpec.mean``/``std``:
    Kinetics' for C3D and the ResNets, ImageNet's for I3D, whose weights start from ImageNet's)."""
    spec = model_spec(cfg.model)
    kwargs: dict[str, Any] = {"train": train, "crop_size": cfg.crop_size, "clip_len": cfg.clip_len, "seed": cfg.seed,
                              "mean": spec.mean, "std": spec.std}
    bounds = cfg.short_side_bounds()
    if train:
        kwargs["flip"] = not cfg.no_flip
        kwargs["multiscale"] = cfg.scales()
        kwargs["short_side"] = bounds
        kwargs["random_resized"] = cfg.resized_areas()
    else:
        kwargs["spatial_crops"] = protocol_views(cfg.eval_protocol, cfg.eval_clips)[1]
        kwargs["short_side"] = None if bounds is None else (bounds[0], bounds[0])
    return ClipPreset(**kwargs)


def dali_builder() -> Callable[..., Any]:
    """``loaders.dali.build_dali_loader``, or a one-line TrainError saying what to install when DALI is not usable."""
    from loaders import dali

    reason = dali.missing()
    if reason is not None:
        raise TrainError(f"--loader dali needs NVIDIA DALI: {reason}; or use --loader threads")
    return dali.build_dali_loader


def _dali_device(info: DistInfo) -> int | None:
    # DALI's GPU backend on this rank's GPU; on the CPU its CPU backend (same pixels, slower).
    return info.device.index if info.device.type == "cuda" else None


def dali_route(*, sampling: str, short_side_scale: str | None, random_resized_crop: str | None) -> str:
    """The route ``--loader dali`` takes (``loaders.dali.route_for``'s ``route``): samples of videos, and crops
    that DALI's native reader does not draw (it hands over single records and draws its own crops, without a
    short-side scale or a random-resized crop), go through the source route."""
    native_can = sampling == "clips" and short_side_scale is None and random_resized_crop is None
    return "auto" if native_can else "source"


def _cfg_route(cfg: TrainConfig) -> str:
    return dali_route(sampling=cfg.sampling, short_side_scale=cfg.short_side_scale,
                      random_resized_crop=cfg.random_resized_crop)


def _readers(cfg: TrainConfig) -> dict:
    """``--loader threads``: ``--workers`` reader threads; ``processes``: DataLoader worker processes."""
    if cfg.loader == "threads":
        return {"threads": cfg.workers}
    return {"workers": cfg.workers, "worker_init_fn": ignore_stop_signals}


def _dataset(root: str, train: bool, preset: ClipPreset, spec: SampleSpec | None, cfg: TrainConfig) -> ClipDataset:
    ds = ClipDataset(root, train=train, preset=preset, seed=cfg.seed, cache=cache_settings(cfg), spec=spec)
    # --verify-data: the CRC-32 of every payload as it is read. Set after construction because
    # ClipDataset(verify_checksums=True) would also read every shard in full first (its verify()),
    # which on Kinetics is terabytes per rank; python -m convert verify DATA is that check.
    ds.verify_checksums = cfg.verify_data
    return ds


def build_train_data(cfg: TrainConfig, info: DistInfo) -> TrainData:
    """The training loader chosen by ``--loader`` for this rank."""
    root = check_dataset(cfg.data, "--data")
    batch = cfg.batch_size
    if batch is None:  # with_batch gives it, before the loaders are built
        raise TrainError("--batch-size auto is not resolved yet (with_batch)")
    with reader_errors("--data", root):
        preset, spec = make_preset(cfg, train=True), make_sample_spec(cfg, train=True)
        if cfg.loader == "dali":
            if cfg.epoch_mode != "clips":
                raise TrainError("--epoch-mode videos needs --loader threads or processes (the DALI reader samples "
                                 "clips)")
            # The DALI reader shards by rank itself (DistributedClipSampler's order)
            # and offers the sampler's set_epoch / set_position / state_dict.
            route = _cfg_route(cfg)
            loader = dali_builder()(root, train=True, batch_size=batch, preset=preset, rank=info.rank,
                                     world_size=info.world_size, device_id=_dali_device(info), seed=cfg.seed,
                                     workers=cfg.workers, verify=cfg.verify_data,
                                     cache=cache_settings(cfg), route=route, spec=spec)
            return TrainData(loader, loader, list(loader.classes), preset.mean, preset.std, batch,
                             int(loader.steps_per_epoch), rewinds=route_for(root, route) != "native")
        ds = _dataset(root, True, preset, spec, cfg)
        sampler = train_sampler(ds.store.video_clips, epoch_mode=cfg.epoch_mode, clips_per_video=cfg.clips_per_video,
                                world_size=info.world_size, rank=info.rank, seed=cfg.seed, order=cfg.order,
                                storage_order=ds.store.storage_order() if cfg.order == "blocks" else None,
                                block=cfg.order_block, window=cfg.order_window,
                                clip_shards=clip_shards(ds.store) if cfg.order == "shards" else None,
                                shard_window=cfg.order_shards, sampling=cfg.sampling)
        loader = build_loader(ds, batch_size=batch, sampler=sampler, train=True, drop_last=True,
                              pin_memory=info.device.type == "cuda", **_readers(cfg))
        return TrainData(loader, sampler, list(ds.classes), preset.mean, preset.std, batch,
                         epoch_steps(len(sampler), batch, pad_last_batch=False))


def build_eval_data(root: str, cfg: TrainConfig, info: DistInfo, flag: str = "--val-data") -> EvalData:
    """Clips of ``root`` cropped as ``cfg.eval_protocol`` says, split over ranks without padding."""
    check_dataset(root, flag)
    with reader_errors(flag, root):
        preset, spec = make_preset(cfg, train=False), make_sample_spec(cfg, train=False)
        batch = cfg.eval_batch_size
        protocol = describe_protocol(cfg.eval_protocol, cfg.eval_clips, cfg.crop_size, spec)
        if cfg.loader == "dali" and cfg.eval_protocol != "clips":
            raise TrainError(f"--eval-protocol {cfg.eval_protocol} needs --loader threads or processes (the DALI "
                             f"reader cuts one crop per clip)")
        if cfg.loader == "dali":
            loader = dali_builder()(root, train=False, batch_size=batch, preset=preset, rank=info.rank,
                                     world_size=info.world_size, device_id=_dali_device(info), seed=cfg.seed,
                                     workers=cfg.workers, verify=cfg.verify_data,
                                     cache=cache_settings(cfg), route=_cfg_route(cfg), spec=spec)
            count = int(loader.num_clips) if spec is None else len(loader.samples)
            return EvalData(loader, list(loader.classes), preset.mean, preset.std, count, protocol)
        ds = _dataset(root, False, preset, spec, cfg)
        # Items are clip (or sample) indices, or (spatial crop, index) pairs: the Dataset's (epoch, index) items,
        # whose first element the 3-crop preset reads as the crop. Samples of videos carry their temporal views
        # already (the spec's): each is taken with the 3 crops.
        views, crops = protocol_views(cfg.eval_protocol, cfg.eval_clips)
        if cfg.eval_protocol == "clips":
            items: int | list[tuple[int, int]] = len(ds)
        elif ds.samples is not None:
            items = [(crop, i) for i in range(len(ds)) for crop in range(crops)]
        else:
            items = multiview_items(ds.store.video_clips, views, crops)
        sampler = RankSplit(items, info.rank, info.world_size)
        # Not persistent: evaluation runs now and then; idle workers would hold memory between runs.
        loader = build_loader(ds, batch_size=batch, sampler=sampler, train=False,
                              pin_memory=info.device.type == "cuda", persistent_workers=False, drop_last=False,
                              **_readers(cfg))
        return EvalData(loader, list(ds.classes), preset.mean, preset.std,
                        len(ds) if isinstance(items, int) else len(items), protocol)
