"""Video records: what a shard remembers of each video, committed with the video's clips (FORMAT.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .errors import FormatError

STATUSES = ("ok", "padded", "partial", "short", "failed")
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
    # The index of the container's stream the clips were decoded from; None when the video was never opened
    # (and in records written before it was kept), and then left out of the stored object.
    stream: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.stream is None:
            del d["stream"]  # a record without it is stored as before, byte for byte
        return d

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes | memoryview, where: str = "") -> VideoRecord:
        """Parse a stored record; FormatError (naming ``where``) when it is not one."""
        try:
            d = json.loads(bytes(raw))
        except (ValueError, RecursionError) as exc:
            raise FormatError(f"{where}: damaged video record: {exc}") from exc
        return cls.from_dict(d, where)

    @classmethod
    def from_dict(cls, d: Any, where: str = "") -> VideoRecord:
        """Check and build a record from its JSON object; FormatError (naming ``where``) when it is not one."""
        if not isinstance(d, dict):
            raise FormatError(f"{where}: damaged video record: {type(d).__name__}, not an object")
        try:
            rec = cls(**d)
        except TypeError as exc:
            raise FormatError(f"{where}: damaged video record: {exc}") from exc
        ints = (rec.label, rec.clips, rec.frames, *(() if rec.stream is None else (rec.stream,)))
        if not (isinstance(rec.video_id, str) and isinstance(rec.path, str) and isinstance(rec.reason, str)) or \
                not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
            raise FormatError(f"{where}: damaged video record {rec.video_id!r}: a field has the wrong type")
        if rec.stream is not None and rec.stream < 0:
            raise FormatError(f"{where}: video record {rec.video_id!r} has stream {rec.stream}, not an index")
        if rec.status not in STATUSES or rec.clips < 0:
            raise FormatError(f"{where}: video record {rec.video_id!r} has status {rec.status!r}, clips {rec.clips}")
        return rec


def sort_records(records: Sequence[VideoRecord]) -> list[VideoRecord]:
    """Reading order: by video id as UTF-8 bytes (what LMDB's key order gives)."""
    return sorted(records, key=lambda r: r.video_id.encode("utf-8"))


__all__ = ["MAX_RECORD_BYTES", "STATUSES", "VideoRecord", "sort_records"]
