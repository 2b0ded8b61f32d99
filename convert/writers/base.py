"""What every shard writer does the same way: encode clips, keep counts, checksum.

A backend subclasses ``ShardWriter`` and implements the storage calls. The job
talks only to this interface, so a new backend is one class and one line in
``WRITERS``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Callable, Generator, Iterable

import numpy as np

from ..codecs import get_codec
from ..format import HEADER_SIZE, VIDEO_ID_LEN_OFFSET, clip_key, pack_value


@dataclass(frozen=True)
class DoneRecord:
    """Committed with a video's clips: the shard's memory of what it finished."""

    video_id: str
    path: str
    label: int
    status: str  # ok | padded | partial | short | failed
    clips: int
    frames: int
    reason: str = ""

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "DoneRecord":
        return cls(**json.loads(raw))


def checksum_update(h: "hashlib._Hash", key: bytes, value: bytes | memoryview) -> None:
    """Fold one clip entry into a shard checksum (layout in FORMAT.md).

    Only the value's header is hashed: it carries the payload's CRC-32 and
    length, so the checksum still changes with any payload byte, and computing
    it reads a page per clip instead of the whole shard again.
    """
    header_len = HEADER_SIZE + struct.unpack_from("<H", value, VIDEO_ID_LEN_OFFSET)[0]
    h.update(struct.pack("<I", len(key)))
    h.update(key)
    h.update(struct.pack("<Q", len(value)))
    h.update(value[:header_len])


def checksum_entries(entries: Iterable[tuple[bytes, bytes | memoryview]]) -> str:
    h = hashlib.sha256()
    for key, value in entries:
        checksum_update(h, key, value)
    return h.hexdigest()


ClipProducer = Generator[tuple[int, int, np.ndarray], None, DoneRecord]


class ShardWriter:
    """One shard, written by one process. Subclasses store the bytes."""

    def __init__(self, *, path: str, codec: str, map_size: int | None = None) -> None:
        self.path = path
        self.codec_name = codec
        self.codec = get_codec(codec)
        self.map_size = map_size

    def encode(self, item_id: str, label: int, clip_index: int, start_frame: int,
               frames: np.ndarray) -> tuple[bytes, bytes]:
        """Key and value of one clip."""
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
            raise ValueError(f"clip must be uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
        payload = self.codec.encode(frames)
        value = pack_value(codec_id=self.codec.id, shape=tuple(frames.shape), label=label,
                           clip_index=clip_index, start_frame=start_frame, video_id=item_id,
                           payload=payload)
        return clip_key(item_id, clip_index), value

    # -- the storage interface ----------------------------------------------
    def done_records(self) -> dict[str, DoneRecord]:
        raise NotImplementedError

    def write_video(self, video_id: str, label: int, produce: Callable[[], ClipProducer],
                    estimate_bytes: int) -> DoneRecord:
        """Store a video's clips and its record atomically; returns the record stored.

        ``produce()`` starts a generator that yields ``(clip_index, start_frame,
        frames)`` and returns the video's ``DoneRecord``; a record with
        ``clips == 0`` means "keep none of what was yielded". The writer may call
        ``produce`` again (after growing its store), so it must be repeatable.
        """
        raise NotImplementedError

    def complete_record(self) -> dict | None:
        raise NotImplementedError

    def finish(self, *, compact: bool = False) -> dict:
        """Mark the shard complete and return its summary (counts, bytes, checksum)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    @staticmethod
    def read_done(path: str) -> list[DoneRecord]:
        """The done records of a finished shard, without opening it for writing."""
        raise NotImplementedError

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
