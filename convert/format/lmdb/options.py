"""How the LMDB backend stores (never what): the initial map size, and compaction of finished shards."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import check_settings, option
from ..units import MAX_BYTES

# The map a shard opens with when --map-size is not given: small, because the writer grows it before each video
# from the video's probed size, and a large map reserves that much disk up front (LmdbWriter._reserve).
DEFAULT_MAP_SIZE = 64 << 20


@dataclass(frozen=True)
class LmdbOptions:
    """Writing options of the LMDB backend, each declared once (its flag, help, default and range)."""

    map_size: int = option("lmdb", "lmdb: initial map size per shard, e.g. 4G; the map grows before each video "
                                   "from its probed size, and again if ever full", default=DEFAULT_MAP_SIZE,
                           byte_count=True, ge=1, le=MAX_BYTES, flag="--map-size", metavar="BYTES", field_default=True)
    compact: bool = option("lmdb", "lmdb: rewrite each finished shard without free pages", default=False,
                           flag="--compact", field_default=True)

    def __post_init__(self) -> None:
        check_settings(self, ValueError)
