"""The local shard cache of a conversion at a URL (``ShardCache``), cut along its seams.

``settings`` (``CacheSettings``, the default folder), ``common`` (the
mirror's folder names, lock files and holds, atomic writes, the cache's
errors), ``space`` (bytes held against the limit, reservations, eviction,
the shards the node wants), ``index`` (what a reader needs of each shard at
open, kept beside the shards), ``prefetch`` (the shards a reading order needs
next, fetched in the background), ``cache`` (the mirror: its metadata,
fetching, verifying and holding shards) and ``verify`` (``verify_url``).
"""

from __future__ import annotations

from .cache import ShardCache
from .common import CacheDiskError, CacheFullError, Hold
from .index import ShardSummary
from .prefetch import Prefetcher
from .settings import DEFAULT_FRACTION, CacheSettings, add_cache_options, default_cache_dir

__all__ = ["DEFAULT_FRACTION", "CacheDiskError", "CacheFullError", "CacheSettings", "Hold", "Prefetcher",
           "ShardCache", "ShardSummary", "add_cache_options", "default_cache_dir"]
