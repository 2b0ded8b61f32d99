"""LMDB shard writer: one environment per shard, one write transaction per video.

A video's clips and its done record commit together, so after kill -9 a video
is either wholly in the shard or wholly absent; a restart skips what is done.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from typing import Callable

import lmdb

from ..format import CLIP_PREFIX, COMPLETE_KEY, DONE_PREFIX, SHARD_KEY, done_key
from .base import ClipProducer, DoneRecord, ShardWriter, checksum_update

log = logging.getLogger(__name__)

MIN_MAP_SIZE = 1 << 20
HEADROOM = 1.5  # grow to used + 1.5x the next video's estimate (map size is virtual)
MAX_GROWTHS = 40


_READERS: dict[tuple[int, str], lmdb.Environment] = {}


def _close_inherited() -> None:
    """In a forked child, close the read handles inherited from the parent.

    py-lmdb's "already open in this process" registry crosses fork with the
    handles, so without this a DataLoader worker (fork start method) could not
    open a shard its parent had read. Closing the child's copies unmaps them in
    the child only; the parent's handles are untouched.
    """
    pid = os.getpid()
    for key in [k for k in _READERS if k[0] != pid]:
        try:
            _READERS.pop(key).close()
        except lmdb.Error:
            pass  # a reopen that still fails reports its own reason


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited)


_REAL: dict[str, str] = {}


def _real(path: str) -> str:
    """realpath, remembered: readers ask for a handle on every batch."""
    real = _REAL.get(path)
    if real is None:
        real = _REAL[path] = os.path.realpath(path)
    return real


class ShardTruncated(OSError):
    """A data file shorter than its own meta page says (reading on would SIGBUS)."""


def open_readonly(path: str) -> lmdb.Environment:
    """This process's one read-only handle on a shard (no lock, no readahead).

    py-lmdb refuses to open an environment twice in one process, and a handle
    must not cross a fork, so handles are cached per (pid, path). A truncated
    file is refused here: LMDB maps it and would crash the process with SIGBUS
    on the first page past its end.
    """
    # The real path: a shard reached through a symlink is still one environment.
    key = (os.getpid(), _real(path))
    env = _READERS.get(key)
    if env is None:
        data = os.path.join(path, "data.mdb")
        if not os.path.exists(data):
            raise FileNotFoundError(f"{path}: shard missing (no data.mdb)")
        env = lmdb.open(path, readonly=True, lock=False, readahead=False, subdir=True, max_dbs=0,
                        max_readers=2048)
        need, have = used_bytes(env), os.path.getsize(data)
        if have < need:
            env.close()
            raise ShardTruncated(f"{data}: shard truncated ({have} bytes, its LMDB meta page needs {need})")
        _READERS[key] = env
    return env


def forget_readonly(path: str) -> None:
    """Close this process's cached handle (before a shard is replaced or deleted)."""
    env = _READERS.pop((os.getpid(), _real(path)), None)
    if env is not None:
        env.close()


def used_bytes(env: lmdb.Environment) -> int:
    return (env.info()["last_pgno"] + 1) * env.stat()["psize"]


def iter_prefix(txn: lmdb.Transaction, prefix: bytes):
    """(key, value) pairs whose key starts with ``prefix``, in key order."""
    cur = txn.cursor()
    if not cur.set_range(prefix):
        return
    n = len(prefix)
    for key, value in cur:
        if bytes(key[:n]) != prefix:
            return
        yield key, value


class LmdbWriter(ShardWriter):
    """Writes ``<path>/data.mdb``; the map grows on demand and never loses a clip."""

    def __init__(self, *, path: str, codec: str, map_size: int | None = None) -> None:
        super().__init__(path=path, codec=codec, map_size=map_size)
        self._recover_compaction()
        os.makedirs(path, exist_ok=True)
        # No fsync per commit: after kill -9 a committed transaction is still
        # whole (the page cache holds it) and an uncommitted one is absent; only
        # a machine crash could lose recent videos, which a rerun redoes. The
        # shard is synced once, when it is finished.
        # writemap: LMDB writes values straight into the file mapping instead of
        # malloc'd pages it then copies out at commit; with two shard processes
        # per two cores this measured 15% faster. The file's apparent size is
        # the map size while writing; finish() trims it to the data.
        self.env = lmdb.open(path, map_size=max(map_size or 64 << 20, MIN_MAP_SIZE), subdir=True,
                             readahead=False, meminit=False, max_dbs=0, sync=False, metasync=False,
                             writemap=True)
        self.growths = 0
        with self.env.begin(write=True) as txn:
            meta = txn.get(SHARD_KEY)
            if meta is None:
                txn.put(SHARD_KEY, json.dumps({"codec": codec}).encode())
            elif json.loads(meta)["codec"] != codec:
                raise ValueError(f"{path}: shard holds codec {json.loads(meta)['codec']!r}, asked for {codec!r}")

    def _recover_compaction(self) -> None:
        """Finish a compaction that a kill interrupted between its two renames."""
        tmp, old = self.path + ".compact", self.path + ".old"
        if not os.path.exists(self.path) and os.path.exists(tmp) and os.path.exists(old):
            os.rename(tmp, self.path)
        for leftover in (tmp, old):
            if os.path.exists(leftover) and os.path.exists(self.path):
                shutil.rmtree(leftover)

    def _grow(self, need: int) -> None:
        new = max(self.env.info()["map_size"] * 2, used_bytes(self.env) + need)
        if self.growths >= MAX_GROWTHS:
            raise lmdb.MapFullError(f"{self.path}: map still full after {MAX_GROWTHS} growths")
        log.info("%s: growing LMDB map to %d bytes", self.path, new)
        self.env.set_mapsize(new)
        self.growths += 1

    def done_records(self) -> dict[str, DoneRecord]:
        with self.env.begin() as txn:
            return {k[len(DONE_PREFIX):].decode(): DoneRecord.from_bytes(v) for k, v in iter_prefix(txn, DONE_PREFIX)}

    def write_video(self, video_id: str, label: int, produce: Callable[[], ClipProducer],
                    estimate_bytes: int) -> DoneRecord:
        need = int(estimate_bytes * HEADROOM) + (1 << 16)
        if used_bytes(self.env) + need > self.env.info()["map_size"]:
            self._grow(need)
        while True:
            gen = produce()
            txn = self.env.begin(write=True)
            try:
                while True:
                    try:
                        clip_index, start, frames = next(gen)
                    except StopIteration as stop:
                        record: DoneRecord = stop.value
                        break
                    key, value = self.encode(video_id, label, clip_index, start, frames)
                    txn.put(key, value)
                if record.clips == 0:
                    # Keep none of it (skip policy, or nothing usable): only the record.
                    txn.abort()
                    txn = self.env.begin(write=True)
                txn.put(done_key(video_id), record.to_bytes())
                txn.commit()
                return record
            except lmdb.MapFullError:
                txn.abort()
                gen.close()
                self._grow(need)
            except BaseException:
                txn.abort()
                gen.close()
                raise

    def complete_record(self) -> dict | None:
        with self.env.begin() as txn:
            raw = txn.get(COMPLETE_KEY)
        return json.loads(raw) if raw is not None else None

    def summarize(self) -> dict:
        """Counts, payload bytes and the content checksum, from what the shard holds."""
        h = hashlib.sha256()
        clips = value_bytes = 0
        with self.env.begin(buffers=True) as txn:
            for key, value in iter_prefix(txn, CLIP_PREFIX):
                checksum_update(h, bytes(key), value)
                clips += 1
                value_bytes += len(value)
            records = [DoneRecord.from_bytes(bytes(v)) for _, v in iter_prefix(txn, DONE_PREFIX)]
        held = sum(r.clips for r in records)
        if held != clips:
            raise ValueError(f"{self.path}: done records count {held} clips, shard holds {clips}")
        return {"videos": len(records), "clips": clips, "value_bytes": value_bytes, "sha256": h.hexdigest()}

    def finish(self, *, compact: bool = False) -> dict:
        summary = self.complete_record()
        if summary is None:
            summary = self.summarize()
            self.env.sync(True)
            with self.env.begin(write=True) as txn:
                txn.put(COMPLETE_KEY, json.dumps(summary, sort_keys=True).encode())
            self.env.sync(True)
        if compact:
            self.compact()
        else:
            self._trim()
        return summary

    def _trim(self) -> None:
        """Cut the file (as long as the map under writemap) to the pages in use."""
        used = used_bytes(self.env)
        self.env.sync(True)
        self.env.close()
        data = os.path.join(self.path, "data.mdb")
        if os.path.getsize(data) > used:
            os.truncate(data, used)
        self.env = lmdb.open(self.path, map_size=used, subdir=True, readonly=True, lock=False,
                             readahead=False, max_dbs=0)

    def compact(self) -> None:
        """Rewrite the environment without free pages so disk use matches the data."""
        tmp, old = self.path + ".compact", self.path + ".old"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        self.env.copy(tmp, compact=True)
        self.env.close()
        os.rename(self.path, old)
        os.rename(tmp, self.path)
        shutil.rmtree(old)
        self.env = lmdb.open(self.path, subdir=True, readahead=False, max_dbs=0)

    def close(self) -> None:
        self.env.close()

    # -- added for --retry-failed (issue 8); to be ported into the backend module ---------
    def forget_video(self, video_id: str) -> None:
        """Delete a video's done record and clips, and the shard's completion mark, in one transaction.

        The video is then pending again, as if never converted; the shard's
        summary (``m/complete``) no longer describes it, so ``finish`` computes it anew.
        """
        prefix = CLIP_PREFIX + video_id.encode("utf-8") + b"/"
        with self.env.begin(write=True) as txn:
            keys = [bytes(k) for k, _ in iter_prefix(txn, prefix)]
            for key in keys:
                txn.delete(key)
            txn.delete(done_key(video_id))
            txn.delete(COMPLETE_KEY)

    @staticmethod
    def read_done(path: str) -> list[DoneRecord]:
        """The done records of a shard (the job's parent reads them once, then lets go)."""
        cached = (os.getpid(), _real(path)) in _READERS
        env = open_readonly(path)
        try:
            with env.begin() as txn:
                return [DoneRecord.from_bytes(v) for _, v in iter_prefix(txn, DONE_PREFIX)]
        finally:
            if not cached:
                forget_readonly(path)
