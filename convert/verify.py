"""``python -m convert verify OUT``: reopen every shard and check it against the manifest."""

from __future__ import annotations

import hashlib
import json
import os

import lmdb

from .codecs import codec_for_id
from .format import CLIP_PREFIX, DONE_PREFIX, FormatError, check_crc, clip_key, read_manifest, unpack_header
from .writers.base import checksum_update
from .writers.lmdb_writer import iter_prefix, open_readonly


def verify_shard(path: str, meta: dict, manifest: dict, *, decode: bool = True) -> list[str]:
    """Every problem found in one shard, as one-line messages naming the shard.

    ``decode=False`` checks everything but the payloads' decoding (CRC-32s,
    headers, counts, the checksum): what a reader checks before training.
    """
    name = meta["name"]
    if not os.path.exists(os.path.join(path, "data.mdb")):
        return [f"{name}: missing ({path} has no data.mdb)"]
    try:
        env = open_readonly(path)
    except (lmdb.Error, OSError) as exc:
        return [f"{name}: cannot open: {exc}"]
    problems: list[str] = []
    records: list[dict] = []
    h = hashlib.sha256()
    clips = 0
    n_classes = len(manifest["classes"])
    shape = tuple(manifest["clip_shape"]) if manifest.get("clip_shape") else None
    try:
        with env.begin(buffers=True) as txn:
            for key, value in iter_prefix(txn, CLIP_PREFIX):
                key = bytes(key)
                checksum_update(h, key, value)
                clips += 1
                try:
                    header = unpack_header(value)
                    check_crc(value, header)
                    if decode:
                        codec_for_id(header.codec_id).decode(value[header.offset:], header.shape)
                    if clip_key(header.video_id, header.clip_index) != key:
                        raise FormatError(f"header says {header.video_id!r} clip {header.clip_index}")
                    if shape is not None and header.shape != shape:
                        raise FormatError(f"shape {header.shape}, manifest says {shape}")
                    if not 0 <= header.label < n_classes:
                        raise FormatError(f"label {header.label} outside the {n_classes} classes")
                except FormatError as exc:
                    problems.append(f"{name}: {key.decode(errors='replace')}: {exc}")
            records = [json.loads(bytes(v)) for _, v in iter_prefix(txn, DONE_PREFIX)]
    except lmdb.Error as exc:
        problems.append(f"{name}: read failed: {exc}")
    held = sum(r["clips"] for r in records) if not problems else None
    if clips != meta["clips"]:
        problems.append(f"{name}: holds {clips} clips, manifest says {meta['clips']}")
    if held is not None and held != clips:
        problems.append(f"{name}: done records count {held} clips, shard holds {clips}")
    if len(records) != meta["videos"]:
        problems.append(f"{name}: holds {len(records)} video records, manifest says {meta['videos']}")
    if h.hexdigest() != meta["sha256"]:
        problems.append(f"{name}: checksum {h.hexdigest()[:16]}... differs from manifest {meta['sha256'][:16]}...")
    return problems


def verify(out: str) -> tuple[list[str], dict]:
    """All problems in a conversion folder (empty when it is sound), and the counts checked."""
    try:
        manifest = read_manifest(out)
    except FormatError as exc:
        return [str(exc)], {}
    problems: list[str] = []
    for meta in manifest["shards"]:
        problems += verify_shard(os.path.join(out, meta["path"]), meta, manifest)
    totals = manifest["totals"]
    if sum(m["clips"] for m in manifest["shards"]) != totals["clips"]:
        problems.append("manifest: shard clip counts do not add up to totals.clips")
    return problems, {"shards": len(manifest["shards"]), "clips": totals["clips"], "videos": totals["videos"]}
