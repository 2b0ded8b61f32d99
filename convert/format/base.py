"""The backend contract: what a storage backend provides, and what every backend shares.

A backend is one subpackage of ``convert.format`` holding a ``ShardWriter``
and a ``ShardReader`` subclass and a frozen dataclass of its writing options;
one ``Backend`` line in ``convert.format.BACKENDS`` names them, and one
section of FORMAT.md describes its files. The conversion job, the shard
worker, the plain reader and ``verify`` talk only to these interfaces: every
method they call is declared here, abstract where a backend must say how.

Options are how a backend stores (never what): each field of its options
dataclass is declared with ``convert.format.options.option`` (its flag,
help, default and range), from which the command line takes the option, so a
backend's options are declared once, in the backend.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .codecs import Codec, get_codec
from .errors import FormatError
from .layout import HEADER_SIZE, ClipHeader, file_sha256, hexdigest_of, pack_header, plain_name
from .manifest import CONTENT_BITS, CONTENT_KEY, DATA_KEYS, ShardEntry, ShardFile
from .payload import ClipEncoder
from .records import VideoRecord

# The summary fields every backend's ``finish`` returns and the manifest lists per shard.
SUMMARY_KEYS = ("videos", "clips", "value_bytes", "sha256")


class ContentSum:
    """A shard's share of its conversion's content fingerprint (FORMAT.md, *Content fingerprint*).

    Per video, SHA-256 over its clips' values (header bytes, then payload)
    in clip order: every byte stored of its clips. That digest is widened
    with SHAKE256 to ``CONTENT_BITS`` and the share is the sum of
    the widened digests modulo 2**``CONTENT_BITS``: a sum, so that the
    fingerprint of a conversion is the same however its videos were dealt
    over shards and processes; this wide, so that no choice of many forged
    videos steers it (a narrow sum of hashes falls to the generalized
    birthday attack). Feed it the clips of a shard in reading order (a
    video's clips are consecutive there).
    """

    def __init__(self) -> None:
        self.total = 0
        self._video: bytes | None = None
        self._hash: Any = None

    def add(self, header: bytes | memoryview, payload: bytes | memoryview) -> None:
        """One clip: its header bytes (``HEADER_SIZE`` + its id's length) and its payload as stored."""
        video = bytes(header[HEADER_SIZE:])
        if video != self._video:
            self._close()
            # SHA-256 over the bulk: the hash with an instruction of its own in current CPUs (x86 SHA-NI, ARMv8
            # SHA2), where BLAKE2b runs in software.
            self._video, self._hash = video, hashlib.sha256()
        self._hash.update(header)
        self._hash.update(payload)

    def _close(self) -> None:
        if self._hash is not None:
            wide = hashlib.shake_256(self._hash.digest()).digest(CONTENT_BITS // 8)
            self.total = (self.total + int.from_bytes(wide, "big")) % (1 << CONTENT_BITS)
            self._hash = None

    def hexdigest(self) -> str:
        """The share as ``CONTENT_BITS`` / 4 lowercase hex digits."""
        self._close()
        return f"{self.total:0{CONTENT_BITS // 4}x}"


def summarize_clips(clips: Iterable[tuple[bytes | memoryview, bytes | memoryview]]) -> tuple[str, str]:
    """(the shard checksum; the shard's ``ContentSum``) in one pass over its clips' (header bytes, payload) in
    reading order.

    The shard checksum (FORMAT.md, *Shard checksum*) is SHA-256 over every
    clip's header (36 + n bytes) in reading order: the header carries the
    clip's identity (video id, clip index), shape, label and its payload's
    CRC-32 and length, so a lost, added, renamed or re-ordered clip is caught
    by it and a damaged payload byte by its CRC-32. What a payload holds,
    against someone who forges it keeping its CRC-32, is the content sum's,
    which reads every payload byte in the same pass.
    """
    h, content = hashlib.sha256(), ContentSum()
    for header, payload in clips:
        h.update(header)
        content.add(header, payload)
    return h.hexdigest(), content.hexdigest()


def read_back_summary(reader: ShardReader) -> dict:
    """The summary a writer's ``finish`` returns (``SUMMARY_KEYS``, ``CONTENT_KEY``; not its backend's extras) of
    the shard ``reader`` reads: counted, summed and checksummed as a reader sees it, in one pass."""
    value_bytes = 0

    def clips() -> Iterator[tuple[bytes | memoryview, memoryview]]:
        nonlocal value_bytes
        for header_bytes, head, payload in reader.iter_clips():
            value_bytes += head.value_len
            yield header_bytes, payload

    sha, content = summarize_clips(clips())  # first: it counts value_bytes as it reads
    records = reader.records()
    summary = dict(zip(SUMMARY_KEYS, (len(records), sum(r.clips for r in records), value_bytes, sha)))
    summary[CONTENT_KEY] = content
    return summary


def _short(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


ClipProducer = Generator[tuple[int, int, np.ndarray], None, VideoRecord]


class ShardWriter(ABC):
    """One shard, written by one process. A backend subclasses it and stores the bytes.

    Every write, sync, rename and close a backend makes raises ``StoreError``
    (``StoreFullError`` on a full device) when it fails: a problem of the
    machine, after which nothing of the video being written is committed.
    """

    backend: ClassVar[str] = ""

    def __init__(self, *, path: str, codec: str, meta: dict, options: Any = None) -> None:
        self.path = path
        self.codec: Codec = get_codec(codec, meta.get("quality"))
        if meta.get("codec_id") != self.codec.id:
            raise ValueError(f"{path}: shard metadata says codec id {meta.get('codec_id')}, codec {codec!r} "
                             f"writes {self.codec.id}")
        self.meta = meta

    def encode(self, video_id: str, label: int, clip_index: int, start_frame: int,
               frames: np.ndarray, *, encoder: ClipEncoder | None = None) -> tuple[bytes, bytes | memoryview]:
        """Header (with the video id) and payload of one clip, coded by ``encoder`` (the video's) when given."""
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
            raise ValueError(f"clip must be uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
        payload = (encoder or self.codec).encode(frames)
        t, h, w, c = frames.shape
        header = pack_header(codec_id=self.codec.id, shape=(t, h, w, c), label=label,
                             clip_index=clip_index, start_frame=start_frame, video_id=video_id, payload=payload)
        return header, payload

    def drain(self, video_id: str, label: int, gen: ClipProducer,
              put: Callable[[int, bytes, bytes | memoryview], None]) -> VideoRecord:
        """Encode every clip ``gen`` yields and ``put(clip_index, header, payload)`` it; returns its record.

        The clips go through one ``ClipEncoder``, from the video's first clip
        on each call (a writer that calls ``produce`` again starts over).
        """
        with self.codec.encoder() as encoder:
            while True:
                try:
                    clip_index, start, frames = next(gen)
                except StopIteration as stop:
                    record: VideoRecord = stop.value  # the generator's return value (ClipProducer)
                    if record.video_id != video_id:
                        raise ValueError(f"the clips of {video_id!r} came with a record of "
                                         f"{record.video_id!r}") from None
                    return record
                header, payload = self.encode(video_id, label, clip_index, start, frames, encoder=encoder)
                put(clip_index, header, payload)

    @classmethod
    def id_problem(cls, video_id: str) -> str | None:
        """Why this backend cannot store a video of this id (a key it cannot form), or None when it can.

        Asked of every video at planning, so such a video is rejected with its
        reason before any work, never found out mid-conversion.
        """
        return None

    def check_meta(self, stored: dict) -> None:
        """A shard reopened for more writing must hold the same kind of data."""
        diffs = [k for k in (*DATA_KEYS, "index") if stored.get(k) != self.meta.get(k)]
        if diffs:
            raise ValueError(f"{self.path}: shard holds {diffs[0]} {_short(stored.get(diffs[0]))}, this job writes "
                             f"{_short(self.meta.get(diffs[0]))}; use another OUT")

    @abstractmethod
    def done_records(self) -> dict[str, VideoRecord]:
        """Every video committed so far, by id."""

    @abstractmethod
    def write_video(self, video_id: str, label: int, produce: Callable[[], ClipProducer],
                    estimate_bytes: int) -> VideoRecord:
        """Store a video's clips and its record atomically; returns the record stored.

        ``produce()`` starts a generator that yields ``(clip_index, start_frame,
        frames)`` and returns the video's ``VideoRecord``; a record with
        ``clips == 0`` means "keep none of what was yielded". The writer may call
        ``produce`` again (after growing its store), so it must be repeatable.
        """

    @abstractmethod
    def forget_video(self, video_id: str) -> None:
        """Remove a video without clips (a failed one) and the shard's summary, so it is converted again.

        Used by ``--retry-failed`` just before the new attempt; ``finish``
        then computes the summary anew.
        """

    @abstractmethod
    def complete_record(self) -> dict | None:
        """The shard's summary once ``finish`` has run, else None."""

    @abstractmethod
    def finish(self) -> dict:
        """Make the shard durable and mark it complete; returns its summary.

        The summary has ``SUMMARY_KEYS``, ``CONTENT_KEY`` and the backend's ``manifest_extras``.
        """

    @abstractmethod
    def close(self) -> None:
        """Let go of the shard's files; what is not committed is converted again by a rerun."""

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ShardReader(ABC):
    """Read side of one finished shard. A backend subclasses it.

    Clips are addressed by identity, (video id, clip index); reading order is
    the records' order (``sort_records``), then clip index.
    """

    backend: ClassVar[str] = ""

    def __init__(self, path: str) -> None:
        self.path = path

    @property
    @abstractmethod
    def meta(self) -> dict | None:
        """The shard's stored metadata (``shard_meta``); None when the shard holds none (not one of this format)."""

    @abstractmethod
    def records(self) -> list[VideoRecord]:
        """Every video record of the shard (clips or not), in reading order."""

    @abstractmethod
    def complete(self) -> dict | None:
        """The summary written when the shard was finished, or None."""

    @abstractmethod
    def read(self, clips: Sequence[tuple[str, int]]) -> Generator[tuple[int, ClipHeader, memoryview], None, None]:
        """(position, header, payload) of each (video id, clip index), in order, in one read of the shard
        (one transaction, one open file), which lasts until the iterator ends or is closed.

        ``payload`` may be a view into a memory map, valid only until the
        next item. The header's stored length has been checked against the
        value before the payload is touched; a value that cannot be read is
        a FormatError naming the shard and the clip (``where``). The caller
        names the clip of its own errors the same way.
        """

    @abstractmethod
    def iter_clips(self) -> Iterator[tuple[memoryview | bytes, ClipHeader, memoryview]]:
        """(header bytes, header, payload) of every clip in reading order (views valid until the next item)."""

    @abstractmethod
    def storage_order(self) -> list[str] | None:
        """Ids of the shard's videos with clips, in the order their clips lie in its files; None where the
        shard does not record it (shards written before it was recorded)."""

    def check_storage(self) -> list[str]:
        """Problems of the storage itself (file sizes, record framing, index files), one line each."""
        return []

    def close(self) -> None:  # noqa: B027 - optional: a backend that holds nothing needs no close
        """Let go of this reader's files (handles shared per process may stay open)."""

    def where(self, video_id: str, clip_index: int) -> str:
        """How errors name one clip: the shard and the clip's identity."""
        return f"{self.path}: {video_id} clip {clip_index}"

    @abstractmethod
    def check_unchanged(self) -> None:
        """FormatError when the shard's files changed since this reader opened them.

        A finished shard never changes; one that does is being rewritten (a
        ``--retry-failed`` rerun of the conversion, or a copy over it), and
        what this reader knows of it (its records, its index) may be stale: it
        refuses rather than read on. Backends compare the identity of the file
        or folder a rewrite must touch (``file_identity``).
        """


def file_identity(path: str) -> tuple[int, int, int, int] | None:
    """(device, inode, size, modification time in ns) of ``path``; None when it is gone."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def changed_error(path: str) -> FormatError:
    return FormatError(f"{path}: the shard changed since it was opened (rewritten by a conversion that is "
                       f"running again, or copied over?); open the conversion again once that is done")


ShardIndex = tuple[dict | None, list[VideoRecord], list[str] | None]


@dataclass(frozen=True, kw_only=True)
class ShardFiles:
    """The files of a finished shard folder, as its backend declares them: patterns matched against whole names.

    Every file of a shard lies directly in its folder. ``data``: the files a
    reader needs (what is uploaded, downloaded and counted; any other file in
    the folder, or object under its prefix, is not the shard's and is
    ignored); ``index``: those of them a reader indexes the shard from
    (metadata, video records, storage order) without its bulk, read by
    ``indexer`` (empty: indexing needs the whole shard); ``scratch``: files a
    writer or reader leaves in the folder that are not the shard (never
    uploaded).
    """

    data: tuple[str, ...]
    index: tuple[str, ...] = ()
    scratch: tuple[str, ...] = ()
    indexer: Callable[[str], ShardIndex] | None = None

    def __post_init__(self) -> None:
        for pattern in (*self.data, *self.index, *self.scratch):
            re.compile(pattern)
        if bool(self.index) != (self.indexer is not None):
            raise ValueError("ShardFiles: index patterns and an indexer go together")

    def is_data(self, name: str) -> bool:
        """Whether ``name`` (a name inside the shard folder) is one of the shard's files."""
        return _matches(self.data, name)

    def is_index(self, name: str) -> bool:
        """Whether ``name`` is one of the small files the shard is indexed from."""
        return _matches(self.index, name) and self.is_data(name)

    def check_listed(self, entry: ShardEntry, where: str) -> None:
        """FormatError (one line naming ``where``, the manifest, the shard and the name) when the files its manifest
        lists for shard ``entry`` (``shard_files``) include one that is not a data file of this backend.

        FORMAT.md: the list holds exactly the backend's files. A manifest
        from a bucket is written by whoever can write the bucket, and the
        list says what a cache or an uploader copies into a shard's folder:
        any other name (a second database's lock file, a file of anyone's
        choosing) would be copied there. The manifest's parser has checked
        the names are plain and distinct; which names are data is the
        backend's to say.
        """
        for f in entry.shard_files or ():
            if not self.is_data(f.name):
                raise FormatError(f"{where}: shard_files lists {f.name!r} for shard {entry.name}, which is no file "
                                  f"of its backend's shards; the manifest is malformed")

    def listed(self, entry: ShardEntry, found: Iterable[str], where: str = "manifest.json") -> list[str]:
        """The names of the files of the shard ``entry`` describes: those its manifest entry lists (format version
        3; FormatError, as ``check_listed``, for one that is not data), or, in a version 2 manifest, those of
        ``found`` (a folder's or a listing's names) that are data."""
        if entry.shard_files is not None:
            self.check_listed(entry, where)
            return [f.name for f in entry.shard_files]
        return sorted(name for name in found if self.is_data(name))

    def describe(self, folder: str) -> tuple[ShardFile, ...]:
        """Every data file of the finished shard in ``folder``, by name, with its size and SHA-256 (what a version 3
        manifest lists; OSError as it comes)."""
        return tuple(ShardFile(name=name, bytes=os.path.getsize(os.path.join(folder, name)),
                               sha256=file_sha256(os.path.join(folder, name)))
                     for name in sorted(os.listdir(folder)) if self.is_data(name))


def _matches(patterns: tuple[str, ...], name: str) -> bool:
    """Whether ``name`` is a plain file name (``plain_name``) matched in full by one of ``patterns``: a name from a
    bucket's listing that is not plain is no file of any shard, whatever a backend's patterns say."""
    try:
        plain_name(name, "file", "")
    except FormatError:
        return False
    return any(re.fullmatch(p, name) for p in patterns)


@dataclass(frozen=True, kw_only=True)
class Backend:
    """A storage backend: its writer, its reader, its options, its files and the summary fields its manifest
    entries add."""

    name: str
    summary: str  # what its shards are, in a few words (the command line's help)
    writer: type[ShardWriter]
    reader: type[ShardReader]
    options: type  # a frozen dataclass whose fields are declared with convert.format.options.option
    files: ShardFiles
    manifest_extras: tuple[str, ...] = ()

    def make_options(self, values: dict[str, Any] | None = None) -> Any:
        """The options dataclass from ``{field: value}`` (unset fields at their defaults); ValueError when wrong."""
        try:
            return self.options(**(values or {}))
        except TypeError as exc:
            raise ValueError(f"{self.name} options: {exc}") from None


__all__ = ["CONTENT_KEY", "SUMMARY_KEYS", "Backend", "ClipProducer", "ContentSum", "ShardFiles", "ShardIndex",
           "ShardReader", "ShardWriter", "file_sha256", "hexdigest_of", "read_back_summary",
           "summarize_clips"]
