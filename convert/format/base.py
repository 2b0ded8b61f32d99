"""What every backend shares: video records, the writer and reader interfaces, the shard checksum.

A backend is one module holding a ``ShardWriter`` and a ``ShardReader``
subclass; ``convert.format.BACKENDS`` maps the manifest's ``backend`` to
them. The job and every reader talk only to these interfaces.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Callable, ClassVar, Generator, Iterator, Sequence

import numpy as np

from .codecs import Codec, get_codec
from .layout import FORMAT_NAME, FORMAT_VERSION, ClipHeader, FormatError, pack_header

STATUSES = ("ok", "padded", "partial", "short", "failed")
# Manifest fields every shard also stores, so a manifest edited by hand (or
# paired with the wrong shards) is caught by comparing the two.
DATA_KEYS = ("backend", "codec", "codec_id", "classes", "clip_shape", "frame_size", "fps", "clip", "on_damage")
MAX_RECORD_BYTES = 1 << 20  # a video record is a few hundred bytes; more means a damaged length


@dataclass(frozen=True)
class VideoRecord:
    """What a shard remembers of one video: committed together with the video's clips."""

    video_id: str
    path: str
    label: int
    status: str  # ok | padded | partial | short | failed
    clips: int
    frames: int
    reason: str = ""

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes | memoryview, where: str = "") -> "VideoRecord":
        """Parse a stored record; FormatError (naming ``where``) when it is not one."""
        try:
            d = json.loads(bytes(raw))
        except ValueError as exc:
            raise FormatError(f"{where}: damaged video record: {exc}") from exc
        return cls.from_dict(d, where)

    @classmethod
    def from_dict(cls, d: dict, where: str = "") -> "VideoRecord":
        """Check and build a record from its JSON object; FormatError (naming ``where``) when it is not one."""
        try:
            rec = cls(**d)
        except TypeError as exc:
            raise FormatError(f"{where}: damaged video record: {exc}") from exc
        if rec.status not in STATUSES or rec.clips < 0:
            raise FormatError(f"{where}: video record {rec.video_id!r} has status {rec.status!r}, clips {rec.clips}")
        return rec


def sort_records(records: Sequence[VideoRecord]) -> list[VideoRecord]:
    """Reading order: by video id as UTF-8 bytes (what LMDB's key order gives)."""
    return sorted(records, key=lambda r: r.video_id.encode("utf-8"))


def shard_meta(data: dict, *, index: int, count: int) -> dict:
    """The metadata a shard stores: format, the data-defining manifest fields, its place among the shards."""
    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "index": index, "count": count,
            **{k: data[k] for k in DATA_KEYS}}


def check_shard_meta(meta: dict | None, manifest: dict, index: int, where: str) -> None:
    """A shard's stored metadata must agree with the manifest and sit at its manifest position."""
    if manifest.get("format_version", 1) < 2:
        return  # version 1 shards store only their codec
    if meta is None:
        raise FormatError(f"{where}: shard has no metadata (not written by this format version)")
    diffs = [k for k in DATA_KEYS if meta.get(k) != manifest.get(k)]
    if diffs:
        k = diffs[0]
        raise FormatError(f"{where}: shard says {k} {_short(meta.get(k))}, manifest says {_short(manifest.get(k))}"
                          f"{f' (also differ: {chr(44).join(diffs[1:])})' if diffs[1:] else ''}")
    if meta.get("index") != index:
        raise FormatError(f"{where}: shard is number {meta.get('index')} of its conversion, the manifest lists it "
                          f"as number {index} (shards reordered?)")
    if int(meta.get("count", 0)) > len(manifest.get("shards", ())):
        raise FormatError(f"{where}: shard belongs to a conversion of {meta.get('count')} shards, the manifest "
                          f"lists {len(manifest.get('shards', ()))} (shards dropped from the manifest?)")


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def headers_checksum(headers: Iterator[bytes | memoryview]) -> str:
    """Version 2 shard checksum: SHA-256 over every clip's header (36 + n bytes) in reading order.

    The header carries the clip's identity (video id, clip index), shape,
    label and its payload's CRC-32 and length, so a change to any payload
    byte is caught by its CRC and a lost, added, renamed or re-ordered clip
    by this checksum, without hashing the shard's bulk twice.
    """
    h = hashlib.sha256()
    for header in headers:
        h.update(header)
    return h.hexdigest()


ClipProducer = Generator[tuple[int, int, np.ndarray], None, VideoRecord]


class ShardDamaged(FormatError):
    """A shard that cannot be opened for writing: its files are damaged (truncated, overwritten)."""


class StoreError(OSError):
    """The store failed to write (I/O error, damaged store): a problem of the machine, never of the video."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()  # the message already says what; no "[Errno 28]" prefix


class StoreFullError(StoreError):
    """No room on the device for the next video."""


@dataclass(frozen=True)
class WriterOptions:
    """How a writer stores (never what): LMDB map size and compaction, TFRecord file size."""

    map_size: int | None = None  # lmdb: initial map size (grows on demand)
    compact: bool = False  # lmdb: rewrite finished shards without free pages
    part_bytes: int = 256 << 20  # tfrecord: start a new file once one reaches this size

    def __post_init__(self) -> None:
        if self.map_size is not None and self.map_size < 1:
            raise ValueError(f"map_size must be >= 1 byte, got {self.map_size}")
        if self.part_bytes < 1:
            raise ValueError(f"part_bytes must be >= 1 byte, got {self.part_bytes}")


class ShardWriter:
    """One shard, written by one process. A backend subclasses it and stores the bytes."""

    backend: ClassVar[str] = ""

    def __init__(self, *, path: str, codec: str, meta: dict, options: WriterOptions = WriterOptions()) -> None:
        self.path = path
        self.codec: Codec = get_codec(codec)
        if meta.get("codec_id") != self.codec.id:
            raise ValueError(f"{path}: shard metadata says codec id {meta.get('codec_id')}, codec {codec!r} "
                             f"writes {self.codec.id}")
        self.meta = meta
        self.options = options

    def encode(self, video_id: str, label: int, clip_index: int, start_frame: int,
               frames: np.ndarray) -> tuple[bytes, bytes | memoryview]:
        """Header (with the video id) and payload of one clip."""
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
            raise ValueError(f"clip must be uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
        payload = self.codec.encode(frames)
        header = pack_header(codec_id=self.codec.id, shape=tuple(frames.shape), label=label,
                             clip_index=clip_index, start_frame=start_frame, video_id=video_id, payload=payload)
        return header, payload

    def drain(self, video_id: str, label: int, gen: ClipProducer,
              put: Callable[[int, bytes, bytes | memoryview], None]) -> VideoRecord:
        """Encode every clip ``gen`` yields and ``put(clip_index, header, payload)`` it; returns its record."""
        while True:
            try:
                clip_index, start, frames = next(gen)
            except StopIteration as stop:
                if stop.value.video_id != video_id:
                    raise ValueError(f"the clips of {video_id!r} came with a record of {stop.value.video_id!r}")
                return stop.value
            header, payload = self.encode(video_id, label, clip_index, start, frames)
            put(clip_index, header, payload)

    def check_meta(self, stored: dict) -> None:
        """A shard reopened for more writing must hold the same kind of data."""
        diffs = [k for k in (*DATA_KEYS, "index") if stored.get(k) != self.meta.get(k)]
        if diffs:
            raise ValueError(f"{self.path}: shard holds {diffs[0]} {_short(stored.get(diffs[0]))}, this job writes "
                             f"{_short(self.meta.get(diffs[0]))}; use another OUT")

    # -- the storage interface ----------------------------------------------
    def done_records(self) -> dict[str, VideoRecord]:
        """Every video committed so far, by id."""
        raise NotImplementedError

    def write_video(self, video_id: str, label: int, produce: Callable[[], ClipProducer],
                    estimate_bytes: int) -> VideoRecord:
        """Store a video's clips and its record atomically; returns the record stored.

        ``produce()`` starts a generator that yields ``(clip_index, start_frame,
        frames)`` and returns the video's ``VideoRecord``; a record with
        ``clips == 0`` means "keep none of what was yielded". The writer may call
        ``produce`` again (after growing its store), so it must be repeatable.
        """
        raise NotImplementedError

    def complete_record(self) -> dict | None:
        """The shard's summary once ``finish`` has run, else None."""
        raise NotImplementedError

    def finish(self) -> dict:
        """Mark the shard complete; returns its summary (videos, clips, value_bytes, sha256)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


Visitor = Callable[[int, ClipHeader, memoryview], None]


class ShardReader:
    """Read side of one finished shard. A backend subclasses it.

    Clips are addressed by identity, (video id, clip index); reading order is
    the records' order (``sort_records``), then clip index.
    """

    backend: ClassVar[str] = ""

    def __init__(self, path: str) -> None:
        self.path = path

    @property
    def meta(self) -> dict | None:
        """The shard's stored metadata (``shard_meta``); None for version 1 shards."""
        raise NotImplementedError

    def records(self) -> list[VideoRecord]:
        """Every video record of the shard (clips or not), in reading order."""
        raise NotImplementedError

    def complete(self) -> dict | None:
        """The summary written when the shard was finished, or None."""
        raise NotImplementedError

    def visit(self, clips: Sequence[tuple[str, int]], fn: Visitor) -> None:
        """Call ``fn(position, header, payload)`` for each (video id, clip index).

        ``payload`` may be a view into a memory map, valid only during the
        call. The header's stored length has been checked against the value
        before the payload is touched. A FormatError from ``fn`` comes back
        naming the shard and the clip.
        """
        raise NotImplementedError

    def iter_clips(self) -> Iterator[tuple[memoryview, ClipHeader, memoryview]]:
        """(header bytes, header, payload) of every clip in reading order (views valid until the next item)."""
        raise NotImplementedError

    def storage_order(self) -> list[str] | None:
        """Ids of the shard's videos with clips, in the order their clips lie in its files; None where the
        backend does not record where values lie (LMDB), so that a reader must take a hint instead."""
        return None

    def checksum(self, version: int) -> str:
        """The shard checksum as the manifest of ``version`` defines it (lowercase hex)."""
        if version < 2:
            raise FormatError(f"{self.path}: {self.backend} shards have no version {version} checksum")
        return headers_checksum(h for h, _, _ in self.iter_clips())

    def check_storage(self) -> list[str]:
        """Problems of the storage itself (file sizes, record framing, index files), one line each."""
        return []

    def close(self) -> None:
        """Let go of this reader's files (handles shared per process may stay open)."""

    def where(self, video_id: str, clip_index: int) -> str:
        """How errors name one clip: the shard and the clip's identity."""
        return f"{self.path}: {video_id} clip {clip_index}"
