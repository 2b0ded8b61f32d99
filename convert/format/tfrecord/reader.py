"""The TFRecord reader: a finished (or committed-so-far) shard's part files, read through memory maps."""

from __future__ import annotations

import mmap
import os
import re
import threading
from collections.abc import Generator, Iterator, Sequence

import numpy as np

from ..base import ShardFiles, ShardReader, changed_error, file_identity
from ..errors import FormatError, ShardMissing
from ..layout import ClipHeader, read_json_file, unpack_header
from ..parts import COMMIT, PartLog, latest_records, part_name
from ..records import VideoRecord, sort_records
from .schema import REPEATED
from .wire import FRAMING, U32, U64, decode_example, masked_crc

META_FILE = "shard.json"
COMPLETE_FILE = "complete.json"
DATA = "tfrecord"  # a part's record file: part-NNNNN.tfrecord
INDEX = "idx"  # its DALI index: part-NNNNN.idx


def committed_videos(path: str, parts: list[dict]) -> tuple[list[VideoRecord], dict[str, tuple[int, int]]]:
    """The shard's video records in reading order, and where each video's clips start: (part, first record)."""
    by_id = latest_records(parts, path)  # a later part's record wins
    where = {vid: (p, first) for vid, (_, p, first) in by_id.items()}
    return sort_records([rec for rec, _, _ in by_id.values()]), where


def storage_order_of(records: list[VideoRecord], where: dict[str, tuple[int, int]]) -> list[str]:
    """The ids of the videos with clips in the order their clips lie in the part files (exact)."""
    # A video's clips are consecutive records of the part that holds its record.
    clips = {r.video_id: r.clips for r in records}
    return [vid for vid in sorted(where, key=where.__getitem__) if clips.get(vid)]


def shard_index(path: str) -> tuple[dict | None, list[VideoRecord], list[str]]:
    """(metadata, video records, storage order) of the shard at ``path`` from its small files only (shard.json
    and the part commits), without its record files: what a reader indexes a remote shard by before
    downloading it."""
    meta = read_json_file(os.path.join(path, META_FILE), "shard metadata")
    records, where = committed_videos(path, PartLog(path).committed())
    return (meta if isinstance(meta, dict) else None), records, storage_order_of(records, where)


# The metadata, the summary and each part's record, index and commit files. The metadata and the commits (the
# video records) index the shard without its record files.
FILES = ShardFiles(data=(re.escape(META_FILE), re.escape(COMPLETE_FILE), rf"part-\d{{5,}}\.({DATA}|{INDEX}|{COMMIT})"),
                   index=(re.escape(META_FILE), rf"part-\d{{5,}}\.{COMMIT}"), indexer=shard_index)


class TFRecordReader(ShardReader):
    """A finished (or committed-so-far) TFRecord shard: part files read through memory maps."""

    backend = "tfrecord"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        meta_path = os.path.join(path, META_FILE)
        if not os.path.lexists(meta_path):
            raise ShardMissing(f"{path}: shard missing (no {META_FILE})")
        # A rewrite adds, renames or removes files in the folder (parts, commits, the summary): its identity.
        self._identity = file_identity(path)
        meta = read_json_file(meta_path, "shard metadata")
        self._meta: dict | None = meta if isinstance(meta, dict) else None
        done = os.path.join(path, COMPLETE_FILE)
        self._complete: dict | None = read_json_file(done, "shard summary") if os.path.lexists(done) else None
        self._log = PartLog(path)
        self._parts = self._log.committed()
        self._index: dict[int, np.ndarray] = {}
        for part in self._parts:
            clips = 0
            for rec in part["videos"]:
                clips += VideoRecord.from_dict(rec, path).clips
            records, size = part.get("records"), part.get("bytes")
            if not isinstance(records, int) or not isinstance(size, int):
                raise FormatError(f"{self._log.file(part['part'], 'json')}: lacks its records and bytes counts")
            if clips != records:
                raise FormatError(f"{self._log.file(part['part'], 'json')}: its videos have {clips} clips, it says "
                                  f"{records} records")
            if records:
                self._index[part["part"]] = self._load_index(part)
        self._records, self._where = committed_videos(path, self._parts)
        self._maps: dict[int, mmap.mmap] = {}
        self._lock = threading.Lock()

    def _load_index(self, part: dict) -> np.ndarray:
        """The part's index as (records, 2) int64, checked against its record file before it is trusted."""
        n = part["part"]
        data, idx = self._log.file(n, DATA), self._log.file(n, INDEX)
        if not os.path.exists(data):
            raise ShardMissing(f"{data}: record file missing")
        size = os.path.getsize(data)
        if size != part["bytes"]:
            raise FormatError(f"{data}: {size} bytes, its part record says {part['bytes']} (truncated or replaced?)")
        if not os.path.exists(idx):
            raise FormatError(f"{idx}: index file missing (rebuild it with tfrecord2idx {data} {idx})")
        try:
            table = np.loadtxt(idx, dtype=np.int64, ndmin=2)
        except ValueError as exc:
            raise FormatError(f"{idx}: not an index file ('offset length' per line): {exc}") from exc
        if table.shape != (part["records"], 2):
            raise FormatError(f"{idx}: {table.shape[0]} entries for the {part['records']} records of {data} "
                              f"(stale index?)")
        ends = table[:, 0] + table[:, 1]
        if table[0, 0] != 0 or int(ends[-1]) != size or np.any(table[1:, 0] != ends[:-1]):
            raise FormatError(f"{idx}: offsets do not tile {data} ({size} bytes): stale or damaged index")
        return table

    @property
    def meta(self) -> dict | None:
        return self._meta

    def complete(self) -> dict | None:
        return self._complete

    def records(self) -> list[VideoRecord]:
        return self._records

    def storage_order(self) -> list[str]:
        return storage_order_of(self._records, self._where)

    def files(self) -> list[dict]:
        """The record files and their index files (paths relative to the shard folder)."""
        return [{"path": part_name(p["part"], DATA), "index": part_name(p["part"], INDEX),
                 "records": p["records"], "bytes": p["bytes"]} for p in self._parts if p["records"]]

    def _map(self, part: int) -> mmap.mmap:
        mm = self._maps.get(part)
        if mm is None:
            with self._lock:
                mm = self._maps.get(part)
                if mm is None:
                    with open(self._log.file(part, DATA), "rb") as fh:
                        mm = self._maps[part] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        return mm

    def _record(self, part: int, k: int) -> memoryview:
        off, length = self._index[part][k]
        view = memoryview(self._map(part))[off:off + length]
        if length < FRAMING:
            raise FormatError(f"record {k} of {part_name(part, DATA)} is {length} bytes, shorter than framing")
        (n,) = U64.unpack_from(view, 0)
        if FRAMING + n != length:
            raise FormatError(f"record {k} of {part_name(part, DATA)} says {n} bytes of data, its index "
                              f"entry {length - FRAMING}")
        return view[12:12 + n]

    def _clip(self, video_id: str, clip_index: int) -> tuple[memoryview, ClipHeader, memoryview]:
        """(header bytes, header, payload) of one clip, its identity checked against the header."""
        where = self._where.get(video_id)
        if where is None:
            raise FormatError(f"{self.where(video_id, clip_index)}: no such video in the shard")
        part, first = where
        features = decode_example(self._record(part, first + clip_index))
        try:
            header = features["header"][1]
            payload = features["payload"][1]
        except KeyError as exc:
            raise FormatError(f"{self.where(video_id, clip_index)}: record lacks feature {exc}") from None
        if not isinstance(header, memoryview) or not isinstance(payload, memoryview):
            raise FormatError(f"{self.where(video_id, clip_index)}: header and payload must be bytes features")
        head = unpack_header(header, value_len=len(header) + len(payload))
        if (head.video_id, head.clip_index) != (video_id, clip_index):
            raise FormatError(f"{self.where(video_id, clip_index)}: header says {head.video_id!r} clip "
                              f"{head.clip_index}")
        return header, head, payload

    def check_unchanged(self) -> None:
        if file_identity(self.path) != self._identity:
            raise changed_error(self.path)

    def read(self, clips: Sequence[tuple[str, int]]) -> Generator[tuple[int, ClipHeader, memoryview], None, None]:
        self.check_unchanged()
        for pos, (vid, c) in enumerate(clips):
            try:
                _, head, payload = self._clip(vid, c)
            except FormatError as exc:
                raise FormatError(f"{self.where(vid, c)}: {exc}") from exc
            yield pos, head, payload

    def iter_clips(self) -> Iterator[tuple[memoryview, ClipHeader, memoryview]]:
        self.check_unchanged()
        for rec in self._records:
            for c in range(rec.clips):
                yield self._clip(rec.video_id, c)

    def check_storage(self) -> list[str]:
        """Every record's framing CRCs, the index files against a fresh scan, the redundant features."""
        problems = []
        for part in self._parts:
            if not part["records"]:
                continue
            n = part["part"]
            name = self._log.file(n, DATA)
            buf = memoryview(self._map(n))
            pos = k = 0
            index = self._index[n]
            while pos < len(buf):
                if len(buf) - pos < 16:
                    problems.append(f"{name}: {len(buf) - pos} trailing bytes after record {k}")
                    break
                length = bytes(buf[pos:pos + 8])
                (size,) = U64.unpack(length)
                if U32.unpack_from(buf, pos + 8)[0] != masked_crc(length):
                    problems.append(f"{name}: record {k} at byte {pos}: length CRC mismatch")
                    break
                data = buf[pos + 12:pos + 12 + size]
                if pos + 16 + size > len(buf) or U32.unpack_from(buf, pos + 12 + size)[0] != masked_crc(data):
                    problems.append(f"{name}: record {k} at byte {pos}: data CRC mismatch")
                    break
                if k >= len(index) or (int(index[k, 0]), int(index[k, 1])) != (pos, 16 + size):
                    problems.append(f"{name}: record {k} at byte {pos} differs from its index file")
                    break
                try:
                    self._check_features(decode_example(data))
                except FormatError as exc:
                    problems.append(f"{name}: record {k}: {exc}")
                pos += 16 + size
                k += 1
            del buf
        return problems

    @staticmethod
    def _check_features(features: dict) -> None:
        """The features that repeat the header (``schema.REPEATED``) must agree with it."""
        if "header" not in features:
            raise FormatError("record lacks feature 'header'")
        head = unpack_header(features["header"][1])
        for key, read in REPEATED.items():
            got = features.get(key, (None, None))[1]
            if isinstance(got, memoryview):
                got = bytes(got)
            want = read(head)
            if got != want:
                raise FormatError(f"feature {key} {got!r} disagrees with the header's {want!r}")

    def where(self, video_id: str, clip_index: int) -> str:
        where = self._where.get(video_id)
        name = part_name(where[0], DATA) if where else "no part"
        return f"{self.path}: {name}: {video_id} clip {clip_index}"

    def close(self) -> None:
        with self._lock:
            maps, self._maps = self._maps, {}
        for mm in maps.values():
            try:
                mm.close()
            except BufferError:
                pass  # a view handed out earlier is still alive; the map goes with it

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_maps"] = {}
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


__all__ = ["COMPLETE_FILE", "DATA", "FILES", "INDEX", "META_FILE", "TFRecordReader"]
