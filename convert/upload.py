"""``python -m convert SRC URL``: a conversion written locally, then uploaded, shard by verified shard.

The job itself (plan, shards, restart through the store's atomicity) runs
unchanged on a local staging folder; this layer then checks each shard as
``verify`` does and uploads the files the URL does not already hold, and
uploads ``manifest.json`` last, so a reader never finds a manifest naming a
shard that is not there. A rerun after kill -9 (during the job or the
upload) redoes only what is missing: the job finishes its shards, and the
upload skips every object that is already there with the same content
(an S3 ETag that is the file's MD5, else the same size: an object store's
put is atomic, and a ``file://`` upload is renamed into place), so the
objects at the URL end equal a clean run's.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any

from .format.cache import default_cache_dir
from .format.errors import FormatError
from .format.layout import MANIFEST, PLAN, REPORT
from .format.manifest import read_manifest
from .format.remote import Remote, RemoteError
from .format.verify import verify_shard

# Files of a shard folder that are not data (an LMDB writer's lock file).
_SKIP = ("lock.mdb",)


def staging_dir(url: str, staging: str | None = None) -> str:
    """The local folder the job for ``url`` writes into: ``staging``, or one per URL in the user's cache folder."""
    if staging:
        return staging
    tail = "".join(c if c.isalnum() or c in "-_." else "_" for c in url.split("://", 1)[-1])[-40:]
    return os.path.join(default_cache_dir(), "staging", f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{tail}")


def _md5(path: str) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _same(info: dict[str, Any] | None, local: str) -> bool:
    """Whether the object described by ``info`` (a listing's entry) holds the bytes of file ``local``."""
    if info is None or int(info.get("size") or -1) != os.path.getsize(local):
        return False
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    if etag and "-" not in etag and len(etag) == 32:  # a single-part S3 upload: the ETag is the MD5
        return etag == _md5(local)
    return True


def upload_conversion(local: str, url: str, *, say: Callable[[str], None] = lambda note: None) -> dict[str, int]:
    """Upload the finished conversion at ``local`` to ``url`` (see the module docstring); counts of files."""
    manifest = read_manifest(local)
    remote = Remote(url)
    listed = remote.listing("")
    manifest_file = os.path.join(local, MANIFEST)
    if MANIFEST in listed and not _same(listed[MANIFEST], manifest_file):
        # The URL holds another run's manifest: remove it first, so a kill mid-upload never leaves a manifest
        # naming shards that are being replaced.
        remote.remove(MANIFEST)
        del listed[MANIFEST]
    sent = kept = 0
    for index, shard in enumerate(manifest.shards):
        folder = os.path.join(local, shard.path)
        problems = verify_shard(folder, index, manifest, decode=False)
        if problems:
            raise FormatError(f"{folder}: not uploaded to {url}: {problems[0]}")
        for dirpath, _, names in os.walk(folder):
            for name in sorted(names):
                if name in _SKIP:
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, local).replace(os.sep, "/")
                if _same(listed.get(rel), path):
                    kept += 1
                    continue
                remote.upload(path, rel)
                sent += 1
        say(f"uploaded {shard.name} ({index + 1} of {len(manifest.shards)})")
    for name in (PLAN, REPORT, MANIFEST):  # the manifest last: its presence says the rest is there
        path = os.path.join(local, name)
        if not os.path.exists(path):
            continue
        if _same(listed.get(name), path) and (name != MANIFEST or MANIFEST in listed):
            kept += 1
            continue
        remote.upload(path, name)
        sent += 1
    return {"uploaded": sent, "already_there": kept}


__all__ = ["RemoteError", "staging_dir", "upload_conversion"]
