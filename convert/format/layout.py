"""The folder layout, metadata files and the clip header: what every backend shares.

FORMAT.md is the prose version of this package; the two must agree. Nothing
here imports PyAV or torch: a training node reads shards with numpy, lmdb and
the standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

from .errors import FormatError, storing

FORMAT_NAME = "videoclips"
FORMAT_VERSION = 2  # of clip headers, shard metadata and plan.json
READABLE_VERSIONS = (2,)
# The manifest's: version 3 lists each shard's files with their sizes and checksums; a version 2 manifest (without
# them) is still read.
MANIFEST_VERSION = 3
READABLE_MANIFEST_VERSIONS = (2, 3)
# Conversions written in an older version of the format, which this one refuses with a line saying to reconvert.
RETIRED_VERSIONS = (1,)


def version_problem(version: object, what: str, readable: tuple[int, ...] = READABLE_VERSIONS) -> str:
    """Why ``what`` (a manifest's or a value's) format ``version`` cannot be read (``readable``: those that can), in
    one line."""
    shown = repr(version) if not isinstance(version, int) or isinstance(version, bool) else str(version)
    if version in RETIRED_VERSIONS and not isinstance(version, bool):
        return (f"{what} {shown} was written by an earlier release of this project; reconvert the videos with "
                f"this one (python -m convert)")
    return f"{what} {shown[:40]} is not one this reader knows ({', '.join(map(str, readable))})"

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
    # code, many times faster than zlib's: it is computed for every clip
    # written and read (docs/benchmarks.md).
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
# With a short side (``frame_size.short_side`` S) a frame's longer side is at most MAX_ASPECT * S: a conversion
# refuses a video of a wider aspect, and a reader refuses a clip header outside it before decoding the payload, so
# the memory one clip costs a reader is bounded by the manifest, never by a header's word (FORMAT.md, *Clip values*).
MAX_ASPECT = 4


# Metadata files (manifest, plan, shard metadata and commits) are small; a larger
# one, or one that is no regular file (a FIFO, a device), is refused unread.
MAX_JSON_BYTES = 64 << 20
# Except plan.json, which lists every video with its path, so that Kinetics-700's is larger than the limit above;
# this one leaves room for paths several times longer. Readers never parse it when the manifest records it (its
# ``plan``); readers and ``verify`` of an older conversion, and the cache's copy of one, read it up to this.
MAX_PLAN_BYTES = 1 << 30


def too_long(where: str, what: str, limit: int) -> FormatError:
    """The one error of a metadata file longer than ``limit`` bytes, the same from a folder and from a URL (where
    only the first ``limit + 1`` bytes are read, so its size is not known)."""
    return FormatError(f"{where}: the {what} is more than the {limit} bytes a {what} may have")


def read_json_file(path: str, what: str, *, limit: int = MAX_JSON_BYTES) -> Any:
    """The parsed JSON of a metadata file; FormatError naming ``path`` when it is no regular file of at most
    ``limit`` bytes or no valid JSON.

    Opened without blocking and checked with ``fstat`` before a byte is read:
    a FIFO named like a manifest must not hang a reader, nor ``/dev/zero``
    exhaust its memory, nor a deeply nested array its stack.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FormatError(f"{path}: {what} missing") from None
    except OSError as exc:
        raise FormatError(f"{path}: cannot open the {what}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"{path}: the {what} is not a regular file")
        if st.st_size > limit:
            raise too_long(path, what, limit)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise FormatError(f"{path}: reading the {what} failed: {exc.strerror}") from None
    finally:
        os.close(fd)
    return parse_json(raw, path, what, limit=limit)


def parse_json(raw: bytes, where: str, what: str, *, limit: int = MAX_JSON_BYTES) -> Any:
    """The parsed JSON of metadata file ``raw`` read from ``where`` (a path or a URL), read as at most ``limit + 1``
    bytes; FormatError naming ``where`` when it is longer than ``limit`` or no valid JSON (a deeply nested array
    included: a RecursionError is caught, never a traceback)."""
    if len(raw) > limit:
        raise too_long(where, what, limit)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise FormatError(f"{where}: the {what} is not valid JSON: {type(exc).__name__}: {exc}") from None


def write_json_atomic(path: str, obj: Any, *, sync: bool = True, **dump: Any) -> None:
    """Write ``obj`` as JSON (``json.dump`` keywords in ``dump``) to ``path`` atomically: a temporary file
    named for this process, synced (unless ``sync=False``), then renamed over ``path``.

    A failure of the machine is a ``StoreError`` naming the file.
    """
    tmp = f"{path}.tmp.{os.getpid()}"
    with storing("writing", tmp):
        with open(tmp, "w") as fh:
            json.dump(obj, fh, **dump)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)


def hexdigest_of(f: BinaryIO, h: Any) -> str:
    """The hex digest of everything left to read in binary file ``f``, fed to hashlib object ``h`` a block at a
    time (a shard's file, a local file or a remote object: never read whole into memory)."""
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
    digest: str = h.hexdigest()
    return digest


def file_sha256(path: str) -> str:
    """SHA-256 of file ``path``'s bytes, as 64 lowercase hex digits."""
    with open(path, "rb") as f:
        return hexdigest_of(f, hashlib.sha256())


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


# A name that becomes part of a local path (a shard's name, each segment of its path, each file of a shard):
# at most this many UTF-8 bytes, so that the cache's own names built from it (".tmp-<name>-<pid>-<thread>.json")
# stay under the 255 bytes file systems allow.
MAX_NAME_BYTES = 160


def plain_name(value: object, what: str, where: str) -> str:
    """``value`` when it is a plain file name: FormatError naming ``where`` and ``what`` otherwise.

    Plain: a non-empty string of at most MAX_NAME_BYTES UTF-8 bytes, with no
    ``/``, ``\\``, NUL or other control character, not starting with ``.``
    (so never ``.`` or ``..``, and never a hidden name: readers and the
    cache keep their own files under such names). A manifest read from a
    bucket is written by strangers: every name in it that ends up in a
    local path passes here first, so none can choose a path outside its
    folder.
    """
    if not isinstance(value, str) or not value:
        raise FormatError(f"{where}: {what} {_quoted(value)} is not a file name")
    bad = next((c for c in value if c in "/\\" or ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise FormatError(f"{where}: {what} {_quoted(value)} holds {bad!r}; a file name may not")
    if value.startswith("."):
        raise FormatError(f"{where}: {what} {_quoted(value)} starts with '.'; a file name here may not")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise FormatError(f"{where}: {what} {_quoted(value)} is not valid UTF-8") from None
    if size > MAX_NAME_BYTES:
        raise FormatError(f"{where}: {what} {_quoted(value)} is {size} bytes long, more than {MAX_NAME_BYTES}")
    return value


def relative_path(value: object, what: str, where: str) -> str:
    """``value`` when it is a relative path of plain names (``plain_name``) joined by ``/``; FormatError otherwise.

    So never absolute, never with ``..``, ``.`` or an empty segment (``//``),
    never with a backslash: it names a place inside its folder on every system.
    """
    if not isinstance(value, str) or not value:
        raise FormatError(f"{where}: {what} {_quoted(value)} is not a relative path")
    for part in value.split("/"):
        if not part:
            raise FormatError(f"{where}: {what} {_quoted(value)} is absolute or has an empty segment")
        plain_name(part, f"{what} {_quoted(value)}: segment", where)
    return value


def inside(folder: str, rel: str, where: str) -> str:
    """``folder``/``rel``, checked to lie inside ``folder`` once links are resolved; FormatError naming ``where``.

    The last line of defence under ``relative_path``: a local path built from
    anything a stranger wrote is resolved and compared before it is written.
    """
    path = os.path.join(folder, rel)
    base = os.path.realpath(folder)
    if os.path.commonpath([base, os.path.realpath(path)]) != base or os.path.realpath(path) == base:
        raise FormatError(f"{where}: {_quoted(rel)} would lie outside {folder}")
    return path


def _quoted(value: object) -> str:
    """``value`` in a one-line message: a string escaped and cut to 60 characters, anything else by its type."""
    if not isinstance(value, str):
        return f"of type {type(value).__name__}"
    text = ascii(value) if len(value) <= 60 else ascii(value[:57] + "...")
    return text


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
    vid_len: int = struct.unpack_from("<H", value, VIDEO_ID_LEN_OFFSET)[0]
    return HEADER_SIZE + vid_len


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
        raise FormatError(version_problem(version, "clip format version"))
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
