"""How a remote conversion is cached: ``CacheSettings``, and where the cache lives by default."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..remote import ATTEMPTS, BACKOFF_S

# The default limit: this fraction of the cache disk's free space (plus what the cache already holds), so that
# the cache never fills a disk other programs write to.
DEFAULT_FRACTION = 0.8


def default_cache_dir() -> str:
    """The user's cache folder for shards: ``$XDG_CACHE_HOME/videoclips`` (``~/.cache/videoclips``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "videoclips")


@dataclass(frozen=True)
class CacheSettings:
    """How a remote conversion is cached (``open_clips(url, cache=...)``, the trainer's ``--cache-*``).

    ``cache_dir``: where (default ``default_cache_dir()``); ``limit``: bytes
    the cache may hold (default DEFAULT_FRACTION of its disk's free space);
    ``prefetch``: shards fetched ahead of the reading; ``downloads``: shards
    downloaded at once; ``attempts``/``backoff``: the retry loop of each
    transfer; ``wait_s``: how long a download waits for readers to release
    room; ``storage_options``: passed to fsspec (an endpoint, a profile...).
    """

    cache_dir: str | None = None
    limit: int | None = None
    prefetch: int = 2
    downloads: int = 4
    attempts: int = ATTEMPTS
    backoff: float = BACKOFF_S
    wait_s: float = 600.0
    storage_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, low in (("prefetch", 0), ("downloads", 1), ("attempts", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"cache {name} must be an integer >= {low}, got {value!r}")
        if self.limit is not None and (isinstance(self.limit, bool) or not isinstance(self.limit, int)
                                       or self.limit < 1):
            raise ValueError(f"cache limit must be a number of bytes >= 1, got {self.limit!r}")
        for name in ("backoff", "wait_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"cache {name} must be a number >= 0, got {value!r}")
        if not isinstance(self.storage_options, dict):
            raise ValueError(f"storage_options must be a dict, got {type(self.storage_options).__name__}")


__all__ = ["DEFAULT_FRACTION", "CacheSettings", "default_cache_dir"]
