"""The on-disk format, shared by the writers (``convert``) and the readers (``loaders``).

One module per backend holds that backend's writer and reader; ``BACKENDS``
picks them by the manifest's ``backend``. Importing this package imports
neither PyAV nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import (DATA_KEYS, STATUSES, ShardDamaged, ShardReader, ShardWriter, StoreError, StoreFullError, VideoRecord,
                   WriterOptions, check_shard_meta, shard_meta, sort_records)
from .codecs import (CODECS_BY_ID, WRITE_CODECS, Codec, codec_for_id, codec_of_manifest, get_codec)
from .layout import (DAMAGED_DIR, FORMAT_NAME, FORMAT_VERSION, HEADER_SIZE, LOCK, LOG_DIR, MANIFEST, PLAN, PROGRESS_DIR, REPORT,
                     SHARD_DIR, ClipHeader, FormatError, ShardMissing, check_crc, check_plan, read_manifest, shard_name, unpack_header)
from .lmdb import LmdbReader, LmdbWriter
from .tfrecord import TFRecordReader, TFRecordWriter


@dataclass(frozen=True)
class Backend:
    """A storage backend: its writer and reader classes."""

    name: str
    writer: type[ShardWriter]
    reader: type[ShardReader]


BACKENDS: dict[str, Backend] = {"lmdb": Backend("lmdb", LmdbWriter, LmdbReader),
                                "tfrecord": Backend("tfrecord", TFRecordWriter, TFRecordReader)}


def get_backend(name: str) -> Backend:
    """The backend called ``name``; the error lists those that exist."""
    backend = BACKENDS.get(name)
    if backend is None:
        raise FormatError(f"unknown backend {name!r}; this reader knows {', '.join(BACKENDS)}")
    return backend


def open_shard(backend: str, path: str) -> ShardReader:
    """A reader for the finished shard at ``path``."""
    return get_backend(backend).reader(path)


__all__ = [
    "BACKENDS", "CODECS_BY_ID", "DAMAGED_DIR", "DATA_KEYS", "FORMAT_NAME", "FORMAT_VERSION", "HEADER_SIZE", "LOCK", "LOG_DIR", "MANIFEST",
    "PLAN", "PROGRESS_DIR", "REPORT", "SHARD_DIR", "STATUSES", "WRITE_CODECS", "Backend", "ClipHeader", "Codec",
    "FormatError", "ShardDamaged", "ShardMissing", "ShardReader", "ShardWriter", "StoreError", "StoreFullError", "VideoRecord", "WriterOptions", "check_crc",
    "check_plan", "check_shard_meta", "codec_for_id", "codec_of_manifest", "get_backend", "get_codec", "open_shard",
    "read_manifest", "shard_meta", "shard_name", "sort_records", "unpack_header",
]
