"""The LMDB writer: one environment per shard, one key per clip, one write transaction per video.

A video's clips and its record commit together, so after kill -9 a video is
either wholly in the shard or wholly absent; a restart skips what is done.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Concatenate, ParamSpec, TypeVar

import lmdb
import numpy as np

from ..base import CONTENT_KEY, SUMMARY_KEYS, ClipProducer, ShardWriter, summarize_clips
from ..errors import ShardDamaged, StoreError, StoreFullError, make_folder, store_error, storing
from ..layout import header_len, write_json_atomic
from ..records import VideoRecord
from .common import (
    CLIP_PREFIX,
    COMPLETE_KEY,
    DATA_FILE,
    INDEX_DUMP,
    INDEX_FILE,
    ORDER_KEY,
    SHARD_KEY,
    ShardTruncated,
    clip_key,
    clip_key_count,
    done_key,
    index_object,
    iter_prefix,
    open_checked,
    read_records,
    used_bytes,
)
from .options import LmdbOptions

log = logging.getLogger(__name__)

MIN_MAP_SIZE = 1 << 20
HEADROOM = 1.5  # reserve 1.5x a video's estimated bytes before writing it
SLACK = 64 << 20  # extra map (and reserved file) beyond the next video's need
MAX_GROWTHS = 40
MAX_KEY_BYTES = 511  # LMDB's key size limit in its default build (mdb_env_get_maxkeysize)


P = ParamSpec("P")
R = TypeVar("R")


def _machine(what: str) -> Callable[[Callable[Concatenate[LmdbWriter, P], R]],
                                    Callable[Concatenate[LmdbWriter, P], R]]:
    """A writer method whose LMDB or OS failure is the ``StoreError`` naming the shard and ``what`` failed.

    Every method that touches the environment or its files wears it, so no
    failure of the machine leaves the shard process as a bare exception.
    """
    def wrap(method: Callable[Concatenate[LmdbWriter, P], R]) -> Callable[Concatenate[LmdbWriter, P], R]:
        @functools.wraps(method)
        def inner(self: LmdbWriter, *args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return method(self, *args, **kwargs)
            except StoreError:
                raise
            except lmdb.Error as exc:
                raise StoreError(f"{self.path}: {what}: LMDB failed: {exc}") from exc
            except OSError as exc:
                raise store_error(exc, what, self.path) from None
        return inner
    return wrap


class LmdbWriter(ShardWriter):
    """Writes ``<path>/data.mdb``; the map grows on demand and never loses a clip."""

    backend = "lmdb"

    def __init__(self, *, path: str, codec: str, meta: dict, options: LmdbOptions | None = None) -> None:
        super().__init__(path=path, codec=codec, meta=meta, options=options)
        self._recover_compaction()
        make_folder(path)
        try:
            self._open(options or LmdbOptions())
        except BaseException:
            if getattr(self, "env", None) is not None:
                self.env.close()  # a writer that failed to open holds nothing open
            raise

    @_machine("opening")
    def _open(self, options: LmdbOptions) -> None:
        path = self.path
        self.options = options
        if os.path.exists(os.path.join(path, DATA_FILE)):
            # A damaged file (truncated, not LMDB) must fail here with its
            # cause: writing into it could SIGBUS on pages past its end.
            try:
                open_checked(path).close()
            except (lmdb.Error, ShardTruncated) as exc:
                raise ShardDamaged(f"{path}: cannot be opened: {type(exc).__name__}: {exc}") from exc
        # No fsync per commit: after kill -9 a committed transaction is still
        # whole (the page cache holds it) and an uncommitted one is absent; only
        # a machine crash could lose recent videos, which a rerun redoes. The
        # shard is synced once, when it is finished.
        # writemap: LMDB writes values straight into the file mapping instead of
        # malloc'd pages it then copies out at commit, which measured faster
        # (docs/benchmarks.md). Writing into a mapping on a full disk raises
        # SIGBUS instead of an error, so every page the map can reach is
        # reserved on disk first (``_reserve``).
        try:
            self.env = lmdb.open(path, map_size=max(options.map_size, MIN_MAP_SIZE),
                                 subdir=True, readahead=False, meminit=False, max_dbs=0, sync=False, metasync=False,
                                 writemap=True)
        except lmdb.Error as exc:
            raise StoreError(f"{path}: LMDB cannot open the shard for writing: {exc}") from exc
        self.growths = 0
        self._reserved = 0
        self._reserve(self.env.info()["map_size"])
        with self._write("storing the shard's metadata") as txn:
            stored = txn.get(SHARD_KEY)
            if stored is None:
                txn.put(SHARD_KEY, json.dumps(self.meta, sort_keys=True).encode())
            else:
                self.check_meta(json.loads(bytes(stored)))

    @classmethod
    def id_problem(cls, video_id: str) -> str | None:
        # The longest key a video makes: c/<id>/<clip index of up to 10 digits> (uint32).
        longest = len(CLIP_PREFIX) + len(video_id.encode("utf-8")) + 1 + 10
        if longest > MAX_KEY_BYTES:
            return (f"video id of {len(video_id.encode('utf-8'))} bytes is too long for an LMDB shard (its keys "
                    f"would exceed LMDB's {MAX_KEY_BYTES} bytes); use shorter paths, or --backend tfrecord")
        return None

    def _write(self, what: str) -> _WriteTxn:
        """A write transaction whose LMDB or OS failure is a StoreError naming the shard and ``what``."""
        return _WriteTxn(self, what)

    def _reserve(self, size: int) -> None:
        """Allocate the data file's blocks up to ``size`` bytes; StoreFullError when the device is full."""
        if size <= self._reserved:
            return
        data = os.path.join(self.path, DATA_FILE)
        with storing("opening", data):
            fd = os.open(data, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                return  # the filesystem cannot reserve; writes may still fail late
            err = store_error(exc, "reserving space in", data)
            if isinstance(err, StoreFullError):
                free = shutil.disk_usage(self.path).free
                raise StoreFullError(exc.errno, f"no space left for shard {self.path}: it needs "
                                     f"{size - self._reserved} more bytes, the device has {free} bytes free") from None
            raise err from None
        finally:
            with storing("closing", data):
                os.close(fd)
        self._reserved = size

    def _recover_compaction(self) -> None:
        """Finish a compaction that a kill interrupted between its two renames."""
        tmp, old = self.path + ".compact", self.path + ".old"
        with storing("recovering the compaction of", self.path):
            if not os.path.exists(self.path) and os.path.exists(tmp) and os.path.exists(old):
                os.rename(tmp, self.path)
            for leftover in (tmp, old):
                if os.path.exists(leftover) and os.path.exists(self.path):
                    shutil.rmtree(leftover)

    @_machine("growing the map of")
    def _grow(self, need: int) -> None:
        if self.growths >= MAX_GROWTHS:
            raise StoreError(f"{self.path}: LMDB map still full after {MAX_GROWTHS} growths")
        # Grow to what the next video needs (plus slack) rather than doubling:
        # every byte of the map is reserved on disk, and doubling a large
        # shard's map would reserve as much again as it holds.
        new = max(self.env.info()["map_size"] + need, used_bytes(self.env) + need + SLACK)
        self._reserve(new)
        log.info("%s: growing LMDB map to %d bytes", self.path, new)
        try:
            self.env.set_mapsize(new)
        except lmdb.Error as exc:
            raise StoreError(f"{self.path}: growing the LMDB map failed: {exc}") from exc
        self.growths += 1

    def _file_size(self) -> int:
        return os.path.getsize(os.path.join(self.path, DATA_FILE))

    @_machine("reading the records of")
    def done_records(self) -> dict[str, VideoRecord]:
        with self.env.begin(buffers=True) as txn:
            recs = read_records(txn, self.path, self._file_size())
        return {r.video_id: r for r in recs}

    @_machine("writing shard")
    def write_video(self, video_id: str, label: int, produce: Callable[[], ClipProducer],
                    estimate_bytes: int) -> VideoRecord:
        need = int(estimate_bytes * HEADROOM) + (1 << 16)
        if used_bytes(self.env) + need > self.env.info()["map_size"]:
            self._grow(need)
        while True:
            gen = produce()
            txn = self.env.begin(write=True)
            try:
                def put(c: int, header: bytes, payload: bytes | memoryview, txn: lmdb.Transaction = txn) -> None:
                    txn.put(clip_key(video_id, c), b"".join((header, payload)))

                record = self.drain(video_id, label, gen, put)
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
            except OSError as exc:  # the machine's, wherever it came from: nothing of the video is committed
                txn.abort()
                gen.close()
                raise store_error(exc, "writing shard", self.path) from None
            except BaseException:
                txn.abort()
                gen.close()
                raise

    @_machine("forgetting a video in")
    def forget_video(self, video_id: str) -> None:
        # The index file first: a kill between the two leaves the shard as it was, without it (finish writes it).
        self._drop_index()
        with self._write(f"forgetting {video_id} in") as txn:
            txn.delete(COMPLETE_KEY)
            txn.delete(ORDER_KEY)
            txn.delete(done_key(video_id))
            prefix = CLIP_PREFIX + video_id.encode("utf-8") + b"/"
            for key in [bytes(k) for k, _ in iter_prefix(txn, prefix)]:
                if key[len(prefix):].isdigit():  # not a clip of an id that merely starts the same
                    txn.delete(key)

    @_machine("reading the summary of")
    def complete_record(self) -> dict | None:
        with self.env.begin() as txn:
            raw = txn.get(COMPLETE_KEY)
        return json.loads(raw) if raw is not None else None

    @_machine("summarising")
    def summarize(self) -> tuple[dict, list[str]]:
        """Counts, value bytes, the shard checksum and the content sum from what the shard holds; and its storage
        order.

        The storage order is the ids of the videos with clips, sorted by where
        their first clip's value lies in the map: exact, read off the
        addresses of the values the checksum reads anyway. A compacted shard
        is rewritten in key order, so there it is the order of the keys.
        """
        with self.env.begin(buffers=True) as txn:
            records = read_records(txn, self.path, self._file_size())
            stored = clip_key_count(txn)
            value_bytes = 0
            first_at: dict[str, int] = {}

            def clips() -> Iterator[tuple[memoryview, memoryview]]:
                nonlocal value_bytes
                for rec in records:
                    for c in range(rec.clips):
                        value = txn.get(clip_key(rec.video_id, c))
                        if value is None:
                            raise ValueError(f"{self.path}: {rec.video_id} clip {c} missing")
                        if c == 0:
                            first_at[rec.video_id] = np.frombuffer(value, dtype=np.uint8).ctypes.data
                        value_bytes += len(value)
                        n = header_len(value)
                        yield value[:n], value[n:]

            sha, content = summarize_clips(clips())
        held = sum(r.clips for r in records)
        if held != stored:
            raise ValueError(f"{self.path}: video records count {held} clips, shard holds {stored}")
        where = (lambda vid: clip_key(vid, 0)) if self.options.compact else first_at.__getitem__
        order = sorted(first_at, key=where)
        return {**dict(zip(SUMMARY_KEYS, (len(records), held, value_bytes, sha))), CONTENT_KEY: content}, order

    @_machine("finishing")
    def finish(self) -> dict:
        summary = self.complete_record()
        if summary is None:
            summary, order = self.summarize()
            self._sync()
            with self._write("finishing") as txn:
                txn.put(ORDER_KEY, json.dumps(order, separators=(",", ":")).encode())
                txn.put(COMPLETE_KEY, json.dumps(summary, sort_keys=True).encode())
            self._sync()
        if self.options.compact:
            self.compact()
        else:
            self._trim()
        self._write_index()
        return summary

    def _write_index(self) -> None:
        """The shard's index file (FORMAT.md, *LMDB shards*), from what the finished shard holds, replaced atomically:
        written after any compaction (which rewrites the folder), and again by a rerun's ``finish`` after a kill,
        with the same bytes."""
        with self.env.begin(buffers=True) as txn:
            raw_meta, raw_order = txn.get(SHARD_KEY), txn.get(ORDER_KEY)
            records = read_records(txn, self.path, self._file_size())
            meta = json.loads(bytes(raw_meta)) if raw_meta is not None else None
            order = json.loads(bytes(raw_order)) if raw_order is not None else None
        write_json_atomic(os.path.join(self.path, INDEX_FILE), index_object(meta, records, order), **INDEX_DUMP)

    def _drop_index(self) -> None:
        path = os.path.join(self.path, INDEX_FILE)
        with storing("removing", path):
            if os.path.lexists(path):
                os.remove(path)

    def _sync(self) -> None:
        try:
            self.env.sync(True)
        except lmdb.Error as exc:
            raise StoreError(f"{self.path}: syncing the shard failed: {exc}") from exc

    def _trim(self) -> None:
        """Cut the file (as long as the map under writemap, and reserved) to the pages in use."""
        used = used_bytes(self.env)
        self._sync()
        self.env.close()
        data = os.path.join(self.path, DATA_FILE)
        with storing("trimming", data):
            if os.path.getsize(data) > used:
                os.truncate(data, used)
        self.env = lmdb.open(self.path, map_size=used, subdir=True, readonly=True, lock=False,
                             readahead=False, max_dbs=0)

    @_machine("compacting")
    def compact(self) -> None:
        """Rewrite the environment without free pages so disk use matches the data."""
        tmp, old = self.path + ".compact", self.path + ".old"
        with storing("compacting", self.path):
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            try:
                self.env.copy(tmp, compact=True)
            except lmdb.Error as exc:
                raise StoreError(f"{self.path}: compacting the shard failed: {exc}") from exc
            self.env.close()
            os.rename(self.path, old)
            os.rename(tmp, self.path)
            shutil.rmtree(old)
        self.env = lmdb.open(self.path, subdir=True, readahead=False, max_dbs=0)

    @_machine("closing")
    def close(self) -> None:
        self.env.close()


class _WriteTxn:
    """``with writer._write(what) as txn``: commit on success, abort on error; failures are StoreErrors."""

    def __init__(self, writer: LmdbWriter, what: str) -> None:
        self.writer, self.what = writer, what

    def __enter__(self) -> lmdb.Transaction:
        try:
            self.txn = self.writer.env.begin(write=True)
        except lmdb.Error as exc:
            raise StoreError(f"{self.writer.path}: {self.what}: LMDB failed: {exc}") from exc
        return self.txn

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is not None:
            self.txn.abort()
            if isinstance(exc, lmdb.Error):
                raise StoreError(f"{self.writer.path}: {self.what}: LMDB failed: {exc}") from exc
            return
        try:
            self.txn.commit()
        except lmdb.Error as err:
            raise StoreError(f"{self.writer.path}: {self.what}: LMDB failed: {err}") from err


__all__ = ["LmdbWriter"]
