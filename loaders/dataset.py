"""``ClipDataset``: the training/eval Dataset over a conversion's shards (any backend).

Items come back uint8 and already cropped by the preset; normalisation waits
for the device (``to_model_input``). Shards are opened lazily in whichever
process reads, so the dataset works with any number of DataLoader workers,
fork or spawn, and several DDP ranks.

The batched path ``__getitems__`` (which torch's DataLoader calls for a whole
batch when a dataset has it) reads the batch in one transaction per shard and
crops every clip straight from the memory map into one preallocated array.
It returns a ``ClipBatch``: a list of per-sample dicts (views into that array,
so torch's default collate still works) that also carries the collated batch,
which ``collate`` hands on without another copy. ``build_loader`` sets it up.
``read_into`` is the same read into arrays the caller owns: the threaded
loader (``loaders.threaded``) calls it from its reader threads.
"""

from __future__ import annotations

import contextlib
import math
import operator
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from convert.store import ClipStore, open_clips
from convert.store.cache import CacheSettings

from .cropread import crop_into, sample_into
from .presets import ClipPreset
from .sampling import SampleSpec, VideoSamples, plan_reads


class ClipBatch(list[dict]):
    """Per-sample dicts of one ``__getitems__`` call, plus ``collated``: the same batch as one dict."""

    def __init__(self, samples: list[dict], collated: dict) -> None:
        super().__init__(samples)
        self.collated = collated


def collate(batch: Sequence[Any]) -> Any:
    """Collate for ``ClipDataset``: a ``ClipBatch`` is already collated; anything else goes to torch's."""
    if isinstance(batch, ClipBatch):
        return batch.collated
    return default_collate(batch)


def _batch_array(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised uint8 tensor; in a DataLoader worker, in shared memory.

    A worker's result crosses to the main process through shared memory;
    allocating it there up front (as torch's default collate does) saves a
    copy of the whole batch.
    """
    if get_worker_info() is not None:
        try:
            storage = torch.UntypedStorage._new_shared(math.prod(shape))
            return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)
        except (AttributeError, RuntimeError):
            pass  # private API gone: fall back to a plain tensor (torch copies it once)
    return torch.empty(shape, dtype=torch.uint8)


class ClipDataset(Dataset):
    """Every clip of a conversion, in ``open_clips(root)`` order, cropped by a ``ClipPreset``.

    Item ``i`` (or ``(epoch, i)``, as ``DistributedClipSampler`` yields) is
    ``{"clip": uint8 tensor (T, H, W, C), "label": int, "video_id": str,
    "clip_index": int, "index": int}``. The crop is keyed by (preset seed,
    epoch, i); plain int items use the epoch of ``set_epoch``.

    Either pass ``preset`` or the fields to build one (``crop_size``,
    ``clip_len``, ``seed``, ``flip``, ``multiscale``); fields passed with a
    preset must agree with it. ``verify_checksums``
    checks every shard against the manifest now (a full read) and every
    value's CRC-32 as it is read. ``root`` may be a URL (``s3://...``): it is
    read through a local shard cache, ``cache`` its settings
    (``convert.store.cache.CacheSettings``).

    ``spec`` (``loaders.sampling.SampleSpec``; default: the stored clips)
    says which frames a sample is. With rule ``"window"`` or ``"segments"``
    the items are samples of videos, not stored clips: item ``i`` is of video
    ``i // per_video`` (``spec.per_video(train)``), its frames drawn from
    (seed, epoch, i) and read from the video's frame timeline
    (``ClipStore.frames``: a conversion whose clips do not tile its videos is
    refused in one line), then cropped by the preset as a clip of those
    frames; ``clip_index`` is the sample's number within its video. The
    preset's ``clip_len`` is the spec's ``frames`` (one setting: a preset
    that says otherwise is refused).
    """

    def __init__(self, root: str, *, train: bool, preset: ClipPreset | None = None, crop_size: int = 112,
                 clip_len: int | None = None, seed: int = 0, verify_checksums: bool = False, flip: bool = True,
                 multiscale: tuple[float, ...] | None = None, cache: CacheSettings | None = None,
                 spec: SampleSpec | None = None) -> None:
        if preset is None:
            preset = ClipPreset(train=train, crop_size=crop_size, clip_len=clip_len, seed=seed, flip=flip,
                                multiscale=multiscale)
        else:
            if not isinstance(preset, ClipPreset):
                raise ValueError(f"preset must be a ClipPreset or None, got {type(preset).__name__}")
            # A field left at its default, or equal to the preset's, agrees with the preset.
            fields = (("crop_size", crop_size, 112), ("clip_len", clip_len, None), ("seed", seed, 0),
                      ("flip", flip, True), ("multiscale", multiscale, None))
            clash = [f"{k}={v!r} (preset has {getattr(preset, k)!r})" for k, v, default in fields
                     if v != default and v != getattr(preset, k)
                     and not (k == "multiscale" and isinstance(v, (tuple, list)) and tuple(v) == getattr(preset, k))]
            if clash:
                raise ValueError(f"arguments disagree with the preset: {', '.join(clash)}")
            if preset.train != train:
                raise ValueError(f"train={train} but the preset has train={preset.train}")
        self.root = root
        self.train = train
        self.verify_checksums = bool(verify_checksums)
        self.store: ClipStore = open_clips(root, cache=cache)
        self.classes: list[str] = self.store.classes
        self.epoch = 0
        # Rows: this process, then DataLoader workers (by id, wrapping after 64).
        self._work = torch.zeros((65, 2), dtype=torch.float64).share_memory_()
        plan = plan_reads(self.store, preset, spec, train=train)
        self.spec, self.preset, self.samples = plan.spec, plan.preset, plan.samples
        self.clip_shape: tuple[int, int, int, int] = self.preset.out_shape(plan.frames)
        if self.verify_checksums:
            self.verify()

    # -- the index ----------------------------------------------------------
    def __len__(self) -> int:
        return len(self.store) if self.samples is None else len(self.samples)

    def set_epoch(self, epoch: int) -> None:
        """Epoch used for plain int items (tuples carry their own)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = int(epoch)

    def labels(self) -> np.ndarray:
        """Label of every item, in index order (for samplers)."""
        if self.samples is None:
            return self.store.labels()
        return np.repeat(self.store.video_labels, self.samples.per_video)

    def video_index(self) -> np.ndarray:
        """Video number of every item, in index order (for video-level evaluation)."""
        if self.samples is None:
            return self.store.video_index()
        return np.repeat(np.arange(len(self.store.video_ids)), self.samples.per_video)

    @property
    def video_ids(self) -> list[str]:
        """Video id of each video number of ``video_index()``."""
        return self.store.video_ids

    def verify(self) -> dict:
        """Check every value's CRC and every shard's SHA-256 against the manifest; FormatError if not."""
        from convert.store.verify import verify_store

        return verify_store(self.store.shard_paths, self.store.manifest)

    def _resolve(self, item: Any) -> tuple[int, int]:
        if isinstance(item, (tuple, list)):
            if len(item) != 2:
                raise ValueError(f"item must be an index or (epoch, index), got {item!r}")
            epoch, i = operator.index(item[0]), operator.index(item[1])
        else:
            epoch, i = self.epoch, operator.index(item)
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{'clip' if self.samples is None else 'sample'} {i} out of range for {n}")
        return epoch, i

    # -- reading ------------------------------------------------------------
    def batch_fields(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per-sample shape and dtype of each tensor field of a batch (``read_into`` fills them)."""
        return {"clip": (self.clip_shape, torch.uint8), "label": ((), torch.int64),
                "clip_index": ((), torch.int64), "index": ((), torch.int64)}

    def read_into(self, items: Sequence[Any], out: dict[str, np.ndarray]) -> dict[str, list]:
        """Read ``items`` into row k of each array of ``out`` (the fields of ``batch_fields``).

        The batch's clips are read in one transaction per shard, each crop
        written straight into ``out["clip"][k]``. Returns the fields that are
        not arrays (``{"video_id": [...]}``). Any thread may call it, for
        disjoint rows of one batch at once: nothing here is shared but the
        read-only shard handles.
        """
        pairs = [self._resolve(it) for it in items]
        clips, labels, cidx, index = out["clip"], out["label"], out["clip_index"], out["index"]
        vids: list = [None] * len(pairs)
        if self.samples is not None:
            return self._read_samples(pairs, out, vids)

        with contextlib.closing(self.store.read([i for _, i in pairs])) as stored:
            for clip in stored:
                pos, header = clip.position, clip.header
                epoch, i = pairs[pos]
                with clip.named():
                    crop_into(header, clip.payload, clips[pos], self.preset, epoch, i, verify=self.verify_checksums)
                labels[pos], cidx[pos], index[pos], vids[pos] = header.label, header.clip_index, i, header.video_id
        return {"video_id": vids}

    def _read_samples(self, pairs: list[tuple[int, int]], out: dict[str, np.ndarray], vids: list) -> dict[str, list]:
        """``read_into`` for samples of videos: each sample's frames read from its video's timeline, then cut
        by the preset as a clip of those frames."""
        samples, store = cast(VideoSamples, self.samples), self.store
        for pos, (epoch, i) in enumerate(pairs):
            v = sample_into(store, samples, self.preset, epoch, i, out["clip"][pos], verify=self.verify_checksums)
            out["label"][pos], out["clip_index"][pos], out["index"][pos] = store.video_labels[v], \
                i % samples.per_video, i
            vids[pos] = store.video_ids[v]
        return {"video_id": vids}

    def __getitem__(self, item: Any) -> dict:
        return self.__getitems__([item])[0]

    def __getitems__(self, items: Sequence[Any]) -> ClipBatch:
        """A whole batch: one read transaction per shard, crops written into one array."""
        t0 = time.perf_counter()
        n = len(items)
        tensors = {k: _batch_array((n, *shape)) if k == "clip" else torch.empty((n, *shape), dtype=dt)
                   for k, (shape, dt) in self.batch_fields().items()}
        lists = self.read_into(items, {k: t.numpy() for k, t in tensors.items()})
        self._count(n, time.perf_counter() - t0)
        clips, labels, cidx, indices = (tensors[k] for k in ("clip", "label", "clip_index", "index"))
        samples = [{"clip": clips[k], "label": int(labels[k]), "video_id": lists["video_id"][k],
                    "clip_index": int(cidx[k]), "index": int(indices[k])} for k in range(n)]
        return ClipBatch(samples, {**tensors, **lists})

    # -- what the readers did (for the trainer's logs) ------------------------
    def _count(self, clips: int, seconds: float) -> None:
        info = get_worker_info()
        row = self._work[0 if info is None else 1 + info.id % (len(self._work) - 1)]
        row[0] += clips  # one row per worker process: no two writers share a row
        row[1] += seconds

    def read_work(self) -> tuple[int, float]:
        """(clips, seconds) that ``__getitems__`` has read so far, summed over every process reading.

        Worker processes add to a shared-memory table, one row each, so the
        training process sees their work without any message; the trainer turns
        differences of this into the loader's own clips/s.
        """
        clips, seconds = self._work.sum(0).tolist()
        return int(clips), float(seconds)

    def __repr__(self) -> str:
        return (f"ClipDataset({self.root!r}, {self.store.backend.name}, {len(self)} clips, "
                f"{len(self.classes)} classes, out {self.clip_shape}, {self.preset})")


__all__ = ["ClipBatch", "ClipDataset", "collate"]
