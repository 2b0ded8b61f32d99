"""``Prefetcher``: fetches, in the background, the shards a reading order needs next."""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from convert.format.errors import FormatError

if TYPE_CHECKING:
    from .cache import ShardCache


class Prefetcher:
    """Fetches, in the background, the shards a reading order needs next (``settings.prefetch`` ahead).

    ``plan(shards)`` gives an epoch's shards in the order it first needs
    them; ``advance(k, live=...)`` says the reading has reached the k-th of
    them and which shards it still reads. The shards are fetched in the
    plan's order: each one's room is reserved before the next one's, so a
    later shard never takes the room of a sooner one, while up to
    ``settings.downloads`` download at once; the first that finds no room
    ends the round (the next ``advance`` tries again). The live shards and
    those ahead are declared wanted (``ShardCache.want``): a prefetch never
    evicts them to make room, and a reader only when nothing else frees it.
    A prefetch never waits for room and never raises: a shard it could not
    fetch is fetched (or its error raised) by the reader that needs it.
    """

    def __init__(self, cache: ShardCache) -> None:
        self.cache = cache
        self._pool = ThreadPoolExecutor(cache.settings.downloads, thread_name_prefix="shard-prefetch")
        self._driver = ThreadPoolExecutor(1, thread_name_prefix="shard-prefetch-plan")
        self._lock = threading.Lock()
        self._plan: list[int] = []
        self._pos = 0
        self._round = 0
        self._inflight: set[int] = set()
        self.errors: list[str] = []

    def plan(self, shards: Sequence[int]) -> None:
        with self._lock:
            self._plan, self._pos = [int(s) for s in shards], 0
        self.advance(0)

    def advance(self, position: int, *, live: Collection[int] = ()) -> None:
        with self._lock:
            self._pos = max(self._pos, position)
            ahead = self._plan[self._pos:self._pos + 1 + self.cache.settings.prefetch]
            self._round += 1
            token = self._round
        self.cache.want({*live, *ahead})
        self._driver.submit(self._run, token, ahead)

    def _run(self, token: int, ahead: list[int]) -> None:
        """One round: the shards ``ahead`` not there yet, in order, each one's room reserved before the next."""
        for shard in ahead:
            with self._lock:
                if token != self._round:
                    return  # a newer round has the newer plan
                if shard in self._inflight:
                    continue
            if self.cache.present(shard):
                continue
            with self._lock:
                self._inflight.add(shard)
            reserved = threading.Event()
            future = self._pool.submit(self._fetch, shard, reserved)
            while not reserved.wait(0.05):
                if future.done():
                    break
            if not reserved.is_set() and not future.result():  # the loop ended: reserved, or the fetch done
                return  # no room without evicting what is read now or sooner: the next advance tries again

    def _fetch(self, shard: int, reserved: threading.Event) -> bool:
        try:
            return self.cache.fetch(shard, wait=False, on_reserved=reserved.set)
        except (OSError, FormatError) as exc:
            self.errors.append(str(exc))  # the reader that needs the shard fetches it again and raises
            return False
        finally:
            with self._lock:
                self._inflight.discard(shard)

    def close(self) -> None:
        with self._lock:
            self._round += 1  # a round in progress stops at its next shard
        self._driver.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.cache.unwant()


__all__ = ["Prefetcher"]
