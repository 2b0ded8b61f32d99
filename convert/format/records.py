"""Video records: what a shard remembers of each video, committed with the video's clips (FORMAT.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import FormatError

STATUSES = ("ok", "padded", "partial", "short", "failed")
_DECODER = json.JSONDecoder()
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
        # Spelled out, not dataclasses.asdict (which deep-copies every field): a cache indexing a Kinetics-size
        # conversion writes one per video.
        d: dict[str, Any] = {"video_id": self.video_id, "path": self.path, "label": self.label, "status": self.status,
                             "clips": self.clips, "frames": self.frames, "reason": self.reason}
        if self.stream is not None:  # a record without it is stored as before, byte for byte
            d["stream"] = self.stream
        return d

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes | memoryview, where: str = "") -> VideoRecord:
        """Parse a stored record; FormatError (naming ``where``) when it is not one."""
        try:
            # The decoder itself, on text: a reader parses one record per video at open, and json.loads' own
            # steps (detecting the encoding of bytes, checking its arguments) cost as much as the parse.
            d = _DECODER.decode(bytes(raw).decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise FormatError(f"{where}: damaged video record: {exc}") from exc
        return cls.from_dict(d, where)

    @classmethod
    def many_from_bytes(cls, raws: Sequence[bytes], where: str = "") -> list[VideoRecord]:
        """``from_bytes`` of each of ``raws`` (a shard's stored records), parsed as one JSON array: one parse per shard
        instead of one per video, the largest cost of opening a Kinetics-size conversion. When that parse fails or
        does not give one object per record, each is parsed alone, so the error names the damaged one."""
        try:
            items = _DECODER.decode(b"".join((b"[", b",".join(raws), b"]")).decode("utf-8"))
        except (ValueError, RecursionError):
            items = None
        if not isinstance(items, list) or len(items) != len(raws):
            return [cls.from_bytes(raw, where) for raw in raws]
        return [cls.from_dict(d, where) for d in items]

    @classmethod
    def from_dict(cls, d: Any, where: str = "") -> VideoRecord:
        """Check and build a record from its JSON object; FormatError (naming ``where``) when it is not one."""
        if not isinstance(d, dict):
            raise FormatError(f"{where}: damaged video record: {type(d).__name__}, not an object")
        try:
            rec = cls(**d)
        except TypeError as exc:
            raise FormatError(f"{where}: damaged video record: {exc}") from exc
        # Spelled out rather than looped over: checked once per video at every open.
        if not (isinstance(rec.video_id, str) and isinstance(rec.path, str) and isinstance(rec.reason, str)
                and isinstance(rec.label, int) and isinstance(rec.clips, int) and isinstance(rec.frames, int)) or \
                isinstance(rec.label, bool) or isinstance(rec.clips, bool) or isinstance(rec.frames, bool) or \
                (rec.stream is not None and (not isinstance(rec.stream, int) or isinstance(rec.stream, bool))):
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
