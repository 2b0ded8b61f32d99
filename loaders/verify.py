"""Check shards against the manifest from the reading side.

The checks are ``convert verify``'s (without decoding every payload); this
version raises a one-line ``DatasetError`` at the first problem, so a
training job stops with the file and the reason.
"""

from __future__ import annotations

from convert.verify import verify_shard

from .clipstore import ClipStore, DatasetError


def verify_store(store: ClipStore) -> dict:
    """Recompute each payload's CRC-32 and each shard's checksum; compare with headers and the manifest.

    Reads every byte of every shard. Returns the counts checked.
    """
    clips = 0
    for index, (path, meta) in enumerate(zip(store.shard_paths, store.manifest["shards"])):
        problems = verify_shard(path, index, store.manifest, decode=False)
        if problems:
            raise DatasetError(f"{path}: checksum mismatch: {problems[0]}")
        clips += meta["clips"]
    return {"shards": len(store.shard_paths), "clips": clips}


__all__ = ["verify_store"]
