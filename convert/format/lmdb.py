"""The LMDB backend: one environment per shard, one key per clip, one write transaction per video.

A video's clips and its record commit together, so after kill -9 a video is
either wholly in the shard or wholly absent; a restart skips what is done.

Keys (bytes, main database):
  ``c/<video id>/<clip index, at least 6 digits>``  a clip value: header, video id, payload
  ``m/done/<video id>``                              the video's record (JSON)
  ``m/shard``                                        the shard's metadata (JSON)
  ``m/complete``                                     the summary, once the shard is finished
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import threading
from typing import Callable, Iterator, Sequence

import lmdb

from .base import (MAX_RECORD_BYTES, ClipProducer, ShardDamaged, ShardReader, ShardWriter, StoreError, StoreFullError, VideoRecord,
                   Visitor, WriterOptions, headers_checksum)
from .layout import FormatError, ShardMissing, header_len, unpack_header

log = logging.getLogger(__name__)

CLIP_PREFIX = b"c/"
DONE_PREFIX = b"m/done/"
SHARD_KEY = b"m/shard"
COMPLETE_KEY = b"m/complete"
DATA_FILE = "data.mdb"

MIN_MAP_SIZE = 1 << 20
HEADROOM = 1.5  # reserve 1.5x a video's estimated bytes before writing it
SLACK = 64 << 20  # extra map (and reserved file) beyond the next video's need
MAX_GROWTHS = 40


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
    child drops what it inherited (closing a handle there unmaps it in the
    child only; the parent's stays valid).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._envs: dict[str, lmdb.Environment] = {}
        self._pid = os.getpid()
        self._real: dict[str, str] = {}

    def _after_fork(self) -> None:
        # Only the forking thread exists in the child: a lock held by another
        # parent thread would never be released, so replace it.
        self._lock = threading.Lock()
        envs, self._envs = self._envs, {}
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

    def get(self, path: str) -> lmdb.Environment:
        """The shared read-only handle on ``path`` (no lock file; the kernel's read-around on)."""
        real = self._realpath(path)
        env = self._envs.get(real)
        if env is not None:
            return env
        with self._lock:
            env = self._envs.get(real)
            if env is None:
                env = self._envs[real] = _open_checked(path)
            return env

    def forget(self, path: str) -> None:
        """Close the cached handle (before a shard is replaced, compacted or deleted)."""
        with self._lock:
            env = self._envs.pop(self._realpath(path), None)
        if env is not None:
            env.close()

    def holds(self, path: str) -> bool:
        return self._realpath(path) in self._envs


# Readers keep the kernel's read-around on the shard maps (LMDB's readahead;
# see _open_checked). A module setting only so that ``python -m loaders.bench
# --sections cold`` can show, side by side, what reading with it off costs.
READ_AROUND = True


def _open_checked(path: str) -> lmdb.Environment:
    data = os.path.join(path, DATA_FILE)
    if not os.path.exists(data):
        raise FileNotFoundError(f"{path}: shard missing (no {DATA_FILE})")
    # Read-around on (LMDB's default readahead=True). py-lmdb touches every page of a
    # value inside get() (with the GIL released), so with readahead=False
    # (MADV_RANDOM on the map) a 1 MB clip that is not in the page cache came
    # in as 256 synchronous 4 KB reads: 60-70 clips/s per thread on the dev
    # VM, against 5,000-6,000 reading whole shards with the kernel's
    # read-around, and 100-160 against 60-70 for random clips of a 2 GB file.
    # The price: read-around reads whole windows (read_ahead_kb, 8 MB on that
    # VM, 128 KB by default), so random reads fetch up to that much around
    # each clip. See README, "Shards larger than memory".
    env = lmdb.open(path, readonly=True, lock=False, readahead=READ_AROUND, subdir=True, max_dbs=0, max_readers=2048)
    # LMDB maps the file and would crash the process with SIGBUS on the first
    # page past its end: refuse a file shorter than its meta page says.
    need, have = used_bytes(env), os.path.getsize(data)
    if have < need:
        env.close()
        raise ShardTruncated(f"{data}: shard truncated ({have} bytes, its LMDB meta page needs {need})")
    return env


HANDLES = HandleCache()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=HANDLES._after_fork)


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


def clip_key_count(txn: lmdb.Transaction) -> int:
    """Number of ``c/`` keys stored, counted by keys only: a damaged value size must not be followed (it
    could point past the file)."""
    cur = txn.cursor()
    if not cur.set_range(CLIP_PREFIX):
        return 0
    return sum(1 for key in cur.iternext(keys=True, values=False) if bytes(key[:2]) == CLIP_PREFIX)


def _records(txn: lmdb.Transaction, where: str, file_size: int) -> list[VideoRecord]:
    out = []
    for key, value in iter_prefix(txn, DONE_PREFIX):
        # A length damaged on disk could point past the end of the file;
        # copying such a value would crash the process with SIGBUS.
        if len(value) > min(MAX_RECORD_BYTES, file_size):
            raise FormatError(f"{where}: record {bytes(key).decode(errors='replace')} claims {len(value)} bytes "
                              f"(damaged page?)")
        out.append(VideoRecord.from_bytes(value, where))
    return out


class LmdbWriter(ShardWriter):
    """Writes ``<path>/data.mdb``; the map grows on demand and never loses a clip."""

    backend = "lmdb"

    def __init__(self, *, path: str, codec: str, meta: dict, options: WriterOptions = WriterOptions()) -> None:
        super().__init__(path=path, codec=codec, meta=meta, options=options)
        self._recover_compaction()
        os.makedirs(path, exist_ok=True)
        if os.path.exists(os.path.join(path, DATA_FILE)):
            # A damaged file (truncated, not LMDB) must fail here with its
            # cause: writing into it could SIGBUS on pages past its end.
            try:
                _open_checked(path).close()
            except (lmdb.Error, ShardTruncated) as exc:
                raise ShardDamaged(f"{path}: cannot be opened: {type(exc).__name__}: {exc}") from exc
        # No fsync per commit: after kill -9 a committed transaction is still
        # whole (the page cache holds it) and an uncommitted one is absent; only
        # a machine crash could lose recent videos, which a rerun redoes. The
        # shard is synced once, when it is finished.
        # writemap: LMDB writes values straight into the file mapping instead of
        # malloc'd pages it then copies out at commit; with two shard processes
        # per two cores this measured 15% faster. Writing into a mapping on a
        # full disk raises SIGBUS instead of an error, so every page the map
        # can reach is reserved on disk first (``_reserve``).
        self.env = lmdb.open(path, map_size=max(options.map_size or 64 << 20, MIN_MAP_SIZE), subdir=True,
                             readahead=False, meminit=False, max_dbs=0, sync=False, metasync=False,
                             writemap=True)
        self.growths = 0
        self._reserved = 0
        self._reserve(self.env.info()["map_size"])
        with self.env.begin(write=True) as txn:
            stored = txn.get(SHARD_KEY)
            if stored is None:
                txn.put(SHARD_KEY, json.dumps(meta, sort_keys=True).encode())
            else:
                self.check_meta(json.loads(stored))

    def _reserve(self, size: int) -> None:
        """Allocate the data file's blocks up to ``size`` bytes; StoreFullError when the device is full."""
        if size <= self._reserved:
            return
        data = os.path.join(self.path, DATA_FILE)
        fd = os.open(data, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                return  # the filesystem cannot reserve; writes may still fail late
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                free = shutil.disk_usage(self.path).free
                raise StoreFullError(exc.errno, f"no space left for shard {self.path}: it needs "
                                     f"{size - self._reserved} more bytes, the device has {free} bytes free") from None
            raise StoreError(exc.errno, f"reserving space for shard {self.path} failed: {exc.strerror}") from None
        finally:
            os.close(fd)
        self._reserved = size

    def _recover_compaction(self) -> None:
        """Finish a compaction that a kill interrupted between its two renames."""
        tmp, old = self.path + ".compact", self.path + ".old"
        if not os.path.exists(self.path) and os.path.exists(tmp) and os.path.exists(old):
            os.rename(tmp, self.path)
        for leftover in (tmp, old):
            if os.path.exists(leftover) and os.path.exists(self.path):
                shutil.rmtree(leftover)

    def _grow(self, need: int) -> None:
        if self.growths >= MAX_GROWTHS:
            raise lmdb.MapFullError(f"{self.path}: map still full after {MAX_GROWTHS} growths")
        # Grow to what the next video needs (plus slack) rather than doubling:
        # every byte of the map is reserved on disk, and doubling a large
        # shard's map would reserve as much again as it holds.
        new = max(self.env.info()["map_size"] + need, used_bytes(self.env) + need + SLACK)
        self._reserve(new)
        log.info("%s: growing LMDB map to %d bytes", self.path, new)
        self.env.set_mapsize(new)
        self.growths += 1

    def done_records(self) -> dict[str, VideoRecord]:
        with self.env.begin(buffers=True) as txn:
            recs = _records(txn, self.path, os.path.getsize(os.path.join(self.path, DATA_FILE)))
        return {r.video_id: r for r in recs}

    def write_video(self, video_id: str, label: int, produce: Callable[[], ClipProducer],
                    estimate_bytes: int) -> VideoRecord:
        need = int(estimate_bytes * HEADROOM) + (1 << 16)
        if used_bytes(self.env) + need > self.env.info()["map_size"]:
            self._grow(need)
        while True:
            gen = produce()
            txn = self.env.begin(write=True)
            try:
                record = self.drain(video_id, label, gen, lambda c, header, payload: txn.put(
                    clip_key(video_id, c), b"".join((header, payload))))
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
            except lmdb.Error as exc:  # the store failed, not the video: nothing of it is committed
                txn.abort()
                gen.close()
                raise StoreError(f"{self.path}: LMDB write failed: {exc}") from exc
            except BaseException:
                txn.abort()
                gen.close()
                raise

    def forget_video(self, video_id: str) -> None:
        """Remove a video's record and clips, and the shard's completion mark, in one transaction.

        The video is then pending again, as if never converted (``--retry-failed``);
        ``finish`` computes the shard's summary anew.
        """
        with self.env.begin(write=True) as txn:
            txn.delete(COMPLETE_KEY)
            txn.delete(done_key(video_id))
            prefix = CLIP_PREFIX + video_id.encode("utf-8") + b"/"
            for key in [bytes(k) for k, _ in iter_prefix(txn, prefix)]:
                if key[len(prefix):].isdigit():  # not a clip of an id that merely starts the same
                    txn.delete(key)

    def complete_record(self) -> dict | None:
        with self.env.begin() as txn:
            raw = txn.get(COMPLETE_KEY)
        return json.loads(raw) if raw is not None else None

    def summarize(self) -> dict:
        """Counts, value bytes and the content checksum, from what the shard holds."""
        with self.env.begin(buffers=True) as txn:
            records = _records(txn, self.path, os.path.getsize(os.path.join(self.path, DATA_FILE)))
            stored = clip_key_count(txn)
            value_bytes = 0

            def headers() -> Iterator[memoryview]:
                nonlocal value_bytes
                for rec in records:
                    for c in range(rec.clips):
                        value = txn.get(clip_key(rec.video_id, c))
                        if value is None:
                            raise ValueError(f"{self.path}: {rec.video_id} clip {c} missing")
                        value_bytes += len(value)
                        yield value[:header_len(value)]

            sha = headers_checksum(headers())
        held = sum(r.clips for r in records)
        if held != stored:
            raise ValueError(f"{self.path}: video records count {held} clips, shard holds {stored}")
        return {"videos": len(records), "clips": held, "value_bytes": value_bytes, "sha256": sha}

    def finish(self) -> dict:
        summary = self.complete_record()
        if summary is None:
            summary = self.summarize()
            self.env.sync(True)
            with self.env.begin(write=True) as txn:
                txn.put(COMPLETE_KEY, json.dumps(summary, sort_keys=True).encode())
            self.env.sync(True)
        if self.options.compact:
            self.compact()
        else:
            self._trim()
        return summary

    def _trim(self) -> None:
        """Cut the file (as long as the map under writemap, and reserved) to the pages in use."""
        used = used_bytes(self.env)
        self.env.sync(True)
        self.env.close()
        data = os.path.join(self.path, DATA_FILE)
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


class LmdbReader(ShardReader):
    """A finished LMDB shard through this process's shared read-only handle."""

    backend = "lmdb"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._opened = not HANDLES.holds(path)  # close() lets go only of a handle this reader opened
        if not os.path.exists(os.path.join(path, DATA_FILE)):
            raise ShardMissing(f"{path}: shard missing (no {DATA_FILE})")
        self._env()  # open now: a missing or damaged shard fails here, not mid-epoch
        self.file_size = os.path.getsize(os.path.join(path, DATA_FILE))
        self._records: list[VideoRecord] | None = None
        with self._txn() as txn:
            raw = txn.get(SHARD_KEY)
            done = txn.get(COMPLETE_KEY)
            self._meta: dict | None = json.loads(bytes(raw)) if raw is not None else None
            self._complete: dict | None = json.loads(bytes(done)) if done is not None else None

    def _env(self) -> lmdb.Environment:
        # Asked of the process-wide cache on every use, never kept: a reader
        # that crossed a fork (DataLoader and DALI workers) must not use the
        # handle its parent had open.
        try:
            return HANDLES.get(self.path)
        except (OSError, lmdb.Error) as exc:
            raise FormatError(str(exc) if isinstance(exc, OSError) else f"{self.path}: shard cannot be opened: "
                              f"{exc}") from exc

    def _txn(self):
        try:
            return self._env().begin(buffers=True)
        except lmdb.Error as exc:
            raise FormatError(f"{self.path}: read failed: {exc}") from exc

    @property
    def meta(self) -> dict | None:
        # Version 1 stored only {"codec": name} under m/shard.
        return self._meta if self._meta is not None and "format_version" in self._meta else None

    def complete(self) -> dict | None:
        return self._complete

    def records(self) -> list[VideoRecord]:
        if self._records is None:
            try:
                with self._txn() as txn:
                    self._records = _records(txn, self.path, self.file_size)
            except lmdb.Error as exc:
                raise FormatError(f"{self.path}: read failed: {exc}") from exc
        return self._records

    def _value(self, txn: lmdb.Transaction, video_id: str, clip_index: int):
        """(header, payload view) of one clip; its stored length checked before anything past the header is read."""
        value = txn.get(clip_key(video_id, clip_index))
        if value is None:
            raise FormatError(f"{self.where(video_id, clip_index)}: missing")
        if len(value) > self.file_size:
            raise FormatError(f"{self.where(video_id, clip_index)}: value claims {len(value)} bytes, more than the "
                              f"{self.file_size}-byte file (damaged page?)")
        try:
            header = unpack_header(value, value_len=len(value))
        except FormatError as exc:
            raise FormatError(f"{self.where(video_id, clip_index)}: {exc}") from exc
        if (header.video_id, header.clip_index) != (video_id, clip_index):
            raise FormatError(f"{self.where(video_id, clip_index)}: header says {header.video_id!r} clip "
                              f"{header.clip_index}")
        return value, header

    def visit(self, clips: Sequence[tuple[str, int]], fn: Visitor) -> None:
        try:
            with self._txn() as txn:
                for pos, (vid, c) in enumerate(clips):
                    value, header = self._value(txn, vid, c)
                    try:
                        fn(pos, header, value[header.offset:])
                    except FormatError as exc:
                        raise FormatError(f"{self.where(vid, c)}: {exc}") from exc
        except lmdb.Error as exc:
            raise FormatError(f"{self.path}: read failed: {exc}") from exc

    def iter_clips(self):
        try:
            with self._txn() as txn:
                for rec in self.records():
                    for c in range(rec.clips):
                        value, header = self._value(txn, rec.video_id, c)
                        yield value[:header.offset], header, value[header.offset:]
        except lmdb.Error as exc:
            raise FormatError(f"{self.path}: read failed: {exc}") from exc

    def clip_keys(self) -> int:
        """Number of ``c/`` keys actually stored (verify compares it with the records)."""
        with self._txn() as txn:
            return clip_key_count(txn)

    def checksum(self, version: int) -> str:
        if version >= 2:
            return super().checksum(version)
        # Version 1: over (key length, key, value length, header) of every
        # c/ key in LMDB key order.
        import struct

        h = hashlib.sha256()
        with self._txn() as txn:
            for key, value in iter_prefix(txn, CLIP_PREFIX):
                if len(value) > self.file_size:
                    raise FormatError(f"{self.path}: {bytes(key).decode(errors='replace')}: value claims "
                                      f"{len(value)} bytes (damaged page?)")
                h.update(struct.pack("<I", len(key)))
                h.update(key)
                h.update(struct.pack("<Q", len(value)))
                h.update(value[:header_len(value)])
        return h.hexdigest()

    def check_storage(self) -> list[str]:
        held, stored = sum(r.clips for r in self.records()), self.clip_keys()
        return [] if held == stored else [f"{self.path}: video records count {held} clips, shard holds {stored}"]

    def where(self, video_id: str, clip_index: int) -> str:
        return f"{self.path}: {clip_key(video_id, clip_index).decode(errors='replace')}"

    def close(self) -> None:
        if self._opened:
            HANDLES.forget(self.path)
            self._opened = False
