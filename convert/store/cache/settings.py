"""How a remote conversion is cached: ``CacheSettings``, and where the cache lives by default."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ...format.options import check_settings, derived, option, settings
from ...format.units import MAX_BYTES
from ..remote import ATTEMPTS, BACKOFF_S

# The default limit: this fraction of the cache disk's free space (plus what the cache already holds), so that
# the cache never fills a disk other programs write to.
DEFAULT_FRACTION = 0.8
CACHE = "shard cache"  # the argument group of the cache's options


def default_cache_dir() -> str:
    """The user's cache folder for shards: ``$XDG_CACHE_HOME/videoclips`` (``~/.cache/videoclips``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "videoclips")


@dataclass(frozen=True)
class CacheSettings:
    """How a remote conversion is cached (``open_clips(url, cache=...)``, the commands' ``--cache-*``), each
    setting declared once (``convert.format.options``), so the commands add ``--cache-dir`` and
    ``--cache-limit`` from here.

    ``--cache-dir`` and ``--cache-limit`` are the trainer's settings too:
    ``train.config.TrainConfig`` reuses these two declarations
    (``option_from``), so every command takes and refuses the same values.

    ``cache_dir``: where (default ``default_cache_dir()``); ``limit``: bytes
    the cache may hold (default DEFAULT_FRACTION of its disk's free space);
    ``prefetch``: shards fetched ahead of the reading; ``downloads``: shards
    downloaded at once; ``attempts``/``backoff``: the retry loop of each
    transfer; ``wait_s``: how long a download waits for readers to release
    room; ``storage_options``: passed to fsspec (an endpoint, a profile...).
    """

    cache_dir: str | None = option(
        CACHE, "with a URL: the local shard cache (without it: $XDG_CACHE_HOME/videoclips, i.e. "
               "~/.cache/videoclips; shards read stay there)", metavar="DIR", flag="--cache-dir", field_default=True)
    limit: int | None = option(
        CACHE, f"with a URL: bytes the cache may hold, e.g. 200G (without it: {DEFAULT_FRACTION * 100:.0f}%% of its "
               f"disk's free space)", byte_count=True, ge=1, le=MAX_BYTES, flag="--cache-limit", metavar="BYTES",
        field_default=True)
    prefetch: int = option(CACHE, "shards fetched ahead of the reading", default=2, ge=0, flag="--cache-prefetch",
                           field_default=True)
    downloads: int = option(CACHE, "shards downloaded at once", default=4, ge=1, flag="--cache-downloads",
                            field_default=True)
    attempts: int = option(CACHE, "attempts of each transfer", default=ATTEMPTS, ge=1, flag="--cache-attempts",
                           field_default=True)
    backoff: float = option(CACHE, "seconds before the first retry of a transfer, doubled each time",
                            default=BACKOFF_S, ge=0, flag="--cache-backoff", field_default=True)
    wait_s: float = option(CACHE, "seconds a download waits for readers to release room", default=600.0, ge=0,
                           flag="--cache-wait", field_default=True)
    storage_options: dict[str, Any] = derived(factory=dict)  # noqa: RUF009 - a declaration, not a shared default

    def __post_init__(self) -> None:
        check_settings(self, ValueError)
        if not isinstance(self.storage_options, dict):
            raise ValueError(f"storage_options must be a dict, got {type(self.storage_options).__name__}")


def add_cache_options(container: Any) -> None:
    """``--cache-dir`` and ``--cache-limit`` as a command that reads a conversion at a URL takes them, into an
    argparse parser or group: declared here, parsed into ``cache_dir`` and ``cache_limit`` (the names of the
    trainer's settings, so one reader of a parsed command line serves every command)."""
    declared = settings(CacheSettings)
    declared["cache_dir"].add_to(container)
    declared["limit"].add_to(container, dest="cache_limit")


__all__ = ["DEFAULT_FRACTION", "CacheSettings", "add_cache_options", "default_cache_dir"]
