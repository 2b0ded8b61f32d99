"""The sample source behind ``DaliClipLoader``: which clip comes next, and its bytes.

``_Order`` is this rank's epoch order (``DistributedClipSampler``'s share),
``_Stream`` the endless run of epochs one pipeline reads, and ``_ClipSource``
the picklable callable that ``fn.external_source`` calls per sample, in
DALI's worker processes: it reads the stored value and returns the payload
with the crop the preset draws for (seed, epoch, index). No DALI import
here: the source runs wherever DALI pickles it to.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from convert.format import ClipHeader, codec_for_id
from convert.store import ClipStore

from ..cropread import checked_params, sample_region
from ..presets import ClipPreset
from ..sampler import DistributedClipSampler
from ..sampling import VideoSamples


class _Order:
    """This rank's clips per epoch and how they are cut into batches.

    Training: ``DistributedClipSampler(n, shuffle=True, drop_last=True)``'s
    share. Evaluation: the sampler's (unshuffled) share without the wrapped
    padding it adds when ranks do not divide the clip count, so the ranks
    together hold every clip exactly once (train.data's ``RankSplit`` order).
    A short final batch is padded with its last clip and trimmed after DALI,
    whose batches have one size. ``fixed``: these clip indices, in this
    order, instead of the sampler's share, whatever the epoch (the crops still
    follow the epoch).
    """

    def __init__(self, n: int, *, world: int, rank: int, seed: int, train: bool, batch_size: int,
                 drop_last: bool, fixed: np.ndarray | None = None) -> None:
        self.sampler = DistributedClipSampler(n, num_replicas=world, rank=rank, shuffle=train, seed=seed,
                                              drop_last=train, with_epoch=False)
        self.train = train
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.fixed = None if fixed is None else np.asarray(fixed, dtype=np.int64).reshape(-1)
        if self.fixed is not None:
            self.share_size = int(self.fixed.size)
        else:
            self.share_size = self.sampler.num_samples if train else len(range(rank, n, world))
        self._cache: dict[int, np.ndarray] = {}

    def share(self, epoch: int) -> np.ndarray:
        """This rank's clip indices for ``epoch``, from its first sample."""
        if self.fixed is not None:
            return self.fixed
        key = epoch if self.train else 0  # evaluation order does not depend on the epoch
        got = self._cache.get(key)
        if got is None:
            if len(self._cache) >= 2:  # workers move forward an epoch at a time: keep this one and the last
                self._cache.pop(next(iter(self._cache)))
            got = self._cache[key] = self.sampler.indices(key)[:self.share_size]
        return got

    def forget(self) -> None:
        """Drop the epochs' orders drawn so far (after the sampler's state was loaded)."""
        self._cache.clear()

    def batches(self, position: int) -> int:
        """Batches of an epoch started at ``position``."""
        left = self.share_size - position
        return left // self.batch_size if self.drop_last else -(-left // self.batch_size)

    def valid(self, position: int, batch: int) -> int:
        """Real (not padding) samples in batch ``batch`` of an epoch started at ``position``."""
        return max(0, min(self.batch_size, self.share_size - position - batch * self.batch_size))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cache"] = {}  # rebuilt per worker; a shuffled epoch order can be large
        return state


class _Stream:
    """The samples one pipeline reads: ``epoch`` from ``position``, then every later epoch from its start."""

    def __init__(self, order: _Order, epoch: int, position: int) -> None:
        self.order = order
        self.epoch = epoch
        self.position = position
        self.first = order.batches(position)  # batches of the first segment
        self.every = order.batches(0)  # batches of each later one

    def segment(self, k: int) -> tuple[int, int]:
        """(epoch, start position) of the stream's ``k``-th epoch."""
        return self.epoch + k, self.position if k == 0 else 0

    def segment_at(self, batch: int) -> int | None:
        """Which segment starts at stream batch ``batch`` (None: ``batch`` is inside one)."""
        if batch == 0:
            return 0
        rest = batch - self.first
        if rest < 0 or self.every == 0 or rest % self.every:
            return None
        return 1 + rest // self.every

    def locate(self, sample: int) -> tuple[int, int]:
        """(epoch, clip index) of stream sample ``sample``; padding repeats a batch's last real clip."""
        bs = self.order.batch_size
        batch, j = divmod(sample, bs)
        if batch < self.first:
            k, b = 0, batch
        else:
            if self.every == 0:
                raise IndexError(f"stream sample {sample} is past the only epoch")
            k, b = 1 + (batch - self.first) // self.every, (batch - self.first) % self.every
        epoch, position = self.segment(k)
        j = min(j, self.order.valid(position, b) - 1)
        return epoch, int(self.order.share(epoch)[position + b * bs + j])


class _FrameSource:
    """``external_source`` callback for samples of videos (``SampleSpec`` rules "window" and "segments"): the
    sample's crop region read from its video's timeline (``cropread.sample_region``), as ``ClipDataset`` reads
    it. Returns what ``_ClipSource`` returns when not ``in_dali``: (region (T, h, w, C), anchor (0, 0, 0),
    size (T, h, w), flip, label, index); the frames are decoded here, since a sample spans several stored
    payloads. Stateless apart from caches, as parallel sources must be.
    """

    in_dali = False

    def __init__(self, store: ClipStore, preset: ClipPreset, stream: _Stream, samples: VideoSamples, *,
                 verify: bool) -> None:
        self.store, self.preset, self.stream, self.samples, self.verify = store, preset, stream, samples, verify

    def __call__(self, info: Any) -> tuple[np.ndarray, ...]:
        epoch, index = self.stream.locate(int(info.idx_in_epoch))
        # Only the crop's region is read out of the decoded frames; DALI flips (and resizes) it.
        v, region, p = sample_region(self.store, self.samples, self.preset, epoch, index, verify=self.verify)
        t = region.shape[0]
        return (region, np.array([0, 0, 0], dtype=np.int32), np.array([t, p.h, p.w], dtype=np.int32),
                np.array(p.flip, dtype=np.int32), np.array(self.store.video_labels[v], dtype=np.int64),
                np.array(index, dtype=np.int64))


class _ClipSource:
    """``external_source`` callback: one stored clip and its crop for a ``SampleInfo``.

    Returns (data, anchor (skip, y0, x0), size (t, h, w), flip, label, index)
    and, when ``in_dali``, the stored shape (T, H, W, C) and the byte offsets
    and sizes of the parts DALI decodes (the shape only where the payload's
    graph ``needs_shape``, the parts where it ``needs_parts``). ``data`` is then the 1-D payload, decoded by its
    DALI graph (LZ4 inflate, or the image decoder for JPEG: nvJPEG on the
    GPU), with only the temporal window's frames handed over; otherwise the
    decoded window (T, H, W, C) itself.
    Stateless apart from caches, as parallel sources must be.
    """

    def __init__(self, store: ClipStore, preset: ClipPreset, stream: _Stream, *, in_dali: bool, verify: bool,
                 needs_shape: bool = True, needs_parts: bool = True) -> None:
        self.store = store
        self.preset = preset
        self.stream = stream
        self.in_dali = in_dali
        self.verify = verify
        self.needs_shape = needs_shape
        self.needs_parts = needs_parts

    def __call__(self, info: Any) -> tuple[np.ndarray, ...]:
        epoch, index = self.stream.locate(int(info.idx_in_epoch))
        with contextlib.closing(self.store.read([index])) as stored:
            clip = next(stored)
            with clip.named():
                return self._sample(clip.header, clip.payload, epoch, index)

    def _sample(self, header: ClipHeader, payload: memoryview, epoch: int, index: int) -> tuple[np.ndarray, ...]:
        p = checked_params(header, payload, self.preset, epoch, index, verify=self.verify)
        codec = codec_for_id(header.codec_id)
        t = p.t if p.t is not None else header.shape[0] - p.t0
        # Copies: the payload is a view into the shard, valid only until the store reads on (ClipStore.read).
        if self.in_dali:
            offsets, sizes, skip = codec.window_parts(payload, header.shape, p.t0, t)
            # DALI's decoders size their output by the pictures: what the parts say of theirs is checked first.
            codec.check_framing(payload, header.shape, offsets, sizes)
            data = np.array(np.frombuffer(payload, dtype=np.uint8))
        else:
            data, skip = np.array(codec.window(payload, header.shape, p.t0, t)), 0
        out = (data, np.array([skip, p.y0, p.x0], dtype=np.int32), np.array([t, p.h, p.w], dtype=np.int32),
               np.array(p.flip, dtype=np.int32), np.array(header.label, dtype=np.int64),
               np.array(index, dtype=np.int64))
        if not self.in_dali:
            return out
        shape = (np.asarray(header.shape, dtype=np.int32),) if self.needs_shape else ()
        parts = (offsets.astype(np.int32), sizes.astype(np.int32)) if self.needs_parts else ()
        return out + shape + parts
