"""``python -m convert SRC URL``: a conversion written locally, then uploaded, shard by verified shard.

The job itself (plan, shards, restart through the store's atomicity) runs
unchanged on a local staging folder; this layer then checks each shard as
``verify`` does and uploads the files the URL does not already hold, and
uploads ``manifest.json`` last, so a reader never finds a manifest naming a
shard that is not there. A rerun after kill -9 (during the job or the
upload) redoes only what is missing: the job finishes its shards, and the
upload skips every object that is already there with the same content
(the provider's checksum: S3's ETag, single-part or multipart, Google's
MD5; on a ``file://`` URL the bytes read back; anything else is uploaded
again) and removes the objects under a shard's prefix that are not its
files, so the objects at the URL end equal a clean run's (an object store's
put is atomic, and a ``file://`` upload is renamed into place).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any

from convert.format.backends import get_backend
from convert.format.base import hexdigest_of
from convert.format.errors import FormatError
from convert.format.layout import MANIFEST, PLAN, REPORT, SHARD_DIR
from convert.format.manifest import read_manifest

from .cache.settings import default_cache_dir
from .remote import Remote, RemoteError
from .verify import verify_shard


def staging_dir(url: str, staging: str | None = None) -> str:
    """The local folder the job for ``url`` writes into: ``staging``, or one per URL in the user's cache folder."""
    if staging:
        return staging
    tail = "".join(c if c.isalnum() or c in "-_." else "_" for c in url.split("://", 1)[-1])[-40:]
    return os.path.join(default_cache_dir(), "staging", f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{tail}")


def _md5(path: str) -> str:
    with open(path, "rb") as f:
        return hexdigest_of(f, hashlib.md5(usedforsecurity=False))


# Part sizes S3 clients upload in (s3fs's default, boto3's and the AWS CLI's, and other common choices): a
# multipart ETag is checked against the local file split at each size that gives its number of parts.
_PART_SIZES = tuple(m << 20 for m in (50, 8, 5, 16, 32, 64, 100, 128))


def _multipart_etag(path: str, part_size: int) -> str:
    """The ETag S3 gives ``path`` uploaded in parts of ``part_size`` bytes: MD5 of the parts' MD5s, "-", parts."""
    digests = []
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(part_size), b""):
            digests.append(hashlib.md5(block, usedforsecurity=False).digest())
    return f"{hashlib.md5(b''.join(digests), usedforsecurity=False).hexdigest()}-{len(digests)}"


def _same(info: dict[str, Any] | None, local: str, remote: Remote | None = None, rel: str = "") -> bool:
    """Whether the object described by ``info`` (a listing's entry) holds the bytes of file ``local``.

    Sizes alone prove nothing (another conversion's raw shards of the same counts have the same sizes): the
    content is compared through the provider's checksum (S3's ETag, single-part or multipart; Google's MD5),
    or, on a file system (``file://``), read back; an object none of these can vouch for is uploaded again.
    """
    size = os.path.getsize(local)
    if info is None or info.get("size") is None or int(info["size"]) != size:
        return False
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"').lower()
    if len(etag) == 32 and all(c in "0123456789abcdef" for c in etag):  # single part: the ETag is the MD5
        return etag == _md5(local)
    if "-" in etag:
        parts = etag.rsplit("-", 1)[1]
        if parts.isdigit() and int(parts) >= 1:
            n = int(parts)
            sizes = [p for p in _PART_SIZES if max(1, -(-size // p)) == n] or ([size] if n == 1 else [])
            return any(_multipart_etag(local, p) == etag for p in sizes)
        return False
    md5_b64 = info.get("md5Hash")  # Google Cloud Storage
    if isinstance(md5_b64, str):
        import base64

        return base64.b64decode(md5_b64).hex() == _md5(local)
    if remote is not None and remote.scheme == "file":
        return remote.md5(rel) == _md5(local)
    return False


def shard_note(name: str, index: int, count: int, *, sent: int, kept: int, removed: int) -> str:
    """The line said about shard ``name`` (number ``index`` of ``count``) once the URL holds it: ``sent`` of its
    files were uploaded, ``kept`` were there already with the same content, ``removed`` objects not its own.

    A rerun skips what is already there: saying "uploaded" for those would
    read as if the same bytes went over the network again.
    """
    where = f"({index + 1} of {count})"
    if sent == 0 and kept:
        text = f"already uploaded {name} {where}: its {kept} file(s) are there with the same content"
    elif kept:
        text = f"uploaded {name} {where}: {sent} file(s); {kept} already there with the same content"
    else:
        text = f"uploaded {name} {where}"
    if removed:
        text += f"; removed {removed} object(s) under it that are not its files"
    return text


def upload_conversion(local: str, url: str, *, say: Callable[[str], None] = lambda note: None) -> dict[str, int]:
    """Upload the finished conversion at ``local`` to ``url`` (see the module docstring); counts of files."""
    manifest = read_manifest(local)
    files = get_backend(manifest.data.backend).files
    remote = Remote(url)
    listed = remote.listing("")
    manifest_file = os.path.join(local, MANIFEST)
    if MANIFEST in listed and not _same(listed[MANIFEST], manifest_file, remote, MANIFEST):
        # The URL holds another run's manifest: remove it first, so a kill mid-upload never leaves a manifest
        # naming shards that are being replaced.
        remote.remove(MANIFEST)
        del listed[MANIFEST]
    sent = kept = removed = 0
    for index, shard in enumerate(manifest.shards):
        folder = os.path.join(local, shard.path)
        problems = verify_shard(folder, index, manifest, decode=False)
        if problems:
            raise FormatError(f"{folder}: not uploaded to {url}: {problems[0]}")
        shard_sent = shard_kept = shard_removed = 0
        # The files the manifest lists (version 2: those the backend declares); anything else in the folder (a
        # lock file, a writer's temporary) is not the shard's and never uploaded.
        names = files.listed(shard, os.listdir(folder))
        for name in names:
            path = os.path.join(folder, name)
            rel = f"{shard.path}/{name}"
            if _same(listed.get(rel), path, remote, rel):
                shard_kept += 1
                continue
            remote.upload(path, rel)
            shard_sent += 1
        # Objects under the shard's prefix that are not its files (a conversion with more parts before, a killed
        # put's temporary): removed, so the URL holds what a clean upload leaves.
        mine = {f"{shard.path}/{name}" for name in names}
        for rel in sorted(k for k in listed if k.startswith(shard.path + "/") and k not in mine):
            remote.remove(rel)
            shard_removed += 1
        say(shard_note(shard.name, index, len(manifest.shards), sent=shard_sent, kept=shard_kept,
                       removed=shard_removed))
        sent, kept, removed = sent + shard_sent, kept + shard_kept, removed + shard_removed
    # Shard folders the manifest no longer lists (a conversion with more shards before).
    shard_dirs = {s.path + "/" for s in manifest.shards}
    for rel in sorted(k for k in listed if k.startswith(f"{SHARD_DIR}/")
                      and not any(k.startswith(d) for d in shard_dirs)):
        remote.remove(rel)
        removed += 1
    for name in (PLAN, REPORT, MANIFEST):  # the manifest last: its presence says the rest is there
        path = os.path.join(local, name)
        if not os.path.exists(path):
            continue
        if _same(listed.get(name), path, remote, name) and (name != MANIFEST or MANIFEST in listed):
            kept += 1
            continue
        remote.upload(path, name)
        sent += 1
    return {"uploaded": sent, "already_there": kept, "removed": removed}


__all__ = ["RemoteError", "shard_note", "staging_dir", "upload_conversion"]
