"""Prefetch of a remote conversion's shards in the sampler's order: ``PrefetchingSampler``.

The sampler knows the epoch's order before any clip is read; this wrapper
turns it into the shards the epoch needs, in the order it first needs them,
and tells the store's ``Prefetcher`` how far the reading has come as it
hands out items (in the training process, ahead of the readers, also when
DataLoader workers read), so the next ``prefetch`` shards download while
the current ones are read. ``build_loader`` puts it around the sampler of a
dataset read from a URL; everything else about the sampler (``set_epoch``,
``state_dict``...) is the wrapped sampler's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from convert.format import ClipStore


def item_index(item: Any) -> int:
    """The clip index of a sampler item: ``i``, or ``(epoch, i)`` / ``(crop, i)``."""
    return int(item[1]) if isinstance(item, (tuple, list)) else int(item)


def shard_order(store: ClipStore, items: Sequence[Any],
                sampler: Any = None) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The shards ``items`` read, in the order they are first needed, with the item positions of each one's
    first and last need.

    Derived from the items themselves: this rank's own share, in any
    sampler's order (the same spans ``DistributedClipSampler.shard_schedule``
    gives for all ranks together).
    """
    del sampler  # the items are the order; the sampler is not asked
    if not len(items):
        return [], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    shards = store.shards_of(np.fromiter((item_index(it) for it in items), dtype=np.int64, count=len(items)))
    distinct, first = np.unique(shards, return_index=True)
    _, from_end = np.unique(shards[::-1], return_index=True)  # same sorted shards: their last need
    last = len(shards) - 1 - from_end
    by_need = np.argsort(first, kind="stable")
    return [int(s) for s in distinct[by_need]], first[by_need], last[by_need]


class PrefetchingSampler(Sampler):
    """``sampler``'s items, unchanged, with the shards they need fetched ahead (see the module docstring)."""

    def __init__(self, sampler: Any, store: ClipStore) -> None:
        self.sampler = sampler
        self.store = store

    def __iter__(self) -> Iterator:
        items = list(iter(self.sampler))
        prefetcher = self.store.prefetcher()
        if prefetcher is None:
            yield from items
            return
        shards, first, last = shard_order(self.store, items, self.sampler)
        prefetcher.plan(shards)
        reached = 0
        for pos, item in enumerate(items):
            if reached + 1 < len(first) and first[reached + 1] <= pos:
                reached = int(np.searchsorted(first, pos, side="right")) - 1
                # The shards begun and not finished: a prefetch does not evict them to make room.
                live = [shards[j] for j in range(reached + 1) if last[j] >= pos]
                prefetcher.advance(reached, live=live)
            yield item

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:
        if name in ("sampler", "store"):
            raise AttributeError(name)
        return getattr(self.sampler, name)


__all__ = ["PrefetchingSampler", "item_index", "shard_order"]
