"""The plain reader every other reader builds on: ``open_clips(OUT)``.

It indexes a finished conversion from its manifest and the shards' done
records, and reads clips by global index. LMDB environments are opened lazily,
once per process (py-lmdb refuses a second open in one process, and an
environment must not cross a fork), so a ``ClipStore`` can be pickled into
DataLoader workers and DDP ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import lmdb
import numpy as np

from convert.codecs import codec_for_id
from convert.writers.lmdb_writer import LmdbWriter, forget_readonly, open_readonly
from convert.format import FormatError, check_crc, clip_key, read_manifest, unpack_header

# One error type for everything wrong with a conversion folder on the read side.
DatasetError = FormatError


def open_env(path: str) -> lmdb.Environment:
    """This process's read-only handle on a shard, opened on first use (fork-safe)."""
    try:
        return open_readonly(path)
    except OSError as exc:  # missing or truncated data file
        raise DatasetError(str(exc)) from exc
    except lmdb.Error as exc:
        raise DatasetError(f"{path}: shard cannot be opened: {exc}") from exc


@dataclass(frozen=True)
class ClipSample:
    """One stored clip and where it came from."""

    clip: np.ndarray  # (T, H, W, 3) uint8 RGB
    label: int
    video_id: str
    clip_index: int


def decode_value(value: bytes | memoryview, *, verify: bool = False):
    """Header and (T, H, W, 3) uint8 array of one stored clip value."""
    header = unpack_header(value)
    if verify:
        check_crc(value, header)
    clip = codec_for_id(header.codec_id).decode(memoryview(value)[header.offset:], header.shape)
    return header, clip


class ClipStore(Sequence):
    """All clips of a conversion, in manifest shard order, then video id, then clip index."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.manifest = read_manifest(self.root)
        self.classes: list[str] = list(self.manifest["classes"])
        self.shard_paths = [os.path.join(self.root, s["path"]) for s in self.manifest["shards"]]
        shard_of, ids, labels, counts = [], [], [], []
        for si, (path, meta) in enumerate(zip(self.shard_paths, self.manifest["shards"])):
            open_env(path)  # this process's cached handle, with the reader's errors
            n = 0
            for rec in LmdbWriter.read_done(path):  # key order of m/done/<video_id>
                if rec.clips:
                    shard_of.append(si)
                    ids.append(rec.video_id)
                    labels.append(rec.label)
                    counts.append(rec.clips)
                    n += rec.clips
            if n != meta["clips"]:
                raise DatasetError(f"{path}: holds {n} clips, manifest says {meta['clips']} (truncated or replaced?)")
        self.video_ids: list[str] = ids
        self.video_labels = np.asarray(labels, dtype=np.int64)
        self.video_shard = np.asarray(shard_of, dtype=np.int32)
        self.video_clips = np.asarray(counts, dtype=np.int64)
        self._ends = np.cumsum(self.video_clips)
        bad = self.video_labels[(self.video_labels < 0) | (self.video_labels >= len(self.classes))]
        if bad.size:
            raise DatasetError(f"{self.root}: label {int(bad[0])} outside the {len(self.classes)} classes")

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

    def key(self, i: int) -> tuple[int, bytes]:
        v, c = self.locate(i)
        return int(self.video_shard[v]), clip_key(self.video_ids[v], c)

    def labels(self) -> np.ndarray:
        """The label of every clip, in index order (for samplers)."""
        return np.repeat(self.video_labels, self.video_clips)

    def video_index(self) -> np.ndarray:
        """The video number of every clip, in index order."""
        return np.repeat(np.arange(len(self.video_ids)), self.video_clips)

    def read_values(self, indices: Sequence[int]) -> list[bytes]:
        """Raw stored values for many clips: one read transaction per shard touched."""
        keys = [self.key(int(i)) for i in indices]
        out: list[bytes | None] = [None] * len(keys)
        by_shard: dict[int, list[int]] = {}
        for pos, (si, _) in enumerate(keys):
            by_shard.setdefault(si, []).append(pos)
        for si, positions in by_shard.items():
            with open_env(self.shard_paths[si]).begin() as txn:
                for pos in positions:
                    value = txn.get(keys[pos][1])
                    if value is None:
                        raise DatasetError(f"{self.shard_paths[si]}: key {keys[pos][1]!r} missing")
                    out[pos] = value
        return out  # type: ignore[return-value]

    def keys(self, indices: Sequence[int]) -> tuple[np.ndarray, list[bytes]]:
        """Shard number and key of many clips at once (one vectorised search)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise IndexError(f"clip {bad} out of range for {n} clips")
        v = np.searchsorted(self._ends, idx, side="right")
        within = idx - (self._ends[v] - self.video_clips[v])
        ids = self.video_ids
        return self.video_shard[v], [clip_key(ids[a], int(b)) for a, b in zip(v.tolist(), within.tolist())]

    def visit_values(self, indices: Sequence[int], fn: Callable[[int, memoryview], None]) -> None:
        """Call ``fn(position, value)`` for each index: one read transaction per shard touched.

        ``value`` is a memoryview into the shard's memory map, valid only during
        the call (no copy is made). A ``FormatError`` raised by ``fn`` comes back
        as a ``DatasetError`` naming the shard and the key.
        """
        shards, keys = self.keys(indices)
        order = np.argsort(shards, kind="stable")
        bounds = np.flatnonzero(np.diff(shards[order])) + 1
        for group in np.split(order, bounds) if order.size else ():
            path = self.shard_paths[int(shards[group[0]])]
            with open_env(path).begin(buffers=True) as txn:
                for pos in group.tolist():
                    value = txn.get(keys[pos])
                    if value is None:
                        raise DatasetError(f"{path}: key {keys[pos].decode(errors='replace')} missing")
                    try:
                        fn(pos, value)
                    except FormatError as exc:
                        raise DatasetError(f"{path}: {keys[pos].decode(errors='replace')}: {exc}") from exc

    def get(self, i: int, *, verify: bool = False) -> ClipSample:
        (value,) = self.read_values([i])
        header, clip = decode_value(value, verify=verify)
        return ClipSample(clip, header.label, header.video_id, header.clip_index)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self.get(j) for j in range(*i.indices(len(self)))]
        return self.get(int(i))

    def __iter__(self) -> Iterator[ClipSample]:
        for i in range(len(self)):
            yield self.get(i)

    def __getstate__(self) -> dict:
        return self.__dict__  # environments live in the per-process cache, not here


def open_clips(root: str) -> ClipStore:
    """Open a finished conversion for reading: ``len()``, item ``i``, ``.classes``."""
    return ClipStore(root)


__all__ = ["ClipSample", "ClipStore", "DatasetError", "decode_value", "open_clips", "open_env", "read_manifest"]
