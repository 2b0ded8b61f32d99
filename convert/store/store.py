"""The plain reader every other reader builds on: ``open_clips(OUT)``.

It indexes a finished conversion from its manifest and the shards' video
records (through the backend the manifest names), and reads clips by global
index. Shards are opened lazily, once per process (py-lmdb refuses a second
open in one process, and a handle must not cross a fork), so a ``ClipStore``
can be pickled into DataLoader workers, DALI workers and DDP ranks, and read
from several threads. Where the shards' files come from (a folder, or the
shard cache of a URL) is its ``ShardSource``'s business (``source``).
Imports neither torch nor PyAV.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

import numpy as np

from convert.format.backends import get_backend
from convert.format.codecs import Codec, codec_for_id
from convert.format.errors import FormatError
from convert.format.layout import ClipHeader, check_crc
from convert.format.manifest import Manifest, check_plan, check_shard_meta, read_manifest

from .remote import Remote, is_url, read_remote_manifest
from .source import ShardSource, shard_source

if TYPE_CHECKING:
    from convert.format.base import ShardReader

    from .cache.cache import ShardCache
    from .cache.prefetch import Prefetcher
    from .cache.settings import CacheSettings


@dataclass(frozen=True)
class ClipSample:
    """One stored clip and where it came from."""

    clip: np.ndarray  # (T, H, W, 3) uint8 RGB
    label: int
    video_id: str
    clip_index: int


@dataclass(frozen=True)
class StoredClip:
    """One clip as ``ClipStore.read`` hands it out: its ``position`` in the indices asked, its checked
    ``header``, its ``payload`` (valid until the next clip) and ``where``, how errors name it (shard and clip)."""

    position: int
    header: ClipHeader
    payload: memoryview
    where: str

    def codec(self, *, verify: bool = False) -> Codec:
        """The codec of this clip's payload, its CRC-32 checked first when ``verify`` (always for a payload
        decoded by FFmpeg: ``Payload.crc_checked``, the rule every reader follows)."""
        codec = codec_for_id(self.header.codec_id)
        if codec.payload.crc_checked(verify):
            check_crc(self.payload, self.header)
        return codec

    @contextlib.contextmanager
    def named(self) -> Iterator[None]:
        """A FormatError raised inside comes out naming this clip's shard and clip, in one line."""
        try:
            yield
        except FormatError as exc:
            raise FormatError(f"{self.where}: {exc}") from exc


class ClipStore(Sequence):
    """All clips of a conversion, in manifest shard order, then video id, then clip index.

    ``root`` is a folder or a URL (``s3://``, ``gs://``, ``http(s)://``,
    ``file://``...). A URL is read through a local ``ShardCache`` (``cache``
    gives its settings): ``root`` is then the cache's mirror folder, ``url``
    the URL, and each shard is fetched whole and verified before its first
    read; ``cache`` is ignored for a folder.
    """

    def __init__(self, root: str, *, cache: CacheSettings | None = None) -> None:
        self.source: ShardSource = shard_source(root, cache)
        self.url: str | None = self.source.url
        self.root = self.source.root
        self.manifest: Manifest = self.source.manifest
        self.backend = get_backend(self.manifest.data.backend)
        self.codec: Codec = codec_for_id(self.manifest.data.codec_id)
        self.classes: list[str] = list(self.manifest.classes)
        check_plan(self.root, self.manifest)
        self.shard_paths = [self.source.shard_path(si) for si in range(len(self.manifest.shards))]
        shard_of, ids, labels, counts, frames = [], [], [], [], []
        for si, meta in enumerate(self.manifest.shards):
            stored_meta, records, where = self.source.index(si)
            check_shard_meta(stored_meta, self.manifest, si, where)
            n = 0
            for rec in records:
                if rec.clips:
                    shard_of.append(si)
                    ids.append(rec.video_id)
                    labels.append(rec.label)
                    counts.append(rec.clips)
                    frames.append(rec.frames)
                    n += rec.clips
            if n != meta.clips:
                raise FormatError(f"{where}: holds {n} clips, manifest says {meta.clips} (truncated or replaced?)")
        self.video_ids: list[str] = ids
        self.video_labels = np.asarray(labels, dtype=np.int64)
        self.video_shard = np.asarray(shard_of, dtype=np.int32)
        self.video_clips = np.asarray(counts, dtype=np.int64)
        self._ends = np.cumsum(self.video_clips)
        # Each video's frame timeline (FORMAT.md, *Frame timeline*): the frames its clips hold, in order, no more
        # than its record's frame count (a video shorter than a clip was stored padded: its own frames only). A
        # tail clip (the video's last T frames, after its last whole clip) makes it the whole video; where one is,
        # _tail_start is the frame it starts at (-1: none).
        settings, counts_of = self.manifest.data.clip, np.asarray(frames, dtype=np.int64)
        t = settings.clip_len
        tail = settings.tail & (counts_of % t != 0) & (counts_of >= t) & (self.video_clips == counts_of // t + 1)
        self.video_frames = np.where(tail, counts_of, np.minimum(self.video_clips * t, counts_of))
        self._tail_start = np.where(tail, counts_of - t, -1)
        self._frame_shapes: dict[int, tuple[int, int]] = {}
        self._storage: np.ndarray | None = None
        bad = self.video_labels[(self.video_labels < 0) | (self.video_labels >= len(self.classes))]
        if bad.size:
            raise FormatError(f"{self.root}: label {int(bad[0])} outside the {len(self.classes)} classes")

    @property
    def cache(self) -> ShardCache | None:
        """The shard cache a URL is read through (None for a folder)."""
        return self.source.cache

    @property
    def name(self) -> str:
        """How messages name the conversion: its URL, or its folder."""
        return self.url or self.root

    def shards_of(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The shard number of each clip index."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return self.video_shard[np.searchsorted(self._ends, idx, side="right")]

    def prefetcher(self) -> Prefetcher | None:
        """This process's prefetcher of the remote conversion (None for a folder); made on first use."""
        return self.source.prefetcher()

    def hold_all(self, shards: Sequence[int]) -> None:
        """Fetch ``shards`` of a remote conversion and hold them until ``close()`` (DALI's native reader, which
        opens files itself); refused in one line when they do not fit the cache together."""
        self.source.hold_all(shards)

    def reader(self, shard: int) -> ShardReader:
        """This process's reader of shard number ``shard`` (opened on first use).

        A remote shard is fetched first, but not held: reads that must not
        race an eviction go through ``read``.
        """
        return self.source.reader(shard)

    def close(self) -> None:
        """Close the shard readers this store opened (they reopen on next use).

        Process-wide handles that other readers opened first stay open (see
        ``ShardReader.close``).
        """
        self.source.close()

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def locate(self, i: int) -> tuple[int, int]:
        """(video number, clip index within the video) of global clip ``i``."""
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"clip {i} out of range for {n} clips")
        v = int(np.searchsorted(self._ends, i, side="right"))
        return v, i - int(self._ends[v] - self.video_clips[v])

    def where(self, i: int) -> str:
        """How errors name global clip ``i``: its shard and identity."""
        v, c = self.locate(i)
        return self.source.where(int(self.video_shard[v]), self.video_ids[v], c)

    def storage_order(self) -> np.ndarray:
        """Every clip index once, in the order the clips' bytes lie in the shards (shard by shard).

        What ``DistributedClipSampler(order="blocks")`` reads in blocks of.
        Each shard records it (FORMAT.md, *Storage order*); a shard that does
        not (written before it was recorded) is taken in reading order. It
        decides locality only, never which clips are read.
        """
        if self._storage is None:
            starts = self._ends - self.video_clips
            # A shard's videos are a run of video numbers (shards in manifest order): its bounds.
            bounds = np.searchsorted(self.video_shard, np.arange(len(self.shard_paths) + 1)).tolist()
            videos: list[int] = []
            for si in range(len(self.shard_paths)):
                ids = self.source.storage_order(si) or []
                number = {self.video_ids[v]: v for v in range(bounds[si], bounds[si + 1])}
                # Each video once (its first place), then those the order does not name, in reading order.
                mine = dict.fromkeys(number[vid] for vid in ids if vid in number)
                mine.update(dict.fromkeys(range(bounds[si], bounds[si + 1])))
                videos += mine
            v = np.asarray(videos, dtype=np.int64)
            counts = self.video_clips[v]
            order = np.repeat(starts[v] - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
            order.flags.writeable = False  # cached and shared with every sampler that asks
            self._storage = order
        return self._storage

    def labels(self) -> np.ndarray:
        """The label of every clip, in index order (for samplers)."""
        return np.repeat(self.video_labels, self.video_clips)

    def video_index(self) -> np.ndarray:
        """The video number of every clip, in index order."""
        return np.repeat(np.arange(len(self.video_ids)), self.video_clips)

    def refs(self, indices: Sequence[int]) -> tuple[np.ndarray, list[tuple[str, int]]]:
        """Shard number and (video id, clip index) of many clips at once (one vectorised search)."""
        shards, refs, _ = self._locate_many(indices)
        return shards, refs

    def _locate_many(self, indices: Sequence[int]) -> tuple[np.ndarray, list[tuple[str, int]], list[int]]:
        """``refs`` and the label each clip's video record gives."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise IndexError(f"clip {bad} out of range for {n} clips")
        v = np.searchsorted(self._ends, idx, side="right")
        within = idx - (self._ends[v] - self.video_clips[v])
        ids = self.video_ids
        return (self.video_shard[v], [(ids[a], int(b)) for a, b in zip(v.tolist(), within.tolist())],
                self.video_labels[v].tolist())

    def read(self, indices: Sequence[int]) -> Generator[StoredClip, None, None]:
        """The clips ``indices`` as ``StoredClip``s (position in ``indices``, header, payload, name), grouped by
        shard: one read of each shard (``ShardReader.read``), held until its clips are through.

        The one way a clip's bytes leave the shards: the caller pulls them
        and decodes them itself (loaders -> store -> format, nothing called
        back). ``payload`` may be a view into a shard's memory map, valid
        only until the next clip; a FormatError of the caller's about a clip
        is named by ``clip.named()`` (its shard and clip), as the store names
        its own. Close the iterator when stopping early (``with
        contextlib.closing(...)``, or read it to its end): a shard's read is
        held until then.

        Every clip's header is checked first against what the conversion
        says of it: its label must be its video record's (which is one of the
        classes) and its shape one the conversion can hold
        (``DataSpec.shape_problem``). A reader that skips payload checksums by
        design still never hands out an impossible label or shape, nor
        decodes a payload into more memory than the manifest allows a clip.
        """
        shards, refs, labels = self._locate_many(indices)
        spec, n_classes = self.manifest.data, len(self.classes)
        if shards.size == 1:  # one clip (``get``, a Dataset's item): no grouping to do
            groups: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
        else:
            order = np.argsort(shards, kind="stable")
            groups = np.split(order, np.flatnonzero(np.diff(shards[order])) + 1) if order.size else []
        for group in groups:
            positions: list[int] = group.tolist()
            with self.source.using(int(shards[group[0]])) as reader:
                clips = reader.read([refs[p] for p in positions])
                try:
                    for k, header, payload in clips:
                        pos = positions[k]
                        where = reader.where(*refs[pos])
                        if header.label != labels[pos]:
                            if not 0 <= header.label < n_classes:
                                raise FormatError(f"{where}: label {header.label} outside the {n_classes} classes")
                            raise FormatError(f"{where}: label {header.label}, its video record says {labels[pos]}")
                        problem = spec.shape_problem(header.shape)
                        if problem is not None:
                            raise FormatError(f"{where}: {problem}")
                        yield StoredClip(pos, header, payload, where)
                finally:
                    clips.close()  # the shard's read ends here, whatever the caller did

    def get(self, i: int, *, verify: bool = False) -> ClipSample:
        """Clip ``i`` decoded; ``verify`` checks its payload CRC-32 first (always, for a payload decoded by FFmpeg:
        ``Payload.crc_checked``)."""
        with contextlib.closing(self.read([i])) as clips:
            for clip in clips:
                with clip.named():
                    header = clip.header
                    frames = np.array(clip.codec(verify=verify).decode(clip.payload, header.shape))
        return ClipSample(frames, header.label, header.video_id, header.clip_index)

    def frame_shape(self, video: int) -> tuple[int, int]:
        """(H, W) of video number ``video``'s frames, from its first clip's header (nothing decoded): every clip
        of a video has its frames' size."""
        known = self._frame_shapes.get(video)
        if known is not None:
            return known
        with contextlib.closing(self.read([self._video_clip(video, 0)])) as clips:
            shape = next(clips).header.shape
        self._frame_shapes[video] = shape[1], shape[2]  # one header read per video and process (any thread may add)
        return shape[1], shape[2]

    def _video_clip(self, video: int, chunk: int) -> int:
        """The global index of clip ``chunk`` of video number ``video``."""
        if not 0 <= video < len(self.video_ids):
            raise IndexError(f"video {video} out of range for {len(self.video_ids)} videos")
        return int(self._ends[video] - self.video_clips[video]) + chunk

    def frames(self, video: int, indices: Sequence[int] | np.ndarray, *, out: np.ndarray | None = None,
               at: tuple[int, int] = (0, 0), verify: bool = False) -> np.ndarray:
        """Frames ``indices`` of video number ``video``'s timeline (FORMAT.md, *Frame timeline*: frame i is
        frame i % T of its clip i // T, or of its tail clip) as uint8 (len(indices), h, w, 3), in the order
        asked (repeats allowed).

        ``out``: written into it, and returned; its (h, w) is the region of
        each frame whose top-left corner is ``at`` (a crop; without ``out``,
        whole frames). Only the clips the indices fall in are read, each once
        and decoded once: jpeg and lz4 decode just the frames asked, raw
        copies just them, h264 and vp9 decode a clip up to its last frame
        asked and convert just the frames asked to RGB. ``verify`` checks each
        clip's CRC-32 first (always for a bitstream, as ``get``). A
        conversion whose clips do not tile its videos is refused in one line
        (``DataSpec.timeline_problem``), as is an index outside the video's
        ``video_frames``; a damaged clip is a FormatError naming its shard
        and clip, as ``get``'s.
        """
        problem = self.manifest.data.timeline_problem()
        if problem is not None:
            raise FormatError(f"{self.name}: cannot read frames at read time: {problem}")
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        first = self._video_clip(video, 0)
        length = int(self.video_frames[video])
        if idx.size and (idx.min() < 0 or idx.max() >= length):
            bad = int(idx[(idx < 0) | (idx >= length)][0])
            raise IndexError(f"frame {bad} out of range for video {self.video_ids[video]!r} of {length} frames")
        if out is None:
            out = np.empty((idx.size, *self.frame_shape(video), 3), dtype=np.uint8)
        t = self.manifest.data.clip.clip_len
        chunk, within = np.divmod(idx, t)
        tail_start = int(self._tail_start[video])
        if tail_start >= 0:  # frames past the last whole clip are in the tail clip, which starts at tail_start
            last = int(self.video_clips[video]) - 1
            past = chunk >= last
            chunk[past], within[past] = last, idx[past] - tail_start
        touched = np.unique(chunk)
        rows = [np.flatnonzero(chunk == c) for c in touched.tolist()]  # of out, for each clip touched

        with contextlib.closing(self.read((first + touched).tolist())) as clips:
            for clip in clips:
                with clip.named():
                    codec, shape, mine = clip.codec(verify=verify), clip.header.shape, rows[clip.position]
                    picks = within[mine].tolist()
                    if mine[-1] - mine[0] + 1 == mine.size:  # this clip's rows are a run of out: decoded straight in
                        codec.frames_at(clip.payload, shape, picks, out[mine[0]:mine[-1] + 1], at=at)
                    else:
                        out[mine] = codec.frames_at(clip.payload, shape, picks,
                                                    np.empty((mine.size, *out.shape[1:]), dtype=np.uint8), at=at)
        return out

    @overload
    def __getitem__(self, i: int) -> ClipSample: ...

    @overload
    def __getitem__(self, i: slice) -> list[ClipSample]: ...

    def __getitem__(self, i: int | slice) -> ClipSample | list[ClipSample]:
        if isinstance(i, slice):
            return [self.get(j) for j in range(*i.indices(len(self)))]
        return self.get(int(i))

    def __iter__(self) -> Iterator[ClipSample]:
        for i in range(len(self)):
            yield self.get(i)

def manifest_at(root: str, *, cache: CacheSettings | None = None) -> Manifest:
    """The manifest of the conversion at ``root``, a folder or a URL (read without caching anything)."""
    if not is_url(root):
        return read_manifest(root)
    return read_remote_manifest(Remote(root, storage_options=cache.storage_options if cache else None))[1]


def open_clips(root: str, *, cache: CacheSettings | None = None) -> ClipStore:
    """Open a finished conversion for reading: ``len()``, item ``i``, ``.classes``.

    ``root``: a folder or a URL (read through a local cache, ``cache`` its settings; see ``ClipStore``).
    """
    return ClipStore(root, cache=cache)


__all__ = ["ClipSample", "ClipStore", "StoredClip", "manifest_at", "open_clips"]
