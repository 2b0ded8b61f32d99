"""Shard writers by backend name."""

from .base import DoneRecord, ShardWriter
from .lmdb_writer import LmdbWriter

WRITERS: dict[str, type[ShardWriter]] = {"lmdb": LmdbWriter}

__all__ = ["WRITERS", "DoneRecord", "ShardWriter", "LmdbWriter"]
