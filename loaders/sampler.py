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
state (``state_dict()["scheme"]``), so that a later scheme can still resume
states of this one; a state without it is taken as this scheme's (the
trainer refuses checkpoints written before the scheme was recorded).

``order="blocks"`` is the order for shards larger than memory (FFCV's
quasi-random order, WebDataset's shard-then-buffer shuffle): the epoch's clips,
taken in the order their bytes lie in the shards (``ClipStore.storage_order``),
are cut into blocks of ``block`` neighbours; the blocks are shuffled, and the
clips of each run of ``window`` consecutive blocks are shuffled together. A
reader then touches about ``window * block`` clips' worth of the shards at a
time, and the kernel's read-ahead, wasted on random reads, brings in clips that
are read next. Ranks are dealt the same order round-robin, so the ranks of one
node read the same blocks through one page cache.

``order="shards"`` is the order for shards fetched whole into a bounded local
cache (object storage, a shared file system): the shards are permuted per
epoch and read ``shard_window`` at a time, the clips of a window shuffled
together (``ShardWindowOrder``, the block order with a shard as the block);
``shard_schedule`` gives a cache the shards in the order the epoch needs them.

The traversal orders are objects (``ClipOrder``: ``RandomOrder``,
``BlockOrder``, ``ShardWindowOrder``), chosen by name (``ORDERS``,
``make_order``) or passed as they are. Each is a function of the epoch's
candidates and its keyed generator alone, never of the rank count: a state
saved on W ranks resumes on W' ranks at the same global position of the same
global order (``EpochPosition``, ``elastic_position``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import Sampler

from .keyed import GOLDEN, keyed_uniform, mix64

# How an epoch's order is drawn: 2, keyed (1, numpy's default_rng, was retired before the first release).
SCHEMES = (2,)
SCHEME = 2


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


def draws(scheme: int, *key: int) -> _KeyedDraws:
    """The generator of ``scheme`` (``SCHEMES``) for ``key``."""
    if scheme not in SCHEMES:
        raise ValueError(f"sampler scheme must be one of {SCHEMES}, got {scheme!r}")
    return _KeyedDraws(*key)


def _world() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _permutation_rank(values: Sequence[int] | np.ndarray, n: int, name: str) -> np.ndarray:
    """``rank[i]``: where clip ``i`` stands in ``values``, a permutation of 0..n-1 (checked)."""
    values = np.asarray(values, dtype=np.int64).reshape(-1)
    if values.size != n or (n and not np.array_equal(np.sort(values), np.arange(n))):
        raise ValueError(f"{name} must hold every clip index 0..{n - 1} once, got {values.size} values")
    rank = np.empty(n, dtype=np.int64)
    rank[values] = np.arange(n)
    return rank


class ClipOrder:
    """How an epoch's clips are arranged: one traversal order of the sampler, chosen by ``name``.

    An order gets the epoch's candidate clips (indices, repeats allowed, in a
    fixed order) and the epoch's keyed generator, and returns them arranged.
    It must be a function of those alone (never of the rank count, the rank
    or the position), so that every rank, a resumed run and a run resumed on
    another number of ranks see one global order. ``check(n)`` is called
    once with the dataset size, before the first epoch.
    """

    name = ""

    def check(self, n: int) -> None:
        """Refuse, in one line, an order that cannot arrange a dataset of ``n`` clips."""

    def arrange(self, candidates: np.ndarray, rng: _KeyedDraws) -> np.ndarray:
        raise NotImplementedError

    def describe(self) -> str:
        """The order in a few words, for ``repr``."""
        return self.name


class RandomOrder(ClipOrder):
    """``order="random"``: a fresh uniform permutation of the candidates each epoch."""

    name = "random"

    def arrange(self, candidates: np.ndarray, rng: _KeyedDraws) -> np.ndarray:
        arranged: np.ndarray = candidates[rng.permutation(candidates.size)]
        return arranged


class BlockOrder(ClipOrder):
    """``order="blocks"``: for shards larger than memory (module docstring, ``block_shuffled``).

    ``storage_order``: the clip indices in the order their bytes lie in the
    shards (``ClipStore.storage_order()``); ``block``: neighbours read
    together; ``window``: blocks shuffled together.
    """

    name = "blocks"

    def __init__(self, *, storage_order: Sequence[int] | np.ndarray, block: int = 64, window: int = 16) -> None:
        self.block, self.window = _positive("block", block), _positive("window", window)
        self.storage_order = np.asarray(storage_order, dtype=np.int64).reshape(-1)
        self._rank: np.ndarray | None = None

    def check(self, n: int) -> None:
        self._rank = _permutation_rank(self.storage_order, n, "storage_order")

    def arrange(self, candidates: np.ndarray, rng: _KeyedDraws) -> np.ndarray:
        if self._rank is None:
            self.check(int(self.storage_order.size))
        return block_shuffled(candidates, cast(np.ndarray, self._rank), rng, block=self.block, window=self.window)

    def describe(self) -> str:
        return f"blocks of {self.block} x {self.window}"


class ShardWindowOrder(ClipOrder):
    """``order="shards"``: whole shards a window at a time, for shards that are fetched whole (remote data).

    ``clip_shards[i]``: the shard clip ``i`` lies in (``clip_shards(store)``).
    Each epoch the shards are permuted (keyed by seed and epoch); each run of
    ``window`` consecutive shards of that permutation is a window, and the
    epoch's clips of one window are shuffled together and read before the
    next window's. So the epoch's global order touches at most ``window``
    shards per window and each shard in one window only: a cache holding
    about ``window`` shards (plus what it prefetches of the next window)
    fetches every shard once per epoch. The block order with a shard as the
    block.
    """

    name = "shards"

    def __init__(self, *, clip_shards: Sequence[int] | np.ndarray, window: int = 4) -> None:
        self.window = _positive("window", window)
        shards = np.asarray(clip_shards, dtype=np.int64).reshape(-1)
        if shards.size and shards.min() < 0:
            raise ValueError("clip_shards must be shard numbers >= 0")
        self.clip_shards = shards
        self.num_shards = int(shards.max()) + 1 if shards.size else 0

    def check(self, n: int) -> None:
        if self.clip_shards.size != n:
            raise ValueError(f"clip_shards must give the shard of each of the {n} clips, got {self.clip_shards.size}")

    def shard_rank(self, rng: _KeyedDraws) -> np.ndarray:
        """``read_at[s]``: the place of shard ``s`` in the epoch's shard permutation (one draw of ``rng``)."""
        read_at = np.empty(self.num_shards, dtype=np.int64)
        read_at[rng.permutation(self.num_shards)] = np.arange(self.num_shards)
        return read_at

    def arrange(self, candidates: np.ndarray, rng: _KeyedDraws) -> np.ndarray:
        candidates = np.asarray(candidates, dtype=np.int64)
        window_of = self.shard_rank(rng)[self.clip_shards[candidates]] // self.window
        # The candidates come in a fixed order (index order, or a video epoch's choice), so keying the
        # within-window shuffle by their place keeps the order a function of (seed, epoch).
        return candidates[np.lexsort((rng.random(candidates.size), window_of))]

    def describe(self) -> str:
        return f"shards, {self.window} at a time"


ORDERS = ("random", "blocks", "shards")


def make_order(order: str | ClipOrder, *, storage_order: Sequence[int] | np.ndarray | None = None, block: int = 64,
               window: int = 16, clip_shards: Sequence[int] | np.ndarray | None = None,
               shard_window: int = 4) -> ClipOrder:
    """The order object for ``order`` (a name of ``ORDERS``, or an order object, returned as it is) and the
    settings that name needs: ``storage_order``/``block``/``window`` for blocks, ``clip_shards``/
    ``shard_window`` for shards. A setting another order needs is refused, so that none is silently ignored."""
    if isinstance(order, ClipOrder):
        given = [k for k, v in (("storage_order", storage_order), ("clip_shards", clip_shards)) if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} go into the order object, not beside it")
        return order
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)} or a ClipOrder, got {order!r}")
    for name, value in (("block", block), ("window", window), ("shard_window", shard_window)):
        _positive(name, value)
    if storage_order is not None and order != "blocks":
        raise ValueError("storage_order is used by order='blocks' only")
    if clip_shards is not None and order != "shards":
        raise ValueError("clip_shards is used by order='shards' only")
    if order == "blocks":
        if storage_order is None:
            raise ValueError("order='blocks' needs storage_order (the dataset's store.storage_order())")
        return BlockOrder(storage_order=storage_order, block=block, window=window)
    if order == "shards":
        if clip_shards is None:
            raise ValueError("order='shards' needs clip_shards (loaders.sampler.clip_shards(store))")
        return ShardWindowOrder(clip_shards=clip_shards, window=shard_window)
    return RandomOrder()


def clip_shards(store: Any) -> np.ndarray:
    """``out[i]``: the shard (its number in the manifest) that clip ``i`` of ``store`` (a ``ClipStore``) lies in."""
    return np.repeat(np.asarray(store.video_shard, dtype=np.int64), np.asarray(store.video_clips, dtype=np.int64))


def block_shuffled(candidates: np.ndarray, storage_rank: np.ndarray, rng: _KeyedDraws, *,
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


class EpochPosition:
    """Where a reader stands: the epoch and this rank's position inside it.

    Shared by the sampler and the DALI loaders, which must offer the trainer
    the same controls. Subclasses set ``epoch``, ``position``,
    ``num_samples`` (this rank's samples per epoch) and ``world_size`` (the
    ranks the epoch is dealt to).

    Elastic resume: ranks are dealt the one global order round-robin, so
    after every rank has read ``position`` samples the ranks together have
    read the first ``position * world_size`` clips of the epoch's global
    order (the ``global_position``), whatever the rank count. A state records
    both; ``load_state_dict`` of a state saved on another number of ranks
    resumes at the same global position, so that over the two runs every
    clip of the epoch is read once.
    """

    epoch: int
    position: int
    # This rank's samples per epoch: an attribute of the sampler, a property of the DALI loaders.
    num_samples: Any
    world_size: Any

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

    @property
    def global_position(self) -> int:
        """Samples of the epoch's global order read by all ranks together: ``position * world_size``."""
        return self.position * int(self.world_size)

    def state_dict(self, consumed: int | None = None) -> dict:
        """``{"epoch", "position", "world_size", "global_position"}``; ``consumed``: samples this rank has used
        this epoch (default: the position set)."""
        position = self.position if consumed is None else operator.index(consumed)
        world = int(self.world_size)
        return {"epoch": self.epoch, "position": position, "world_size": world, "global_position": position * world}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``: the epoch and the position inside it; a state saved on another number of
        ranks resumes at its global position (``elastic_position``)."""
        if "epoch" not in state or "position" not in state:
            raise ValueError(f"state needs keys epoch and position, got {sorted(state)}")
        epoch = int(state["epoch"])
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        position = elastic_position(state, int(self.world_size))
        self.epoch = epoch
        self.set_position(position)


def elastic_position(state: dict, world_size: int) -> int:
    """This rank's position, on ``world_size`` ranks, of a position state saved on any number of ranks.

    A state without ``world_size`` (written before states recorded it) is
    taken as saved on ``world_size`` ranks. Otherwise the position is its
    global position over ``world_size``; one that does not divide is refused
    (the ranks would have to start at different depths; with the global batch
    unchanged it always divides).
    """
    position = int(state["position"])
    saved = state.get("world_size")
    if saved is None or int(saved) == world_size:
        return position
    saved = int(saved)
    if saved < 1:
        raise ValueError(f"state has world_size {saved}, not a rank count >= 1")
    where = int(state.get("global_position", position * saved))
    if where % world_size:
        raise ValueError(f"a state saved on {saved} rank(s) at global position {where} cannot resume on {world_size} "
                         f"rank(s): {where} is not a multiple of {world_size} (resume where all ranks have read a "
                         f"whole number of global batches of the new size)")
    return where // world_size


@dataclass(frozen=True, kw_only=True)
class ShardSpan:
    """One shard of an epoch's schedule (``DistributedClipSampler.shard_schedule``): ``shard`` (its number in
    the manifest), the global positions ``first`` and ``last`` of its first and last clip in the epoch's
    global order, and ``clips`` (how many of the epoch's samples it holds from the start position on)."""

    shard: int
    first: int
    last: int
    clips: int

    def __post_init__(self) -> None:
        if self.shard < 0 or not 0 <= self.first <= self.last or self.clips < 1:
            raise ValueError(f"a shard span needs shard >= 0, 0 <= first <= last and clips >= 1, got shard "
                             f"{self.shard}, first {self.first}, last {self.last}, clips {self.clips}")


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
    trainer counts consumed samples and passes them to ``state_dict``. A state
    saved on another number of ranks resumes at the same global position
    (``EpochPosition``): the epoch's global order does not depend on the rank
    count, only its cut (``drop_last``) or padding does.

    ``order``: the traversal order, a ``ClipOrder`` or its name (``ORDERS``):
    ``"random"`` (default); ``"blocks"``, the block-shuffled order for shards
    larger than memory (module docstring): ``storage_order`` is then the clip
    indices in the order they lie in the shards (``ClipStore.storage_order()``),
    ``block`` the neighbours read together and ``window`` the blocks shuffled
    together (``window * block`` clips should fit in the node's page cache);
    ``"shards"``, whole shards ``shard_window`` at a time (``ShardWindowOrder``;
    ``clip_shards``: each clip's shard, ``clip_shards(store)``), for shards
    fetched whole into a bounded cache.
    """

    num_samples: int  # an attribute here (EpochPosition leaves it to the subclass)

    def __init__(self, n: int, *, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, with_epoch: bool = True, order: str | ClipOrder = "random",
                 storage_order: Sequence[int] | np.ndarray | None = None, block: int = 64,
                 window: int = 16, clip_shards: Sequence[int] | np.ndarray | None = None,
                 shard_window: int = 4) -> None:
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
        self.traversal = make_order(order, storage_order=storage_order, block=block, window=window,
                                    clip_shards=clip_shards, shard_window=shard_window)
        if self.traversal.name != "random" and not shuffle:
            raise ValueError(f"order={self.traversal.name!r} is a shuffle; with shuffle=False the order is the "
                             f"index order")
        self.traversal.check(self.n)
        self.order = self.traversal.name
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.with_epoch = bool(with_epoch)
        self.epoch = 0
        self.position = 0
        self.scheme = SCHEME
        self._set_epoch_size(self.n)

    @property
    def world_size(self) -> int:
        """The ranks the epoch is dealt to (``num_replicas``)."""
        return self.num_replicas

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

    def shard_schedule(self, epoch: int | None = None, clip_to_shard: Sequence[int] | np.ndarray | None = None, *,
                       start: int = 0) -> list[ShardSpan]:
        """The shards the epoch will need, in the order it first needs them: what a shard cache prefetches.

        One ``ShardSpan`` per shard the epoch's global order (all ranks
        together) reads from global position ``start`` on, sorted by
        ``first``, the global position of its first clip; ``last`` is that of
        its last clip, after which no rank reads it again this epoch (it may
        be evicted once every local rank is past it). Rank ``r`` at its
        position ``p`` stands at global position ``p * world_size + r``: the
        ranks advance together, so one schedule serves every node (each node's
        ranks read every part of the global order at about the same time).
        Pass ``start=sampler.global_position`` after a resume. With
        ``order="shards"`` the spans come in windows of at most
        ``shard_window`` shards, each read whole before the next window.

        ``clip_to_shard[i]``: the shard of clip ``i`` (``clip_shards(store)``);
        optional with ``order="shards"``, which knows it.
        """
        if clip_to_shard is None:
            if not isinstance(self.traversal, ShardWindowOrder):
                raise ValueError(f"shard_schedule needs clip_to_shard (clip_shards(store)) with order={self.order!r}")
            shards = self.traversal.clip_shards
        else:
            shards = np.asarray(clip_to_shard, dtype=np.int64).reshape(-1)
            if shards.size != self.n:
                raise ValueError(f"clip_to_shard must give the shard of each of the {self.n} clips, got {shards.size}")
        start = operator.index(start)
        if not 0 <= start <= self.total_size:
            raise ValueError(f"start must be a global position in 0..{self.total_size}, got {start}")
        read = shards[self.global_order(epoch)[start:]]
        if read.size == 0:
            return []
        found, first, clips = np.unique(read, return_index=True, return_counts=True)
        last = read.size - 1 - np.unique(read[::-1], return_index=True)[1]
        spans = [ShardSpan(shard=int(s), first=start + int(f), last=start + int(t), clips=int(c))
                 for s, f, t, c in zip(found, first, last, clips)]
        return sorted(spans, key=lambda span: span.first)

    def state_dict(self, consumed: int | None = None) -> dict:
        """``{"epoch", "position", "world_size", "global_position", "scheme"}``; ``consumed``: samples this rank
        has used this epoch."""
        return {**super().state_dict(consumed), "scheme": self.scheme}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``; a state without ``scheme`` is of this scheme (``SCHEME``);
        one saved on another number of ranks resumes at its global position."""
        scheme = state.get("scheme", SCHEME)
        if scheme not in SCHEMES:
            raise ValueError(f"sampler state has scheme {scheme!r}; this sampler draws with {SCHEMES}")
        super().load_state_dict(state)
        self.scheme = scheme

    def _shuffled(self, candidates: np.ndarray, rng: _KeyedDraws) -> np.ndarray:
        """``candidates`` in this sampler's shuffled order (its ``traversal``)."""
        return self.traversal.arrange(candidates, rng)

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
        order = f", order={self.traversal.describe()}" if self.order != "random" else ""
        return (f"DistributedClipSampler(n={self.n}, rank {self.rank}/{self.num_replicas}, "
                f"shuffle={self.shuffle}{order}, seed={self.seed}, epoch={self.epoch}, "
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
    ``order``, ``storage_order``, ``block``, ``window``, ``clip_shards`` and
    ``shard_window`` as there: with ``order="blocks"`` (or ``"shards"``) the
    chosen clips are block-shuffled (shard-windowed) instead.
    """

    def __init__(self, video_index: Sequence[int] | np.ndarray, *, clips_per_video: int = 1,
                 num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, with_epoch: bool = True, order: str | ClipOrder = "random",
                 storage_order: Sequence[int] | np.ndarray | None = None, block: int = 64,
                 window: int = 16, clip_shards: Sequence[int] | np.ndarray | None = None,
                 shard_window: int = 4) -> None:
        videos = np.asarray(video_index, dtype=np.int64).reshape(-1)
        if videos.size and (videos.min() < 0 or np.any(np.diff(videos) < 0)):
            raise ValueError("video_index must be video numbers >= 0 in clip order (each video's clips together)")
        if isinstance(clips_per_video, bool) or not isinstance(clips_per_video, (int, np.integer)) \
                or clips_per_video < 1:
            raise ValueError(f"clips_per_video must be an int >= 1, got {clips_per_video!r}")
        super().__init__(int(videos.size), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last, with_epoch=with_epoch, order=order, storage_order=storage_order,
                         block=block, window=window, clip_shards=clip_shards, shard_window=shard_window)
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


__all__ = ["ORDERS", "SCHEME", "SCHEMES", "BlockOrder", "ClipOrder", "DistributedClipSampler", "EpochPosition",
           "RandomOrder", "ShardSpan", "ShardWindowOrder", "VideoEpochSampler", "block_shuffled", "clip_shards",
           "draws", "elastic_position", "make_order"]
