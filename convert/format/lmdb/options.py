"""How the LMDB backend stores (never what): the initial map size, and compaction of finished shards."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ..base import option


@dataclass(frozen=True)
class LmdbOptions:
    """Writing options of the LMDB backend."""

    map_size: int | None = option(None, flag="--map-size", parse="bytes",
                                  help="lmdb: initial map size per shard, e.g. 4G (default 64M; the map grows "
                                       "before each video from its probed size, and again if ever full)")
    compact: bool = option(False, flag="--compact", parse="switch",
                           help="lmdb: rewrite each finished shard without free pages")

    def __post_init__(self) -> None:
        if self.map_size is not None and (isinstance(self.map_size, bool) or not isinstance(self.map_size, int)
                                          or not 1 <= self.map_size <= sys.maxsize):
            raise ValueError(f"map_size must be an integer of 1..{sys.maxsize} bytes, got {self.map_size!r}")
        if not isinstance(self.compact, bool):
            raise ValueError(f"compact must be True or False, got {self.compact!r}")
