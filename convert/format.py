"""The on-disk format: keys, the clip value header, and the names of files in OUT.

FORMAT.md is the prose version of this module; the two must agree. Everything a
reader needs to decode a shard without this package is defined here.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass

FORMAT_NAME = "videoclips"
FORMAT_VERSION = 1

MANIFEST = "manifest.json"
PLAN = "plan.json"
REPORT = "report.jsonl"
SHARD_DIR = "shards"
LOG_DIR = "logs"
PROGRESS_DIR = ".progress"

# Clip keys sort by video id, then clip index, so a cursor walks a video's clips
# in order. Meta keys live under a prefix that can never collide with a clip key.
CLIP_PREFIX = b"c/"
DONE_PREFIX = b"m/done/"
SHARD_KEY = b"m/shard"
COMPLETE_KEY = b"m/complete"

MAGIC = b"VCLP"
# magic, version, codec id, channels, reserved, T, H, W, video id length,
# label, clip index, start frame, payload crc32, payload length
_HEADER = struct.Struct("<4sBBBBHHHHiIIII")
HEADER_SIZE = _HEADER.size  # 36 bytes, then the video id, then the payload
VIDEO_ID_LEN_OFFSET = 14


class FormatError(ValueError):
    """A stored value or file that does not follow FORMAT.md."""


def read_manifest(root: str) -> dict:
    """The manifest of a finished conversion; FormatError names what is wrong."""
    path = os.path.join(root, MANIFEST)
    if not os.path.exists(path):
        raise FormatError(f"{root}: no {MANIFEST}; not a finished conversion (run python -m convert first)")
    try:
        with open(path) as fh:
            manifest = json.load(fh)
    except ValueError as exc:
        raise FormatError(f"{path}: not valid JSON: {exc}") from exc
    if manifest.get("format") != FORMAT_NAME:
        raise FormatError(f"{path}: format {manifest.get('format')!r} is not {FORMAT_NAME!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise FormatError(f"{path}: format version {manifest.get('format_version')} is not {FORMAT_VERSION}")
    return manifest


def clip_key(video_id: str, clip_index: int) -> bytes:
    """Key of clip ``clip_index`` of ``video_id``: ``c/<video_id>/<index:06d>``."""
    return CLIP_PREFIX + video_id.encode("utf-8") + b"/%06d" % clip_index


def done_key(video_id: str) -> bytes:
    """Key of the per-video record committed with the video's clips."""
    return DONE_PREFIX + video_id.encode("utf-8")


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


@dataclass(frozen=True)
class ClipHeader:
    """The fixed fields that precede every clip payload."""

    codec_id: int
    shape: tuple[int, int, int, int]  # (T, H, W, C)
    label: int
    clip_index: int
    start_frame: int
    video_id: str
    crc32: int
    payload_len: int
    offset: int  # where the payload starts inside the value


def pack_value(
    *,
    codec_id: int,
    shape: tuple[int, int, int, int],
    label: int,
    clip_index: int,
    start_frame: int,
    video_id: str,
    payload: bytes | memoryview,
) -> bytes:
    """Build one clip value: header, UTF-8 video id, encoded payload."""
    t, h, w, c = shape
    vid = video_id.encode("utf-8")
    header = _HEADER.pack(
        MAGIC, FORMAT_VERSION, codec_id, c, 0, t, h, w, len(vid),
        label, clip_index, start_frame, zlib.crc32(payload), len(payload),
    )
    return b"".join((header, vid, payload))


def unpack_header(value: bytes | memoryview) -> ClipHeader:
    """Parse a clip value's header; raises FormatError on anything malformed."""
    if len(value) < HEADER_SIZE:
        raise FormatError(f"value of {len(value)} bytes is shorter than the {HEADER_SIZE}-byte header")
    (magic, version, codec_id, c, _reserved, t, h, w, vid_len,
     label, clip_index, start_frame, crc, payload_len) = _HEADER.unpack_from(value, 0)
    if magic != MAGIC:
        raise FormatError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise FormatError(f"format version {version} is not supported (this reader knows {FORMAT_VERSION})")
    offset = HEADER_SIZE + vid_len
    if len(value) != offset + payload_len:
        raise FormatError(f"value is {len(value)} bytes, header says {offset + payload_len}")
    video_id = bytes(value[HEADER_SIZE:offset]).decode("utf-8")
    return ClipHeader(codec_id, (t, h, w, c), label, clip_index, start_frame, video_id, crc, payload_len, offset)


def check_crc(value: bytes | memoryview, header: ClipHeader) -> None:
    """Raise FormatError when the payload's CRC-32 differs from the header's."""
    got = zlib.crc32(memoryview(value)[header.offset:])
    if got != header.crc32:
        raise FormatError(
            f"payload crc32 {got:08x} != stored {header.crc32:08x} "
            f"(video {header.video_id!r} clip {header.clip_index})"
        )
