"""The folder layout, the manifest and the clip header: what every backend shares.

FORMAT.md is the prose version of this package; the two must agree. Nothing
here imports PyAV or torch: a training node reads shards with numpy, lmdb and
the standard library only.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

FORMAT_NAME = "videoclips"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)

MANIFEST = "manifest.json"
PLAN = "plan.json"
REPORT = "report.jsonl"
SHARD_DIR = "shards"
LOG_DIR = "logs"
PROGRESS_DIR = ".progress"
LOCK = ".lock"  # held (flock) by the job converting into OUT, and naming it
DAMAGED_DIR = "damaged"  # unfinished shards that could not be opened, moved aside and converted again

try:
    # The same CRC-32 as zlib's (ISO-HDLC polynomial), in zlib-ng's vectorised
    # code: about 50 GB/s against zlib 1.2's 2.5-4 GB/s here, where it cost
    # 0.25-0.4 ms of every 1 MB raw clip written (and verified).
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - zlib-ng is a dependency; zlib gives the same values
    from zlib import crc32

MAGIC = b"VCLP"
# magic, version, codec id, channels, reserved, T, H, W, video id length,
# label, clip index, start frame, payload crc32, payload length
_HEADER = struct.Struct("<4sBBBBHHHHiIIII")
HEADER_SIZE = _HEADER.size  # 36 bytes, then the video id, then the payload
VIDEO_ID_LEN_OFFSET = 14
MAX_CLIP_INDEX = 0xFFFFFFFF  # the header's uint32


class FormatError(ValueError):
    """A stored value or file that does not follow FORMAT.md."""


class ShardMissing(FormatError):
    """A shard the manifest lists is not on disk (deleted, or OUT copied in part)."""


def read_manifest(root: str) -> dict:
    """The manifest of a finished conversion; FormatError names what is wrong."""
    if not os.path.isdir(root):
        raise FormatError(f"{root}: no such folder")
    path = os.path.join(root, MANIFEST)
    if not os.path.exists(path):
        raise FormatError(f"{root}: no {MANIFEST}; not a finished conversion (run python -m convert first)")
    try:
        with open(path) as fh:
            manifest = json.load(fh)
    except ValueError as exc:
        raise FormatError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise FormatError(f"{path}: format {got!r} is not {FORMAT_NAME!r}")
    if manifest.get("format_version") not in READABLE_VERSIONS:
        raise FormatError(f"{path}: format version {manifest.get('format_version')} is not one this reader knows "
                          f"({', '.join(map(str, READABLE_VERSIONS))})")
    manifest.setdefault("backend", "lmdb")  # version 1 had one backend
    classes = manifest.get("classes")
    if not isinstance(classes, list) or manifest.get("num_classes") != len(classes):
        raise FormatError(f"{path}: num_classes {manifest.get('num_classes')} but "
                          f"{len(classes) if isinstance(classes, list) else 'no'} class names")
    return manifest


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


@dataclass(frozen=True)
class ClipHeader:
    """The fixed fields that precede every clip payload."""

    version: int
    codec_id: int
    shape: tuple[int, int, int, int]  # (T, H, W, C)
    label: int
    clip_index: int
    start_frame: int
    video_id: str
    crc32: int
    payload_len: int
    offset: int  # header length: 36 + video id bytes; where the payload starts in a whole value

    @property
    def value_len(self) -> int:
        """Length of the whole value: header, video id and payload."""
        return self.offset + self.payload_len


def pack_header(*, codec_id: int, shape: tuple[int, int, int, int], label: int, clip_index: int,
                start_frame: int, video_id: str, payload: bytes | memoryview) -> bytes:
    """Header and UTF-8 video id of one clip (the payload follows them in a value)."""
    t, h, w, c = shape
    vid = video_id.encode("utf-8")
    if not 0 <= clip_index <= MAX_CLIP_INDEX:
        raise ValueError(f"clip index {clip_index} does not fit the header's uint32")
    return _HEADER.pack(MAGIC, FORMAT_VERSION, codec_id, c, 0, t, h, w, len(vid), label, clip_index,
                        start_frame, crc32(payload), len(payload)) + vid


def header_len(value: bytes | memoryview) -> int:
    """36 + the video id's length, read from a value's first bytes (no other checks)."""
    if len(value) < HEADER_SIZE:
        raise FormatError(f"value of {len(value)} bytes is shorter than the {HEADER_SIZE}-byte header")
    return HEADER_SIZE + struct.unpack_from("<H", value, VIDEO_ID_LEN_OFFSET)[0]


def unpack_header(header: bytes | memoryview, *, value_len: int | None = None) -> ClipHeader:
    """Parse a clip header (the first 36 + n bytes of a value, or more).

    ``value_len``: the stored value's length when the header is the start of
    one value; it must equal header + id + payload. Checked before anything
    past the header is touched, so a length damaged on disk is an error, not
    a read past the end of the file.
    """
    if len(header) < HEADER_SIZE:
        raise FormatError(f"value of {len(header)} bytes is shorter than the {HEADER_SIZE}-byte header")
    (magic, version, codec_id, c, _reserved, t, h, w, vid_len,
     label, clip_index, start_frame, crc, payload_len) = _HEADER.unpack_from(header, 0)
    if magic != MAGIC:
        raise FormatError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version not in READABLE_VERSIONS:
        raise FormatError(f"clip format version {version} is not supported (this reader knows "
                          f"{', '.join(map(str, READABLE_VERSIONS))})")
    offset = HEADER_SIZE + vid_len
    if len(header) < offset:
        raise FormatError(f"header of {len(header)} bytes is shorter than its {offset}-byte header and id")
    if value_len is not None and value_len != offset + payload_len:
        raise FormatError(f"value is {value_len} bytes, header says {offset + payload_len}")
    try:
        video_id = bytes(header[HEADER_SIZE:offset]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"video id is not UTF-8: {exc}") from exc
    return ClipHeader(version, codec_id, (t, h, w, c), label, clip_index, start_frame, video_id, crc,
                      payload_len, offset)


def check_crc(payload: bytes | memoryview, header: ClipHeader) -> None:
    """Raise FormatError when the payload's CRC-32 differs from the header's.

    The message does not say where: every caller prefixes its reader's
    ``where`` (shard and clip), which would otherwise name the clip twice.
    """
    got = crc32(payload)
    if got != header.crc32:
        raise FormatError(f"payload crc32 {got:08x} != stored {header.crc32:08x}")


def check_plan(root: str, manifest: dict) -> None:
    """The manifest must list every shard the plan made, in the plan's order (when plan.json is there)."""
    path = os.path.join(root, PLAN)
    if not os.path.exists(path):
        return
    try:
        with open(path) as fh:
            planned = [s["name"] for s in json.load(fh)["shards"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise FormatError(f"{path}: not a readable plan: {exc}") from exc
    listed = [s["name"] for s in manifest["shards"]]
    if listed != planned:
        missing = [n for n in planned if n not in listed]
        what = f"lacks {', '.join(missing[:3])}" if missing else "lists them in another order"
        raise FormatError(f"{os.path.join(root, MANIFEST)}: the plan has {len(planned)} shards, the manifest {what}")
