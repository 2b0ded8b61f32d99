"""The shard cache's index: what a reader needs of each shard at open, kept beside the shards, small.

A reader opening a conversion needs each shard's metadata, video records
and storage order, not its bulk. ``SummaryIndex`` keeps them per shard (a
JSON file named after the shard and its checksum), so they outlive the
shard's eviction and later opens need no download. A shard whose backend can
index it from a few small files (``ShardFiles.indexer``) is indexed from
those alone; any other shard when it arrives.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from convert.format.backends import get_backend
from convert.format.errors import FormatError
from convert.format.layout import inside
from convert.format.manifest import Manifest
from convert.format.records import VideoRecord

from ..remote import Remote
from .common import INDEX_DIR, write_atomic


@dataclass(frozen=True)
class ShardSummary:
    """What a reader needs of a shard at open, kept in the cache's index: metadata, records, storage order."""

    meta: dict | None
    records: list[VideoRecord]
    storage_order: list[str] | None
    bytes: int


class SummaryIndex:
    """The index of the mirror at ``dir`` of the conversion ``manifest`` at ``remote``: ``files`` and ``sizes`` are
    each shard's listed files (name: bytes) and total, ``urls`` how errors name the shards."""

    def __init__(self, *, dir: str, manifest: Manifest, remote: Remote, files: Sequence[dict[str, int]],
                 sizes: Sequence[int], urls: Sequence[str]) -> None:
        self.dir = os.path.join(dir, INDEX_DIR)
        self.manifest, self.remote = manifest, remote
        self.files, self.sizes, self.urls = list(files), list(sizes), list(urls)

    def path(self, index: int) -> str:
        """Shard ``index``'s entry (named after its checksum too: a rewritten shard is another entry)."""
        entry = self.manifest.shards[index]
        return os.path.join(self.dir, f"{entry.name}-{entry.sha256[:16]}.json")

    def has(self, index: int) -> bool:
        return os.path.exists(self.path(index))

    def save(self, index: int, s: ShardSummary) -> None:
        data = {"meta": s.meta, "records": [r.to_dict() for r in s.records], "storage_order": s.storage_order,
                "bytes": s.bytes}
        write_atomic(self.path(index), json.dumps(data).encode())

    def load(self, index: int) -> ShardSummary | None:
        """The entry of shard ``index``; None when there is none or it is damaged (then removed)."""
        path = self.path(index)
        try:
            with open(path) as f:
                d = json.load(f)
            return ShardSummary(d["meta"], [VideoRecord.from_dict(r, path) for r in d["records"]],
                                d["storage_order"], int(d["bytes"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            # Damaged (a crash of the machine mid-write): the shard itself says it again.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return None

    def from_small_files(self, index: int) -> ShardSummary | None:
        """Index a shard from the small files its backend indexes it from (kilobytes, not the bulk); False when the
        shard has none (a backend without them, or a shard written before them: indexed when it arrives); the
        summary saved otherwise."""
        files = get_backend(self.manifest.data.backend).files
        small = sorted(rel for rel in self.files[index] if files.is_index(rel))
        if files.indexer is None or not small:
            return None  # none listed (a shard written before its backend had them): indexed on arrival
        entry = self.manifest.shards[index]
        tmp = os.path.join(self.dir, f".tmp-{entry.name}-{os.getpid()}-{threading.get_ident()}")
        os.makedirs(tmp, exist_ok=True)
        try:
            for rel in small:
                local = inside(tmp, rel, self.remote.join(f"{entry.path}/{rel}"))
                self.remote.download(f"{entry.path}/{rel}", local, self.files[index][rel])
            meta, records, order = files.indexer(tmp)
        except FormatError as exc:
            raise FormatError(str(exc).replace(tmp, self.urls[index])) from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        summary = ShardSummary(meta, records, order, self.sizes[index])
        self.save(index, summary)
        return summary


def sweep_index(mirror: str) -> None:
    """Remove the folders of indexings whose process is gone from the index of the mirror at ``mirror``."""
    folder = os.path.join(mirror, INDEX_DIR)
    for name in os.listdir(folder):
        if not name.startswith(".tmp-"):
            continue
        try:
            pid = int(name.rsplit("-", 2)[1])
            os.kill(pid, 0)
        except (ValueError, IndexError, ProcessLookupError):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
        except PermissionError:
            pass  # alive, another user's


__all__ = ["ShardSummary", "SummaryIndex", "sweep_index"]
