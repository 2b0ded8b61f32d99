"""What the LMDB writer and reader share: the key layout, the process's read handles, checked opening.

Keys (bytes, main database; FORMAT.md, *LMDB shards*):
  ``c/<video id>/<clip index, at least 6 digits>``  a clip value: header, video id, payload
  ``m/done/<video id>``                              the video's record (JSON)
  ``m/shard``                                        the shard's metadata (JSON)
  ``m/order``                                        ids of the videos with clips, in the order their values lie
  ``m/complete``                                     the summary, once the shard is finished

and beside ``data.mdb``, ``index.json``: the metadata, records and order again, for indexing without the data.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

import lmdb

from ..base import ShardFiles, ShardIndex
from ..errors import FormatError
from ..layout import read_json_file
from ..records import MAX_RECORD_BYTES, VideoRecord, sort_records

CLIP_PREFIX = b"c/"
DONE_PREFIX = b"m/done/"
SHARD_KEY = b"m/shard"
COMPLETE_KEY = b"m/complete"
ORDER_KEY = b"m/order"
DATA_FILE = "data.mdb"
LOCK_FILE = "lock.mdb"
INDEX_FILE = "index.json"


def index_object(meta: Any, records: list[VideoRecord], order: Any) -> dict[str, Any]:
    """The JSON object of a shard's index file (FORMAT.md, *LMDB shards*): written with sorted keys and no spaces,
    so the same shard always gives the same bytes."""
    return {"meta": meta, "records": [r.to_dict() for r in records], "order": order}


INDEX_DUMP: dict[str, Any] = {"sort_keys": True, "separators": (",", ":")}


def index_bytes(meta: Any, records: list[VideoRecord], order: Any) -> bytes:
    """The bytes of a shard's index file (``index_object``), as the writer writes them."""
    return json.dumps(index_object(meta, records, order), **INDEX_DUMP).encode()


def shard_index(path: str) -> ShardIndex:
    """(metadata, video records in reading order, storage order) of the shard at ``path`` from its index file
    alone, without ``data.mdb``: what the shard cache indexes a remote shard by before downloading its data.
    FormatError naming the file when it is not one (``verify`` compares it with the data)."""
    where = os.path.join(path, INDEX_FILE)
    d = read_json_file(where, "shard index")
    if not isinstance(d, dict) or not isinstance(d.get("records"), list):
        raise FormatError(f"{where}: not a shard index (an object with meta, records and order)")
    order = d.get("order")
    if order is not None and not (isinstance(order, list) and all(isinstance(v, str) for v in order)):
        raise FormatError(f"{where}: order is not a list of video ids")
    records = [VideoRecord.from_dict(r, where) for r in d["records"]]
    if sort_records(records) != records:
        raise FormatError(f"{where}: the records are not in reading order")
    meta = d.get("meta")
    return (meta if isinstance(meta, dict) else None), records, order


# Records and metadata lie inside the data file; the index file repeats them (written when the shard is finished),
# so a shard is indexed without its bulk. The lock file is LMDB's own (readers open without it), and the index
# file's temporary the writer's.
FILES = ShardFiles(data=(re.escape(DATA_FILE), re.escape(INDEX_FILE)), index=(re.escape(INDEX_FILE),),
                   scratch=(re.escape(LOCK_FILE), re.escape(INDEX_FILE) + r"\.tmp\.\d+"), indexer=shard_index)



def clip_key(video_id: str, clip_index: int) -> bytes:
    """Key of clip ``clip_index`` of ``video_id``: ``c/<video_id>/<index, zero-padded to 6 digits>``."""
    return CLIP_PREFIX + video_id.encode("utf-8") + b"/%06d" % clip_index


def done_key(video_id: str) -> bytes:
    """Key of the per-video record committed with the video's clips."""
    return DONE_PREFIX + video_id.encode("utf-8")


class ShardTruncated(OSError):
    """A data file shorter than its own meta page says (reading on would SIGBUS)."""


def used_bytes(env: lmdb.Environment) -> int:
    return (env.info()["last_pgno"] + 1) * env.stat()["psize"]


class HandleCache:
    """This process's read-only environments, one per shard, opened once under a lock.

    py-lmdb refuses to open an environment twice in one process, readers run
    in threads, and a handle must not cross a fork: the cache opens each
    environment once (under its lock), keys it by real path, and a forked
    child drops what it inherited the first time it asks (closing a handle
    there unmaps it in the child only; the parent's stays valid). The child
    is noticed by its process id, not by a fork hook registered at import.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._envs: dict[str, lmdb.Environment] = {}
        self._pid = os.getpid()
        self._real: dict[str, str] = {}
        # Readers using each handle (``acquire``/``release``): a reader closing lets go of the handle only when
        # it was the last, so a store that indexes through a short-lived reader never closes (or reopens, which
        # py-lmdb refuses while the old one is open) a handle another thread's reader is using.
        self._users: dict[str, int] = {}

    def _after_fork(self) -> None:
        # Only the forking thread exists in the child: a lock held by another
        # parent thread would never be released, so replace it (before taking it).
        self._lock = threading.Lock()
        envs, self._envs = self._envs, {}
        self._users = {}
        self._pid = os.getpid()
        for env in envs.values():
            try:
                env.close()
            except lmdb.Error:
                pass  # a reopen that still fails reports its own reason

    def _realpath(self, path: str) -> str:
        real = self._real.get(path)
        if real is None:
            real = self._real[path] = os.path.realpath(path)
        return real

    def get(self, path: str, *, read_around: bool = True) -> lmdb.Environment:
        """The shared read-only handle on ``path`` (no lock file).

        ``read_around``: whether the kernel's read-around is on for the map, as
        it is for every reader; taken when the handle is first opened (a
        benchmark opens one with it off to measure what it buys).
        """
        if self._pid != os.getpid():
            self._after_fork()
        real = self._realpath(path)
        env = self._envs.get(real)
        if env is not None:
            return env
        with self._lock:
            env = self._envs.get(real)
            if env is None:
                env = self._envs[real] = open_checked(path, read_around=read_around)
            return env

    def acquire(self, path: str) -> lmdb.Environment:
        """The shared handle on ``path``, counted as used by one more reader until its ``release``."""
        if self._pid != os.getpid():
            self._after_fork()
        real = self._realpath(path)
        with self._lock:
            env = self._envs.get(real)
            if env is None:
                env = self._envs[real] = open_checked(path)
            self._users[real] = self._users.get(real, 0) + 1
            return env

    def release(self, path: str) -> None:
        """One reader less on ``path``'s handle: the last one closes it (a forked child's inherited readers
        release nothing: their handles were dropped at the fork)."""
        if self._pid != os.getpid():
            self._after_fork()
            return
        real = self._realpath(path)
        with self._lock:
            left = self._users.get(real, 0) - 1
            if left > 0:
                self._users[real] = left
                return
            self._users.pop(real, None)
            env = self._envs.pop(real, None)
            if env is not None:  # closed under the lock: an open racing it would find the old one still open
                env.close()

    def forget(self, path: str) -> None:
        """Close the cached handle whoever uses it (before a shard is replaced, compacted or deleted)."""
        if self._pid != os.getpid():
            self._after_fork()
        with self._lock:
            real = self._realpath(path)
            self._users.pop(real, None)
            env = self._envs.pop(real, None)
            if env is not None:
                env.close()

    def holds(self, path: str) -> bool:
        return self._pid == os.getpid() and self._realpath(path) in self._envs


def open_checked(path: str, *, read_around: bool = True) -> lmdb.Environment:
    data = os.path.join(path, DATA_FILE)
    if not os.path.exists(data):
        raise FileNotFoundError(f"{path}: shard missing (no {DATA_FILE})")
    # Read-around on (LMDB's default readahead=True; ``read_around=False`` is
    # for the benchmark that measures what it buys). py-lmdb touches every
    # page of a value inside get() (with the GIL released), so with
    # readahead=False (MADV_RANDOM on the map) a clip that is not in the page
    # cache comes in one 4 KB page fault at a time, many times slower than
    # through the kernel's read-around (docs/benchmarks.md, cold reads). The
    # price: read-around reads whole windows (read_ahead_kb), so random reads
    # fetch that much around each clip (docs/reading.md, shards larger than
    # memory).
    env = lmdb.open(path, readonly=True, lock=False, readahead=read_around, subdir=True, max_dbs=0,
                    max_readers=2048)
    # LMDB maps the file and would crash the process with SIGBUS on the first
    # page past its end: refuse a file shorter than its meta page says.
    need, have = used_bytes(env), os.path.getsize(data)
    if have < need:
        env.close()
        raise ShardTruncated(f"{data}: shard truncated ({have} bytes, its LMDB meta page needs {need})")
    return env


# This process's read handles, shared by every reader in it.
HANDLES = HandleCache()


def iter_prefix(txn: lmdb.Transaction, prefix: bytes) -> Iterator[tuple[bytes | memoryview, bytes | memoryview]]:
    """(key, value) pairs whose key starts with ``prefix``, in key order."""
    cur = txn.cursor()
    if not cur.set_range(prefix):
        return
    n = len(prefix)
    for key, value in cur:
        if bytes(key[:n]) != prefix:
            return
        yield key, value


def clip_key_count(txn: lmdb.Transaction) -> int:
    """Number of ``c/`` keys stored, counted by keys only: a damaged value size must not be followed (it
    could point past the file)."""
    cur = txn.cursor()
    if not cur.set_range(CLIP_PREFIX):
        return 0
    return sum(1 for key in cur.iternext(keys=True, values=False) if bytes(key[:2]) == CLIP_PREFIX)


def read_records(txn: lmdb.Transaction, where: str, file_size: int) -> list[VideoRecord]:
    raws = []
    limit = min(MAX_RECORD_BYTES, file_size)
    for key, value in iter_prefix(txn, DONE_PREFIX):
        # A length damaged on disk could point past the end of the file;
        # copying such a value would crash the process with SIGBUS.
        if len(value) > limit:
            raise FormatError(f"{where}: record {bytes(key).decode(errors='replace')} claims {len(value)} bytes "
                              f"(damaged page?)")
        raws.append(bytes(value))
    return VideoRecord.many_from_bytes(raws, where)
