"""The on-disk format: the one layer below both the writers (``convert``) and the readers (``loaders``).

FORMAT.md is its prose version. Modules: ``layout`` (folder names, the clip
header), ``manifest`` (the typed manifest), ``records`` (video records),
``codecs`` (payloads and what each one is), ``base`` (the backend contract),
``parts`` (the append-only commit protocol), one subpackage per backend
(``lmdb``, ``tfrecord``) registered in ``backends``, ``errors``, ``units``
and ``system`` (process helpers). Shard access (the reader, the cache,
remote storage, the verifier) is ``convert.store``, beside it; this package
imports nothing of it. Importing it imports neither PyAV nor torch: a
training node reads shards with numpy, lmdb and the standard library only.
"""

from __future__ import annotations

from .backends import BACKENDS, get_backend
from .base import SUMMARY_KEYS, Backend, ShardReader, ShardWriter
from .codecs import CODECS_BY_ID, WRITE_CODECS, Codec, Payload, codec_for_id, get_codec
from .errors import FormatError, ShardDamaged, ShardMissing, StoreError, StoreFullError
from .layout import (
                     DAMAGED_DIR,
                     FORMAT_NAME,
                     FORMAT_VERSION,
                     HEADER_SIZE,
                     LOCK,
                     LOG_DIR,
                     MANIFEST,
                     PLAN,
                     PROGRESS_DIR,
                     REPORT,
                     SHARD_DIR,
                     ClipHeader,
                     check_crc,
                     shard_name,
                     unpack_header,
)
from .manifest import DATA_KEYS, DataSpec, Manifest, ShardEntry, check_plan, check_shard_meta, read_manifest, shard_meta
from .records import STATUSES, VideoRecord, sort_records

__all__ = [
    "BACKENDS", "CODECS_BY_ID", "DAMAGED_DIR", "DATA_KEYS", "FORMAT_NAME", "FORMAT_VERSION", "HEADER_SIZE", "LOCK",
    "LOG_DIR", "MANIFEST", "PLAN", "PROGRESS_DIR", "REPORT", "SHARD_DIR", "STATUSES", "SUMMARY_KEYS", "WRITE_CODECS",
    "Backend", "ClipHeader", "Codec", "DataSpec", "FormatError", "Manifest", "Payload",
    "ShardDamaged", "ShardEntry", "ShardMissing", "ShardReader", "ShardWriter", "StoreError", "StoreFullError",
    "VideoRecord", "check_crc", "check_plan", "check_shard_meta", "codec_for_id", "get_backend", "get_codec",
    "read_manifest", "shard_meta", "shard_name", "sort_records", "unpack_header",
]
