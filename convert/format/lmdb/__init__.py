"""The LMDB backend: one environment per shard, one key per clip, one write transaction per video.

Modules: ``common`` (the key layout, this process's read handles), ``writer``,
``reader``, ``options``. FORMAT.md, *LMDB shards*, is the layout.
"""

from __future__ import annotations

from .common import HANDLES, clip_key, done_key
from .options import LmdbOptions
from .reader import LmdbReader
from .writer import LmdbWriter

__all__ = ["HANDLES", "LmdbOptions", "LmdbReader", "LmdbWriter", "clip_key", "done_key"]
