"""Check shards against the manifest from the reading side, through the per-process handles.

``convert verify`` does the same from the writing side; this version raises a
one-line ``DatasetError`` at the first problem, so a training job stops with
the file and the reason.
"""

from __future__ import annotations

import hashlib

from convert.format import CLIP_PREFIX, FormatError, check_crc, unpack_header
from convert.writers.base import checksum_update
from convert.writers.lmdb_writer import iter_prefix

from .clipstore import ClipStore, DatasetError, open_env


def verify_store(store: ClipStore) -> dict:
    """Recompute each value's CRC-32 and each shard's SHA-256; compare with headers and the manifest.

    Reads every byte of every shard. Returns the counts checked.
    """
    clips = 0
    for path, meta in zip(store.shard_paths, store.manifest["shards"]):
        h = hashlib.sha256()
        n = 0
        with open_env(path).begin(buffers=True) as txn:
            for key, value in iter_prefix(txn, CLIP_PREFIX):
                key = bytes(key)
                try:
                    check_crc(value, unpack_header(value))
                except FormatError as exc:
                    raise DatasetError(f"{path}: {key.decode(errors='replace')}: checksum mismatch: {exc}") from exc
                checksum_update(h, key, value)
                n += 1
        if n != meta["clips"]:
            raise DatasetError(f"{path}: holds {n} clips, manifest says {meta['clips']}")
        got = h.hexdigest()
        if got != meta["sha256"]:
            raise DatasetError(f"{path}: checksum mismatch: sha256 of its clips {got[:16]}... "
                               f"differs from the manifest's {meta['sha256'][:16]}...")
        clips += n
    return {"shards": len(store.shard_paths), "clips": clips}


__all__ = ["verify_store"]
