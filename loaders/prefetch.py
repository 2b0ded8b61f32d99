"""Prefetch of a remote conversion's shards in the sampler's order: ``PrefetchingSampler``.

The sampler knows the epoch's order before any clip is read; this wrapper
turns it into the shards the epoch needs, in the order it first needs them,
and tells the store's ``Prefetcher`` how far the reading has come as it
hands out items (in the training process, ahead of the readers, also when
DataLoader workers read), so the next ``prefetch`` shards download while
the current ones are read. ``build_loader`` puts it around the sampler of a
dataset read from a URL; everything else about the sampler (``set_epoch``,
``state_dict``...) is the wrapped sampler's. ``PrefetchPlan`` is the part
that follows an epoch's items; DALI's source route drives it from the
batches it hands out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from convert.store import ClipStore
from convert.store.cache import Prefetcher


def item_index(item: Any) -> int:
    """The clip index of a sampler item: ``i``, or ``(epoch, i)`` / ``(crop, i)``."""
    return int(item[1]) if isinstance(item, (tuple, list)) else int(item)


def shard_order(store: ClipStore, items: Sequence[Any] | np.ndarray) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The shards ``items`` read, in the order they are first needed, with the item positions of each one's
    first and last need.

    Derived from the items themselves: this rank's own share, in any
    sampler's order (the same spans ``DistributedClipSampler.shard_schedule``
    gives for all ranks together).
    """
    if not len(items):
        return [], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    shards = store.shards_of(np.fromiter((item_index(it) for it in items), dtype=np.int64, count=len(items)))
    distinct, first = np.unique(shards, return_index=True)
    _, from_end = np.unique(shards[::-1], return_index=True)  # same sorted shards: their last need
    last = len(shards) - 1 - from_end
    by_need = np.argsort(first, kind="stable")
    return [int(s) for s in distinct[by_need]], first[by_need], last[by_need]


class PrefetchPlan:
    """An epoch's items as the shard cache's prefetch follows them: ``at(pos)`` as the items are handed out.

    The readers may be reading anywhere from ``behind`` items before the
    position handed out to ``ahead`` items after it (a DataLoader's readers
    are behind its sampler; DALI's external source reads ahead of the
    batches it has given). A shard counts as being read ("live") while any
    of its items is in that span; the prefetch runs from the span's end. The
    prefetcher is told only where the live set changes: ``at`` is cheap.
    """

    def __init__(self, store: ClipStore, items: Sequence[Any] | np.ndarray, *, behind: int = 0,
                 ahead: int = 0) -> None:
        for name, value in (("behind", behind), ("ahead", ahead)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self.prefetcher = store.prefetcher()
        self.behind, self.ahead = behind, ahead
        self.shards, self.first, self.last = shard_order(store, items)
        # Where the live set changes: a shard's first item enters the span, its last one leaves it.
        events = np.unique(np.concatenate([self.first - ahead, self.last + behind + 1]))
        self._events = events[(events > 0) & (events < len(items))]
        self._k = 0
        if self.prefetcher is not None:
            self.prefetcher.plan(self.shards)
            self._tell(self.prefetcher, 0)

    def _tell(self, prefetcher: Prefetcher, pos: int) -> None:
        reached = max(0, int(np.searchsorted(self.first, pos + self.ahead, side="right")) - 1)
        live = [self.shards[j] for j in range(reached + 1) if self.last[j] + self.behind >= pos]
        prefetcher.advance(reached, live=live)

    def at(self, pos: int) -> None:
        """The items before ``pos`` have been handed out."""
        prefetcher = self.prefetcher
        if prefetcher is None or self._k >= len(self._events) or self._events[self._k] > pos:
            return
        self._k = int(np.searchsorted(self._events, pos, side="right"))
        self._tell(prefetcher, pos)


class PrefetchingSampler(Sampler):
    """``sampler``'s items, unchanged, with the shards they need fetched ahead (see the module docstring).

    ``lag``: how many items the loader's readers may be behind the sampler
    (the batches it reads ahead, ``build_loader`` says): a shard counts as
    being read until ``lag`` items after its last one were handed out, so
    neither a prefetch nor, while other room remains, a reader evicts it
    before the readers are done with it.
    """

    def __init__(self, sampler: Any, store: ClipStore, *, lag: int = 0) -> None:
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
            raise ValueError(f"lag must be an int >= 0, got {lag!r}")
        self.sampler = sampler
        self.store = store
        self.lag = lag

    def __iter__(self) -> Iterator:
        items = list(iter(self.sampler))
        if self.store.prefetcher() is None:
            yield from items
            return
        plan = PrefetchPlan(self.store, items, behind=self.lag)
        for pos, item in enumerate(items):
            plan.at(pos)
            yield item

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:
        if name in ("sampler", "store"):
            raise AttributeError(name)
        return getattr(self.sampler, name)


__all__ = ["PrefetchPlan", "PrefetchingSampler", "item_index", "shard_order"]
