"""The TFRecord backend: ``tf.train.Example`` records in files that DALI, TensorFlow and the ``tfrecord`` package read.

A shard is a folder:
  ``shard.json``              the shard's metadata (as LMDB's ``m/shard``)
  ``part-NNNNN.tfrecord``     records, one per clip; a new part starts once one reaches the target size
  ``part-NNNNN.idx``          DALI's index: "offset length" per record (what ``tfrecord2idx`` writes)
  ``part-NNNNN.json``         the part's commit: its video records; written last, so a part without it
                              is unfinished and a restart deletes it and converts its videos again
  ``complete.json``           the summary, once the shard is finished

Records use the standard framing (uint64 length, masked CRC-32C of the
length, data, masked CRC-32C of the data). Each is an Example whose features
are written sorted by name: ``header`` (the clip's 36 + n byte header, as in
an LMDB value), ``payload`` (the codec's payload, as in an LMDB value),
``part_offsets`` / ``part_sizes`` (where DALI's decoders find each frame's
JPEG or LZ4 block inside ``payload``), ``shape``, ``label``, ``video_id``,
``clip_index`` and ``start_frame``.

Records and Examples are written and parsed here (a few varints) rather than
through protobuf: the payload is copied once when written, and read as a
view of the memory-mapped file, never copied.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import re
import shutil
import struct
import threading
from typing import Callable, Iterator, Sequence

import numpy as np

from .base import (ClipProducer, ShardDamaged, ShardReader, ShardWriter, StoreError, StoreFullError, VideoRecord, Visitor,
                   WriterOptions, headers_checksum, sort_records)
from .layout import ClipHeader, FormatError, ShardMissing, unpack_header

META_FILE = "shard.json"
COMPLETE_FILE = "complete.json"
_PART = re.compile(r"part-(\d{5,})\.(tfrecord|idx|json)(\.tmp)?$")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_CRC_MASK = 0xA282EAD8


def part_name(n: int, ext: str) -> str:
    return f"part-{n:05d}.{ext}"


_crc32c: Callable[..., int] | None = None


def _crc32c_fn() -> Callable[..., int]:
    global _crc32c
    if _crc32c is None:
        # Imported on first use: the crc32c package's __init__ reads its own
        # version through importlib.metadata, about 40 ms that every process
        # importing convert.format (the job, each shard process, each loader)
        # would pay even when it never touches a TFRecord shard.
        import crc32c

        _crc32c = crc32c.crc32c
    return _crc32c


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK) & 0xFFFFFFFF


def masked_crc(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC-32C (Castagnoli) of ``data``."""
    return _mask(_crc32c_fn()(data))


def frame_record(*data: bytes | memoryview) -> list[bytes | memoryview]:
    """The pieces of one framed record: length, its masked CRC, data, the data's masked CRC.

    The record's data may come in pieces (an Example's fields, the clip's
    payload among them): they are checksummed one after the other and written
    as they are, never joined into one copy of the record.
    """
    crc32c, crc = _crc32c_fn(), 0
    for piece in data:
        crc = crc32c(piece, crc)
    length = _U64.pack(sum(len(piece) for piece in data))
    return [length, _U32.pack(masked_crc(length)), *data, _U32.pack(_mask(crc))]


# -- protobuf wire format, just what tf.train.Example needs -------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload_len: int) -> bytes:
    """Tag and length of a length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(payload_len)


def _bytes_feature(value: bytes | memoryview) -> list[bytes | memoryview]:
    # Feature{bytes_list = 1: BytesList{value = 1: bytes}}
    inner = _field(1, len(value))
    return [_field(1, len(inner) + len(value)), inner, value]


def _int64_feature(values: Sequence[int]) -> list[bytes]:
    # Feature{int64_list = 3: Int64List{value = 1: packed varints}}; negative ints as 10-byte two's complement
    packed = b"".join(_varint(int(v) & 0xFFFFFFFFFFFFFFFF) for v in values)
    inner = _field(1, len(packed)) + packed
    return [_field(3, len(inner)), inner]


def encode_example(features: dict[str, tuple[str, object]]) -> list[bytes | memoryview]:
    """A serialized Example as pieces to join; ``features``: name -> ("bytes", value) or ("int64", [ints])."""
    entries: list[bytes | memoryview] = []
    for name in sorted(features):
        kind, value = features[name]
        feat = _bytes_feature(value) if kind == "bytes" else _int64_feature(value)  # type: ignore[arg-type]
        feat_len = sum(len(p) for p in feat)
        key = name.encode()
        entry = [_field(1, len(key)), key, _field(2, feat_len), *feat]  # map entry {key = 1, value = 2}
        entries += [_field(1, sum(len(p) for p in entry)), *entry]  # Features.feature = 1
    features_len = sum(len(p) for p in entries)
    return [_field(1, features_len), *entries]  # Example.features = 1


def _read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise FormatError("truncated or malformed varint in an Example")
        byte = buf[pos]
        pos += 1
        n |= (byte & 0x7F) << shift
        if byte < 0x80:
            return n, pos
        shift += 7


def _delimited(buf: memoryview, pos: int, end: int, want: int) -> tuple[int, int, int]:
    """(field number, start, stop) of the length-delimited field at ``pos``; FormatError if it is another kind."""
    tag, pos = _read_varint(buf, pos, end)
    if tag & 7 != 2:
        raise FormatError(f"Example field {tag >> 3} has wire type {tag & 7}, expected length-delimited")
    length, pos = _read_varint(buf, pos, end)
    if pos + length > end:
        raise FormatError("Example field runs past the end of its record")
    if want and tag >> 3 != want:
        raise FormatError(f"Example has field {tag >> 3} where {want} was expected")
    return tag >> 3, pos, pos + length


def decode_example(buf: memoryview) -> dict[str, tuple[str, memoryview | list[int]]]:
    """Features of a serialized Example: bytes features as views of ``buf``, int64 lists as ints."""
    out: dict = {}
    _, pos, end = _delimited(buf, 0, len(buf), 1)
    if end != len(buf):
        raise FormatError("Example has data after its features")
    while pos < end:
        _, epos, eend = _delimited(buf, pos, end, 1)
        pos = eend
        key = value = None
        while epos < eend:
            num, a, b = _delimited(buf, epos, eend, 0)
            epos = b
            if num == 1:
                key = bytes(buf[a:b]).decode("utf-8", errors="replace")
            elif num == 2:
                value = (a, b)
        if key is None or value is None:
            raise FormatError("Example feature without a name or a value")
        kind, a, b = _delimited(buf, value[0], value[1], 0)
        if kind == 1:  # bytes_list
            if a == b:
                out[key] = ("bytes", buf[a:a])
            else:
                _, va, vb = _delimited(buf, a, b, 1)
                out[key] = ("bytes", buf[va:vb])
        elif kind == 3:  # int64_list, packed or not
            ints: list[int] = []
            p = a
            while p < b:
                tag, p = _read_varint(buf, p, b)
                if tag == (1 << 3 | 2):
                    length, p = _read_varint(buf, p, b)
                    stop = p + length
                    while p < stop:
                        v, p = _read_varint(buf, p, stop)
                        ints.append(v - (1 << 64) if v >= 1 << 63 else v)
                elif tag == (1 << 3):
                    v, p = _read_varint(buf, p, b)
                    ints.append(v - (1 << 64) if v >= 1 << 63 else v)
                else:
                    raise FormatError(f"int64 list has field tag {tag}")
            out[key] = ("int64", ints)
        else:
            out[key] = ("other", buf[a:b])
    return out


def clip_features(header: bytes, payload: bytes | memoryview, parts: tuple[np.ndarray, np.ndarray],
                  head) -> dict[str, tuple[str, object]]:
    """The Example features of one clip (``head``: the parsed header)."""
    return {
        "header": ("bytes", header),
        "payload": ("bytes", payload),
        "part_offsets": ("int64", parts[0].tolist()),
        "part_sizes": ("int64", parts[1].tolist()),
        "shape": ("int64", list(head.shape)),
        "label": ("int64", [head.label]),
        "video_id": ("bytes", head.video_id.encode("utf-8")),
        "clip_index": ("int64", [head.clip_index]),
        "start_frame": ("int64", [head.start_frame]),
    }


def _write_json_atomic(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, sort_keys=True)
    os.replace(tmp, path)


def _committed_parts(path: str) -> list[dict]:
    """The parts whose commit file exists, in part order, each checked against its files."""
    # By number, not by name: part-100000 sorts before part-99999 as text,
    # and a later part's video record overrides an earlier one's.
    commits = []
    for name in os.listdir(path):
        m = _PART.match(name)
        if m and m.group(2) == "json" and not m.group(3):
            commits.append((int(m.group(1)), name))
    parts = []
    for number, name in sorted(commits):
        with open(os.path.join(path, name)) as fh:
            try:
                part = json.load(fh)
            except ValueError as exc:
                raise FormatError(f"{os.path.join(path, name)}: not valid JSON: {exc}") from exc
        if part.get("part") != number:
            raise FormatError(f"{os.path.join(path, name)}: says part {part.get('part')}")
        parts.append(part)
    return parts


class _OpenPart:
    """The part being written: a temporary file, its index entries and video records so far."""

    def __init__(self, path: str, number: int) -> None:
        self.number = number
        self.tmp = os.path.join(path, part_name(number, "tfrecord") + ".tmp")
        self.fh = open(self.tmp, "wb")
        self.index: list[tuple[int, int]] = []
        self.videos: list[VideoRecord] = []
        self.size = 0

    def append(self, pieces: list[bytes | memoryview]) -> None:
        length = sum(len(p) for p in pieces)
        self.fh.writelines(pieces)
        self.index.append((self.size, length))
        self.size += length

    def rewind(self, size: int, records: int) -> None:
        """Drop what a failed or discarded video wrote."""
        self.fh.flush()
        self.fh.truncate(size)
        self.fh.seek(size)
        self.size = size
        del self.index[records:]


class TFRecordWriter(ShardWriter):
    """Writes a shard's parts; a part is committed (and survives kill -9) once it is closed."""

    backend = "tfrecord"

    def __init__(self, *, path: str, codec: str, meta: dict, options: WriterOptions = WriterOptions()) -> None:
        super().__init__(path=path, codec=codec, meta=meta, options=options)
        os.makedirs(path, exist_ok=True)
        meta_path = os.path.join(path, META_FILE)
        stored = None
        try:
            if os.path.exists(meta_path):
                with open(meta_path) as fh:
                    stored = json.load(fh)
            self._parts = _committed_parts(path)
        except ValueError as exc:  # JSON that does not parse; FormatError is a ValueError too
            raise ShardDamaged(f"{path}: cannot be opened: {exc}") from exc
        if stored is None:
            _write_json_atomic(meta_path, meta)
        else:
            self.check_meta(stored)
        committed = {p["part"] for p in self._parts}
        for name in os.listdir(path):
            m = _PART.match(name)
            if m and (int(m.group(1)) not in committed or m.group(3)):
                os.remove(os.path.join(path, name))  # an unfinished part: its videos are converted again
        self._done: dict[str, VideoRecord] = {}
        for part in self._parts:
            for rec in part["videos"]:
                self._done[rec["video_id"]] = VideoRecord.from_dict(rec, path)
        self._open: _OpenPart | None = None

    def done_records(self) -> dict[str, VideoRecord]:
        return dict(self._done)

    def _part(self) -> _OpenPart:
        if self._open is None:
            number = self._parts[-1]["part"] + 1 if self._parts else 0
            self._open = _OpenPart(self.path, number)
        return self._open

    def write_video(self, video_id: str, label: int, produce: Callable[[], ClipProducer],
                    estimate_bytes: int) -> VideoRecord:
        part = self._part()
        size, records = part.size, len(part.index)
        gen = produce()

        def put(_: int, header: bytes, payload: bytes | memoryview) -> None:
            head = unpack_header(header)
            features = clip_features(header, payload, self.codec.parts(payload, head.shape), head)
            part.append(frame_record(*encode_example(features)))

        try:
            record = self.drain(video_id, label, gen, put)
            if record.clips == 0:
                part.rewind(size, records)  # keep none of it (skip policy, or nothing usable): only the record
        except OSError as exc:
            gen.close()
            part.rewind(size, records)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                free = shutil.disk_usage(self.path).free
                raise StoreFullError(exc.errno, f"no space left for shard {self.path}: writing it failed with "
                                     f"{exc.strerror}; the device has {free} bytes free") from None
            raise StoreError(exc.errno, f"writing shard {self.path} failed: {exc.strerror}") from None
        except BaseException:
            gen.close()
            part.rewind(size, records)
            raise
        part.videos.append(record)
        self._done[video_id] = record
        if part.size >= self.options.part_bytes:
            self._close_part()
        return record

    def _close_part(self) -> None:
        """Index, rename and commit the open part (the commit file is written last)."""
        part, self._open = self._open, None
        if part is None:
            return
        part.fh.close()
        n = part.number
        if part.index:
            idx = os.path.join(self.path, part_name(n, "idx"))
            with open(idx + ".tmp", "w") as fh:
                fh.writelines(f"{off} {length}\n" for off, length in part.index)
            os.replace(idx + ".tmp", idx)
            os.replace(part.tmp, os.path.join(self.path, part_name(n, "tfrecord")))
        else:
            os.remove(part.tmp)  # only records of videos without clips: no record file
        commit = {"part": n, "records": len(part.index), "bytes": part.size,
                  "videos": [rec.__dict__ for rec in part.videos]}
        _write_json_atomic(os.path.join(self.path, part_name(n, "json")), commit)
        self._parts.append(commit)

    def forget_video(self, video_id: str) -> None:
        """Drop a video without clips from its committed part's record, to convert it again.

        The shard's summary goes too (``finish`` computes it anew).
        """
        rec = self._done.get(video_id)
        if rec is None:
            return
        done = os.path.join(self.path, COMPLETE_FILE)
        if os.path.exists(done):
            os.remove(done)
        if rec.clips:
            raise ValueError(f"{self.path}: {video_id} has clips; only videos without clips can be converted again")
        for part in self._parts:
            kept = [v for v in part["videos"] if v["video_id"] != video_id]
            if len(kept) != len(part["videos"]):
                part["videos"] = kept
                _write_json_atomic(os.path.join(self.path, part_name(part["part"], "json")), part)
        del self._done[video_id]

    def complete_record(self) -> dict | None:
        path = os.path.join(self.path, COMPLETE_FILE)
        if not os.path.exists(path):
            return None
        with open(path) as fh:
            return json.load(fh)

    def finish(self) -> dict:
        summary = self.complete_record()
        if summary is not None:
            return summary
        self._close_part()
        # Durable before the summary says so (parts were not synced one by one:
        # kill -9 leaves the page cache intact, and only a machine crash
        # could lose them, which a rerun redoes).
        for name in os.listdir(self.path):
            with open(os.path.join(self.path, name), "rb") as fh:
                os.fsync(fh.fileno())
        reader = TFRecordReader(self.path)
        try:
            records = reader.records()
            value_bytes = 0

            def headers():
                nonlocal value_bytes
                for header_bytes, head, _ in reader.iter_clips():
                    value_bytes += head.value_len
                    yield header_bytes

            sha = headers_checksum(headers())
            files = reader.files()
        finally:
            reader.close()
        summary = {"videos": len(records), "clips": sum(r.clips for r in records), "value_bytes": value_bytes,
                   "sha256": sha, "files": files}
        _write_json_atomic(os.path.join(self.path, COMPLETE_FILE), summary)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return summary

    def close(self) -> None:
        if self._open is not None:
            # An open part is never committed on close: only finish() and a
            # full part commit. Its videos are converted again on a rerun.
            self._open.fh.close()
            self._open = None


class TFRecordReader(ShardReader):
    """A finished (or committed-so-far) TFRecord shard: part files read through memory maps."""

    backend = "tfrecord"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        meta_path = os.path.join(path, META_FILE)
        if not os.path.exists(meta_path):
            raise ShardMissing(f"{path}: shard missing (no {META_FILE})")
        try:
            with open(meta_path) as fh:
                self._meta = json.load(fh)
            self._complete = None
            done = os.path.join(path, COMPLETE_FILE)
            if os.path.exists(done):
                with open(done) as fh:
                    self._complete = json.load(fh)
        except ValueError as exc:
            raise FormatError(f"{path}: shard metadata is not valid JSON: {exc}") from exc
        self._parts = _committed_parts(path)
        self._index: dict[int, np.ndarray] = {}
        by_id: dict[str, tuple[dict, int, int]] = {}
        for part in self._parts:
            first = 0
            for rec in part["videos"]:
                by_id[rec["video_id"]] = (rec, part["part"], first)  # a later part's record wins
                first += rec["clips"]
            if first != part["records"]:
                raise FormatError(f"{os.path.join(path, part_name(part['part'], 'json'))}: its videos have {first} "
                                  f"clips, it says {part['records']} records")
            if part["records"]:
                self._index[part["part"]] = self._load_index(part)
        self._records = sort_records([VideoRecord.from_dict(rec, path) for rec, _, _ in by_id.values()])
        self._where = {vid: (p, first) for vid, (_, p, first) in by_id.items()}
        self._maps: dict[int, mmap.mmap] = {}
        self._lock = threading.Lock()

    def _load_index(self, part: dict) -> np.ndarray:
        """The part's index as (records, 2) int64, checked against its record file before it is trusted."""
        n = part["part"]
        data, idx = os.path.join(self.path, part_name(n, "tfrecord")), os.path.join(self.path, part_name(n, "idx"))
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
        # Exact: a video's clips are consecutive records of the part that holds its record.
        clips = {r.video_id: r.clips for r in self._records}
        return [vid for vid in sorted(self._where, key=self._where.__getitem__) if clips.get(vid)]

    def files(self) -> list[dict]:
        """The record files and their index files (paths relative to the shard folder)."""
        return [{"path": part_name(p["part"], "tfrecord"), "index": part_name(p["part"], "idx"),
                 "records": p["records"], "bytes": p["bytes"]} for p in self._parts if p["records"]]

    def _map(self, part: int) -> mmap.mmap:
        mm = self._maps.get(part)
        if mm is None:
            with self._lock:
                mm = self._maps.get(part)
                if mm is None:
                    with open(os.path.join(self.path, part_name(part, "tfrecord")), "rb") as fh:
                        mm = self._maps[part] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        return mm

    def _record(self, part: int, k: int) -> memoryview:
        off, length = self._index[part][k]
        view = memoryview(self._map(part))[off:off + length]
        if length < 16:
            raise FormatError(f"record {k} of {part_name(part, 'tfrecord')} is {length} bytes, shorter than framing")
        (n,) = _U64.unpack_from(view, 0)
        if 16 + n != length:
            raise FormatError(f"record {k} of {part_name(part, 'tfrecord')} says {n} bytes of data, its index "
                              f"entry {length - 16}")
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
        head = unpack_header(header, value_len=len(header) + len(payload))  # type: ignore[arg-type]
        if (head.video_id, head.clip_index) != (video_id, clip_index):
            raise FormatError(f"{self.where(video_id, clip_index)}: header says {head.video_id!r} clip "
                              f"{head.clip_index}")
        return header, head, payload

    def visit(self, clips: Sequence[tuple[str, int]], fn: Visitor) -> None:
        for pos, (vid, c) in enumerate(clips):
            try:
                _, head, payload = self._clip(vid, c)
                fn(pos, head, payload)
            except FormatError as exc:
                raise FormatError(f"{self.where(vid, c)}: {exc}") from exc

    def iter_clips(self) -> Iterator[tuple[memoryview, ClipHeader, memoryview]]:
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
            name = os.path.join(self.path, part_name(n, "tfrecord"))
            buf = memoryview(self._map(n))
            pos = k = 0
            index = self._index[n]
            while pos < len(buf):
                if len(buf) - pos < 16:
                    problems.append(f"{name}: {len(buf) - pos} trailing bytes after record {k}")
                    break
                length = bytes(buf[pos:pos + 8])
                (size,) = _U64.unpack(length)
                if _U32.unpack_from(buf, pos + 8)[0] != masked_crc(length):
                    problems.append(f"{name}: record {k} at byte {pos}: length CRC mismatch")
                    break
                data = buf[pos + 12:pos + 12 + size]
                if pos + 16 + size > len(buf) or _U32.unpack_from(buf, pos + 12 + size)[0] != masked_crc(data):
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
        head = unpack_header(features["header"][1])
        want = {"shape": list(head.shape), "label": [head.label], "clip_index": [head.clip_index],
                "start_frame": [head.start_frame]}
        for key, value in want.items():
            if features.get(key, (None, None))[1] != value:
                raise FormatError(f"feature {key} {features.get(key, (None, None))[1]} disagrees with the header's "
                                  f"{value}")
        if bytes(features["video_id"][1]).decode("utf-8", errors="replace") != head.video_id:
            raise FormatError("feature video_id disagrees with the header")

    def where(self, video_id: str, clip_index: int) -> str:
        where = self._where.get(video_id)
        name = part_name(where[0], "tfrecord") if where else "no part"
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
