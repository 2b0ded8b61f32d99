"""Where a conversion's shard files come from, for a ``ClipStore``: a local folder, or the shard cache of a URL.

``ClipStore`` indexes and reads a conversion through one ``ShardSource`` and
never asks which kind it has: ``LocalShards`` opens the shards of a folder in
place; ``CachedShards`` fetches each shard of a URL into the local shard
cache (``convert.store.cache``), verified, before its first read, holds it
there while a read is in progress, and indexes shards from the cache's index
(no download once a shard has been seen). ``shard_source(root, settings)``
picks one for a folder or a URL.
"""

from __future__ import annotations

import contextlib
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from convert.format.backends import get_backend
from convert.format.base import ShardReader
from convert.format.errors import FormatError
from convert.format.manifest import Manifest, read_manifest
from convert.format.records import VideoRecord

from .remote import is_url

if TYPE_CHECKING:
    from .cache.cache import ShardCache
    from .cache.common import Hold
    from .cache.prefetch import Prefetcher
    from .cache.settings import CacheSettings

# Readers of a remote conversion a store keeps open while idle (their shards are not held in the cache: an
# evicted one is reopened on its next use).
IDLE_HOLD = 16


class ShardSource(ABC):
    """The shard files of one conversion, as a reader opens them.

    ``root``: the local folder the shards lie under (the cache's mirror for a
    URL); ``url``: the URL, or None for a folder; ``manifest``: the
    conversion's manifest; ``cache``: the shard cache, or None.
    """

    root: str
    url: str | None = None
    manifest: Manifest
    cache: ShardCache | None = None

    @property
    def backend_reader(self) -> type[ShardReader]:
        return get_backend(self.manifest.data.backend).reader

    def shard_path(self, shard: int) -> str:
        """Where shard ``shard``'s files lie (once fetched, for a URL)."""
        return os.path.join(self.root, self.manifest.shards[shard].path)

    @abstractmethod
    def index(self, shard: int) -> tuple[dict | None, list[VideoRecord], str]:
        """(stored metadata, video records in reading order, how errors name the shard) of shard ``shard``."""

    @abstractmethod
    def storage_order(self, shard: int) -> list[str] | None:
        """The ids of the shard's videos in the order their bytes lie (``ShardReader.storage_order``)."""

    @abstractmethod
    def using(self, shard: int) -> contextlib.AbstractContextManager[ShardReader]:
        """This process's reader of ``shard``, for one read (a cached shard is not evicted meanwhile)."""

    @abstractmethod
    def reader(self, shard: int) -> ShardReader:
        """This process's reader of ``shard`` (opened on first use; a cached shard is fetched, not held)."""

    @abstractmethod
    def where(self, shard: int, video_id: str, clip_index: int) -> str:
        """How errors name one clip of ``shard`` (without fetching it)."""

    def prefetcher(self) -> Prefetcher | None:
        """The prefetcher of a cached conversion (None where nothing is fetched)."""
        return None

    def hold_all(self, shards: Sequence[int]) -> None:  # noqa: B027 - only a cache has shards to hold
        """Keep ``shards`` where they are until ``close()`` (a folder's always are)."""

    @abstractmethod
    def close(self) -> None:
        """Close the readers this source opened (they reopen on next use) and let go of what it holds."""


class LocalShards(ShardSource):
    """The shards of a conversion folder, opened in place."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.manifest = read_manifest(self.root)
        self._readers: dict[int, ShardReader] = {}

    def index(self, shard: int) -> tuple[dict | None, list[VideoRecord], str]:
        # A reader of its own, closed once read: reading the records maps pages all over the shard, which would
        # stay in this process's RSS for as long as the handle stays open (clips reopen it).
        reader = self.backend_reader(self.shard_path(shard))
        try:
            return reader.meta, reader.records(), self.shard_path(shard)
        finally:
            reader.close()

    def storage_order(self, shard: int) -> list[str] | None:
        return self.reader(shard).storage_order()

    @contextlib.contextmanager
    def using(self, shard: int) -> Iterator[ShardReader]:
        yield self.reader(shard)

    def reader(self, shard: int) -> ShardReader:
        r = self._readers.get(shard)
        if r is None:
            r = self._readers[shard] = self.backend_reader(self.shard_path(shard))
        return r

    def where(self, shard: int, video_id: str, clip_index: int) -> str:
        return self.reader(shard).where(video_id, clip_index)

    def close(self) -> None:
        readers, self._readers = self._readers, {}
        for r in readers.values():
            r.close()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_readers": {}}  # readers hold per-process handles: reopened where it lands


class CachedShards(ShardSource):
    """The shards of a conversion at a URL, each fetched whole into the local shard cache and verified before its
    first read.

    Only a read in progress holds a shard: an idle reader holds nothing, so a
    rank that waits (at a barrier, at the end of its epoch) never keeps
    another rank of its node from the room it needs. An idle reader whose
    shard was evicted and fetched again is reopened on its next use.
    """

    def __init__(self, cache: ShardCache) -> None:
        self.cache = self._sc = cache  # _sc: the same, typed as never None
        self.url = cache.url
        self.root = os.path.abspath(cache.dir)
        self.manifest = cache.manifest
        self._readers: dict[int, ShardReader] = {}
        self._orders: dict[int, list[str] | None] = {}
        self._setup()

    def _setup(self) -> None:
        self._holds: dict[int, Hold] = {}
        self._busy: dict[int, int] = {}
        self._used: dict[int, int] = {}
        self._tick = 0
        self._hold_lock = threading.RLock()
        self._open_locks: dict[int, threading.Lock] = {}
        self._prefetcher: Prefetcher | None = None

    def index(self, shard: int) -> tuple[dict | None, list[VideoRecord], str]:
        # The cache's index: no download once a shard has been seen (its summary outlives eviction).
        summary = self._sc.summary(shard)
        self._orders[shard] = summary.storage_order
        return summary.meta, summary.records, self._sc.shard_url(shard)

    def storage_order(self, shard: int) -> list[str] | None:
        return self._orders.get(shard)

    @contextlib.contextmanager
    def using(self, shard: int) -> Iterator[ShardReader]:
        hold = self._sc.acquire(shard, before_wait=lambda: self._trim(0))
        try:
            with self._hold_lock:
                self._busy[shard] = self._busy.get(shard, 0) + 1
            try:
                yield self._current(shard)
            finally:
                with self._hold_lock:
                    self._busy[shard] -= 1
                    self._tick += 1
                    self._used[shard] = self._tick
                    self._trim(IDLE_HOLD)
        finally:
            hold.release()

    def _current(self, shard: int) -> ShardReader:
        """The reader of the copy of ``shard`` in the cache now (the caller holds it there)."""
        with self._hold_lock:
            opening = self._open_locks.setdefault(shard, threading.Lock())
        with opening:  # one open per shard, whichever thread asks first
            r = self._readers.get(shard)
            if r is not None:
                try:
                    # The backend's own test of its files' identity (a folder's inode number alone may be
                    # reused by the copy fetched after an eviction).
                    r.check_unchanged()
                    return r
                except FormatError:
                    # Evicted and fetched again since (the cache verified the new copy against the manifest):
                    # the old reader maps deleted files.
                    self._readers.pop(shard)
                    if not self._busy.get(shard, 0) > 1:
                        r.close()
            r = self._readers[shard] = self.backend_reader(self.shard_path(shard))
            return r

    def _trim(self, keep: int) -> None:
        """Close idle readers (least recently used first) until ``keep`` stay open."""
        with self._hold_lock:
            idle = sorted((self._used.get(s, 0), s) for s in self._readers if not self._busy.get(s))
            for _, s in idle[:max(0, len(self._readers) - keep)]:
                self._readers.pop(s).close()

    def reader(self, shard: int) -> ShardReader:
        # Fetched, not held: reads that must not race an eviction go through ``using``.
        self._sc.acquire(shard).release()
        return self._current(shard)

    def where(self, shard: int, video_id: str, clip_index: int) -> str:
        return f"{self._sc.shard_url(shard)}: {video_id} clip {clip_index}"  # named without fetching the shard

    def prefetcher(self) -> Prefetcher:
        """This process's prefetcher (made on first use)."""
        if self._prefetcher is None:
            from .cache.prefetch import Prefetcher

            self._prefetcher = Prefetcher(self._sc)
        return self._prefetcher

    def hold_all(self, shards: Sequence[int]) -> None:
        """Fetch ``shards`` and hold them until ``close()`` (DALI's native reader, which opens files itself);
        refused in one line when they do not fit the cache together."""
        cache = self._sc
        need = sum(cache.sizes[s] for s in set(shards))
        if need > cache.limit:
            from .cache.common import CacheFullError

            raise CacheFullError(f"{self.url}: this reader needs {len(set(shards))} shards ({need} bytes) in the "
                                 f"cache at once, the cache limit is {cache.limit} bytes: raise --cache-limit")
        for s in shards:
            with self._hold_lock:
                if s in self._holds:
                    continue
            hold = cache.acquire(int(s))
            with self._hold_lock:
                if s in self._holds:
                    hold.release()
                else:
                    self._holds[int(s)] = hold

    def close(self) -> None:
        readers, self._readers = self._readers, {}
        for r in readers.values():
            r.close()
        holds, self._holds = self._holds, {}
        for h in holds.values():
            h.release()
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def __getstate__(self) -> dict:
        state = {**self.__dict__, "_readers": {}}  # readers hold per-process handles: reopened where it lands
        for key in ("_holds", "_busy", "_used", "_tick", "_hold_lock", "_open_locks", "_prefetcher"):
            state.pop(key, None)  # locks and holds are this process's
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()


def shard_source(root: str, settings: CacheSettings | None = None) -> ShardSource:
    """The source of the conversion at ``root``: a folder's shards in place, or a URL's through a ``ShardCache``
    (``settings``: its settings; ignored for a folder)."""
    if not is_url(root):
        return LocalShards(root)
    from .cache.cache import ShardCache

    return CachedShards(ShardCache(root, settings))


__all__ = ["IDLE_HOLD", "CachedShards", "LocalShards", "ShardSource", "shard_source"]
