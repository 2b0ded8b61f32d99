"""``DistributedClipSampler``: per-rank, per-epoch order that can resume mid-epoch.

An epoch's global order is a function of (seed, epoch) only: a permutation,
padded by wrapping to a multiple of the rank count (or cut, with
``drop_last``), then dealt out round-robin as torch's DistributedSampler
does. Each rank therefore sees a disjoint, equal share, and a restarted job
reproduces the order exactly.

The permutation is drawn with the project's keyed generator
(``loaders.keyed``, defined bit for bit), not numpy's ``default_rng``, whose
stream numpy does not promise across versions: the order a checkpoint resumes
into then depends on nothing installed. The scheme is part of the sampler's
state (``state_dict()["scheme"]``): a checkpoint written before the keyed
scheme (no ``scheme``) resumes with the numpy draws it was made with.

``order="blocks"`` is the order for shards larger than memory (FFCV's
quasi-random order, WebDataset's shard-then-buffer shuffle): the epoch's clips,
taken in the order their bytes lie in the shards (``ClipStore.storage_order``),
are cut into blocks of ``block`` neighbours; the blocks are shuffled, and the
clips of each run of ``window`` consecutive blocks are shuffled together. A
reader then touches about ``window * block`` clips' worth of the shards at a
time, and the kernel's read-ahead, wasted on random reads, brings in clips that
are read next. Ranks are dealt the same order round-robin, so the ranks of one
node read the same blocks through one page cache.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from .keyed import GOLDEN, keyed_uniform, mix64

# How an epoch's order is drawn: 1, numpy's default_rng((seed, epoch)) (states without a "scheme"); 2, keyed.
SCHEMES = (1, 2)
SCHEME = 2


class _NumpyDraws:
    """Scheme 1: the draws of ``np.random.default_rng(key)``, as samplers made them before scheme 2."""

    def __init__(self, *key: int) -> None:
        self._rng = np.random.default_rng(key)

    def random(self, n: int) -> np.ndarray:
        return self._rng.random(n)

    def permutation(self, n: int) -> np.ndarray:
        return self._rng.permutation(n)

    def integers(self, high: int, n: int) -> np.ndarray:
        return self._rng.integers(0, high, n)


class _KeyedDraws:
    """Scheme 2: the i-th value of the j-th draw is ``keyed_uniform((*key, j), i)``: a function of the key alone."""

    def __init__(self, *key: int) -> None:
        self._key, self._draws = key, 0

    def random(self, n: int) -> np.ndarray:
        self._draws += 1
        return keyed_uniform((*self._key, self._draws - 1), np.arange(n, dtype=np.uint64))

    def permutation(self, n: int) -> np.ndarray:
        # Ties (two equal 53-bit keys) keep index order: still a function of the key.
        return np.argsort(self.random(n), kind="stable")

    def integers(self, high: int, n: int) -> np.ndarray:
        return np.minimum((self.random(n) * high).astype(np.int64), high - 1)


def draws(scheme: int, *key: int) -> _NumpyDraws | _KeyedDraws:
    """The generator of ``scheme`` (``SCHEMES``) for ``key``."""
    if scheme not in SCHEMES:
        raise ValueError(f"sampler scheme must be one of {SCHEMES}, got {scheme!r}")
    return _KeyedDraws(*key) if scheme == 2 else _NumpyDraws(*key)


def _world() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


ORDERS = ("random", "blocks")


def block_shuffled(candidates: np.ndarray, storage_rank: np.ndarray, rng: _NumpyDraws | _KeyedDraws, *,
                   block: int, window: int) -> np.ndarray:
    """``candidates`` (clip indices, repeats allowed) in block-shuffled order.

    ``storage_rank[i]`` is clip ``i``'s place in the shards' storage order.
    The candidates, in storage order, are cut into blocks of ``block``; the
    blocks are permuted by ``rng``, and each run of ``window`` consecutive
    blocks of that permutation is emitted with its clips shuffled together.
    Vectorised: two sorts of the epoch's clips, whatever their number.
    """
    candidates = np.asarray(candidates, dtype=np.int64)
    placed = candidates[np.argsort(storage_rank[candidates], kind="stable")]
    m = placed.size
    blocks = -(-m // block)
    read_at = np.empty(blocks, dtype=np.int64)
    read_at[rng.permutation(blocks)] = np.arange(blocks)  # block b is the read_at[b]-th block read
    window_of = read_at[np.arange(m) // block] // window
    return placed[np.lexsort((rng.random(m), window_of))]


def _check_order(order: str, storage_order: Sequence[int] | np.ndarray | None, n: int, block: int, window: int,
                 shuffle: bool) -> np.ndarray | None:
    """The storage rank of every clip for ``order="blocks"`` (None for random order), after checking the settings."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    for name, value in (("block", block), ("window", window)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if order == "random":
        if storage_order is not None:
            raise ValueError("storage_order is used by order='blocks' only")
        return None
    if not shuffle:
        raise ValueError("order='blocks' is a shuffle; with shuffle=False the order is the index order")
    if storage_order is None:
        raise ValueError("order='blocks' needs storage_order (the dataset's store.storage_order())")
    storage = np.asarray(storage_order, dtype=np.int64).reshape(-1)
    if storage.size != n or (n and not np.array_equal(np.sort(storage), np.arange(n))):
        raise ValueError(f"storage_order must hold every clip index 0..{n - 1} once, got {storage.size} values")
    rank = np.empty(n, dtype=np.int64)
    rank[storage] = np.arange(n)
    return rank


class EpochPosition:
    """Where a reader stands: the epoch and this rank's position inside it.

    Shared by the sampler and the DALI loader, which must offer the trainer
    the same controls. Subclasses set ``epoch``, ``position`` and
    ``num_samples`` (this rank's samples per epoch).
    """

    epoch: int
    position: int
    # This rank's samples per epoch: an attribute of the sampler, a property of the DALI loaders.
    num_samples: Any

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; moving to another epoch restarts at position 0."""
        epoch = operator.index(epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self.position = 0
        self.epoch = epoch

    def set_position(self, position: int) -> None:
        """Start this epoch's iteration at this rank's ``position``-th sample (0..num_samples)."""
        position = operator.index(position)
        if not 0 <= position <= self.num_samples:
            raise ValueError(f"position must be in 0..{self.num_samples}, got {position}")
        self.position = position

    def state_dict(self, consumed: int | None = None) -> dict:
        """``{"epoch", "position"}``; ``consumed``: samples this rank has used this epoch (default: the position
        set)."""
        position = self.position if consumed is None else operator.index(consumed)
        return {"epoch": self.epoch, "position": position}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``: the epoch and the position inside it."""
        if "epoch" not in state or "position" not in state:
            raise ValueError(f"state needs keys epoch and position, got {sorted(state)}")
        epoch = int(state["epoch"])
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = epoch
        self.set_position(int(state["position"]))


class DistributedClipSampler(Sampler, EpochPosition):
    """Indices for one rank: shuffled per epoch from (seed, epoch), resumable at a position.

    ``n``: the dataset size. ``num_replicas``/``rank`` default to
    torch.distributed's when it is initialised, else 1/0. Yields ``(epoch,
    index)`` tuples when ``with_epoch`` (so persistent workers know the
    epoch), else ints.

    Resuming: ``set_position(p)`` (or ``load_state_dict``) makes iteration
    of the current epoch start at this rank's p-th sample. The position lasts
    until ``set_epoch`` moves to another epoch; calling ``set_epoch`` with the
    current epoch keeps it, so the usual ``for epoch in range(start, end):
    sampler.set_epoch(epoch)`` loop resumes correctly. The sampler cannot know
    how far training got (DataLoader prefetch runs ahead of the model), so the
    trainer counts consumed samples and passes them to ``state_dict``.

    ``order``: ``"random"`` (default) or ``"blocks"``, the block-shuffled
    order for shards larger than memory (module docstring): ``storage_order``
    is then the clip indices in the order they lie in the shards
    (``ClipStore.storage_order()``), ``block`` the neighbours read together and
    ``window`` the blocks shuffled together (``window * block`` clips should
    fit in the node's page cache).
    """

    def __init__(self, n: int, *, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, with_epoch: bool = True, order: str = "random",
                 storage_order: Sequence[int] | np.ndarray | None = None, block: int = 64,
                 window: int = 16) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise ValueError(f"n must be the dataset size (an int), got {type(n).__name__}")
        self.n = int(n)
        if self.n < 0:
            raise ValueError(f"dataset size must be >= 0, got {self.n}")
        world, world_rank = _world()
        self.num_replicas = world if num_replicas is None else int(num_replicas)
        self.rank = world_rank if rank is None else int(rank)
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {self.num_replicas}")
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank must be in 0..{self.num_replicas - 1}, got {self.rank}")
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self._storage_rank = _check_order(order, storage_order, self.n, block, window, bool(shuffle))
        self.order, self.block, self.window = order, int(block), int(window)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.with_epoch = bool(with_epoch)
        self.epoch = 0
        self.position = 0
        self.scheme = SCHEME
        self._set_epoch_size(self.n)

    def _set_epoch_size(self, size: int) -> None:
        """Samples per epoch over all ranks, and this rank's share after padding or ``drop_last``."""
        self.epoch_size = size
        if self.drop_last:
            self.num_samples = self.epoch_size // self.num_replicas
        else:
            self.num_samples = math.ceil(self.epoch_size / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    # -- order ----------------------------------------------------------------
    def global_order(self, epoch: int | None = None) -> np.ndarray:
        """The epoch's order over all ranks, padded or cut to ``num_replicas * len(self)``."""
        epoch = self.epoch if epoch is None else epoch
        if self.n == 0 or self.total_size == 0:
            return np.zeros(0, dtype=np.int64)
        order = self._epoch_order(int(epoch))
        if order.size < self.total_size:
            order = np.resize(order, self.total_size)  # wraps around, as DistributedSampler pads
        return order[:self.total_size].astype(np.int64)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        """The epoch's ``epoch_size`` indices in order, before padding and dealing out to ranks."""
        if self.shuffle:
            return self._shuffled(np.arange(self.n), draws(self.scheme, self.seed, epoch))
        return np.arange(self.n)

    def state_dict(self, consumed: int | None = None) -> dict:
        """``{"epoch", "position", "scheme"}``; ``consumed``: samples this rank has used this epoch."""
        return {**super().state_dict(consumed), "scheme": self.scheme}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``; a state without ``scheme`` (written before it) draws as it was drawn then."""
        scheme = state.get("scheme", 1)
        if scheme not in SCHEMES:
            raise ValueError(f"sampler state has scheme {scheme!r}; this sampler draws with {SCHEMES}")
        super().load_state_dict(state)
        self.scheme = scheme

    def _shuffled(self, candidates: np.ndarray, rng: _NumpyDraws | _KeyedDraws) -> np.ndarray:
        """``candidates`` in this sampler's shuffled order (``order``: random or block-shuffled)."""
        if self._storage_rank is None:
            return candidates[rng.permutation(candidates.size)]
        return block_shuffled(candidates, self._storage_rank, rng, block=self.block, window=self.window)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's share of the epoch, from its first sample (ignores the position)."""
        return self.global_order(epoch)[self.rank::self.num_replicas]

    def __iter__(self) -> Iterator:
        mine = self.indices()[self.position:].tolist()
        if self.with_epoch:
            epoch = self.epoch
            return iter([(epoch, i) for i in mine])
        return iter(mine)

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        blocks = f", order=blocks of {self.block} x {self.window}" if self.order == "blocks" else ""
        return (f"DistributedClipSampler(n={self.n}, rank {self.rank}/{self.num_replicas}, "
                f"shuffle={self.shuffle}{blocks}, seed={self.seed}, epoch={self.epoch}, "
                f"position={self.position})")


_GOLDEN = np.uint64(GOLDEN)


class VideoEpochSampler(DistributedClipSampler):
    """An epoch is a pass over videos: ``k`` of each video's stored clips, chosen anew every epoch.

    The usual Kinetics regime (one random clip per video per epoch) over clips
    converted once: ``video_index[i]`` is the video number of clip ``i`` (as
    ``ClipDataset.video_index()`` gives). For each video the epoch takes
    ``k`` distinct clips at random (all of them, then random repeats, when the
    video has fewer than ``k``), chosen by a generator keyed by (seed, epoch,
    video), so a video's choice depends on nothing else: not on other videos,
    ranks or the resume point. The chosen clips are shuffled by (seed, epoch)
    and then padded or cut and dealt out to ranks exactly as
    ``DistributedClipSampler`` does, with the same ``set_epoch`` /
    ``set_position`` / ``state_dict`` resume. Indices are clip indices.
    ``order``, ``storage_order``, ``block`` and ``window`` as there: with
    ``order="blocks"`` the chosen clips are block-shuffled instead.
    """

    def __init__(self, video_index: Sequence[int] | np.ndarray, *, clips_per_video: int = 1,
                 num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, with_epoch: bool = True, order: str = "random",
                 storage_order: Sequence[int] | np.ndarray | None = None, block: int = 64,
                 window: int = 16) -> None:
        videos = np.asarray(video_index, dtype=np.int64).reshape(-1)
        if videos.size and (videos.min() < 0 or np.any(np.diff(videos) < 0)):
            raise ValueError("video_index must be video numbers >= 0 in clip order (each video's clips together)")
        if isinstance(clips_per_video, bool) or not isinstance(clips_per_video, (int, np.integer)) \
                or clips_per_video < 1:
            raise ValueError(f"clips_per_video must be an int >= 1, got {clips_per_video!r}")
        super().__init__(int(videos.size), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last, with_epoch=with_epoch, order=order, storage_order=storage_order,
                         block=block, window=window)
        self.k = int(clips_per_video)
        # Each video's clips as a run [start, start + count) of clip indices.
        starts = np.flatnonzero(np.diff(videos, prepend=-1)) if videos.size else np.zeros(0, np.int64)
        self.video_start = starts.astype(np.int64)
        self.video_count = np.diff(np.append(starts, videos.size)).astype(np.int64)
        self._set_epoch_size(len(starts) * self.k)

    @property
    def num_videos(self) -> int:
        return int(self.video_start.size)

    def chosen(self, epoch: int) -> np.ndarray:
        """(videos, k) clip indices the epoch takes from each video, before shuffling.

        Clip ``j`` of video ``v`` gets the key hash(seed, epoch, v, j); a video
        takes its ``k`` clips of smallest key. Vectorised (a generator per
        video would cost seconds per epoch at Kinetics scale), and still keyed
        by (seed, epoch, video) alone.
        """
        n, k = self.n, self.k
        video = np.repeat(np.arange(self.num_videos, dtype=np.uint64), self.video_count)
        within = np.arange(n, dtype=np.int64) - np.repeat(self.video_start, self.video_count)
        with np.errstate(over="ignore"):
            base = mix64(np.uint64(self.seed) * _GOLDEN + mix64(np.uint64(epoch) + _GOLDEN))
            keys = mix64(base ^ mix64(video * _GOLDEN + within.astype(np.uint64)))
        # Clips by video, then key. The videos' runs keep their place (video is already sorted), so
        # sorted position p holds a clip of video[p], ranked within[p] in that video by key.
        order = np.lexsort((keys, video))
        out = np.empty((self.num_videos, k), dtype=np.int64)
        take = within < k
        out[video[take].astype(np.int64), within[take]] = order[take]
        for v in np.flatnonzero(self.video_count < k).tolist():  # fewer clips than k: all, then random repeats
            count, start = int(self.video_count[v]), int(self.video_start[v])
            out[v, count:] = start + draws(self.scheme, self.seed, epoch, v).integers(count, k - count)
        return out

    def _epoch_order(self, epoch: int) -> np.ndarray:
        order = self.chosen(epoch).reshape(-1)
        if self.shuffle:
            order = self._shuffled(order, draws(self.scheme, self.seed, epoch))
        return order

    def __repr__(self) -> str:
        return (f"VideoEpochSampler({self.num_videos} videos x {self.k} clips, rank {self.rank}/"
                f"{self.num_replicas}, seed={self.seed}, epoch={self.epoch}, position={self.position})")


__all__ = ["ORDERS", "SCHEME", "SCHEMES", "DistributedClipSampler", "VideoEpochSampler", "block_shuffled", "draws"]
