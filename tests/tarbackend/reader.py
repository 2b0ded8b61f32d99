"""The tar reader: a shard's clips read from its archive where its index says they lie."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Generator, Iterator, Sequence
from typing import BinaryIO

from convert.format.base import ShardReader, changed_error, file_identity
from convert.format.errors import FormatError, ShardMissing
from convert.format.layout import ClipHeader, unpack_header
from convert.format.records import VideoRecord

from .files import BLOCK, DATA_FILE, END, INDEX_FILE, read_index


class TarReader(ShardReader):
    """A finished (or committed-so-far) tar shard."""

    backend = "tar"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._data = os.path.join(path, DATA_FILE)
        self._index_path = os.path.join(path, INDEX_FILE)
        if not os.path.lexists(self._index_path):
            raise ShardMissing(f"{path}: shard missing (no {INDEX_FILE})")
        # A rewrite replaces the index (a new file) and appends to or cuts the archive: both files' identities.
        self._identity = file_identity(self._index_path), file_identity(self._data)
        self._index = read_index(path)
        if not os.path.exists(self._data):
            raise ShardMissing(f"{self._data}: archive missing")
        self.file_size = os.path.getsize(self._data)
        if self.file_size < self._index.size:
            raise FormatError(f"{self._data}: {self.file_size} bytes, its index commits {self._index.size} "
                              f"(truncated or replaced?)")

    @property
    def meta(self) -> dict | None:
        return self._index.meta

    def complete(self) -> dict | None:
        return self._index.complete

    def records(self) -> list[VideoRecord]:
        return self._index.records

    def storage_order(self) -> list[str]:
        return self._index.storage_order()

    def _clip(self, fh: BinaryIO, video_id: str, clip_index: int) -> tuple[bytes, ClipHeader, memoryview]:
        """(header bytes, header, payload) of one clip read from the open archive ``fh``, its stored length and
        identity checked; FormatError naming the shard and the clip."""
        where = self.where(video_id, clip_index)
        entry = self._index.entries.get((video_id, clip_index))
        if entry is None:
            raise FormatError(f"{where}: no such clip in the shard")
        offset, size = entry
        fh.seek(offset)
        value = memoryview(fh.read(size))
        if len(value) != size:
            raise FormatError(f"{where}: the archive ends {len(value)} bytes into the clip's {size}")
        try:
            head = unpack_header(value, value_len=size)
        except FormatError as exc:
            raise FormatError(f"{where}: {exc}") from exc
        if (head.video_id, head.clip_index) != (video_id, clip_index):
            raise FormatError(f"{where}: header says {head.video_id!r} clip {head.clip_index}")
        return bytes(value[:head.offset]), head, value[head.offset:]

    def _archive(self) -> BinaryIO:
        self.check_unchanged()
        return open(self._data, "rb")  # per call, never kept: a reader holds no handle, across forks or pickling

    def check_unchanged(self) -> None:
        if (file_identity(self._index_path), file_identity(self._data)) != self._identity:
            raise changed_error(self.path)

    def read(self, clips: Sequence[tuple[str, int]]) -> Generator[tuple[int, ClipHeader, memoryview], None, None]:
        with self._archive() as fh:
            for pos, (vid, c) in enumerate(clips):
                _, head, payload = self._clip(fh, vid, c)
                yield pos, head, payload

    def iter_clips(self) -> Iterator[tuple[bytes, ClipHeader, memoryview]]:
        with self._archive() as fh:
            for rec in self._index.records:
                for c in range(rec.clips):
                    yield self._clip(fh, rec.video_id, c)

    def check_storage(self) -> list[str]:
        """Every member's header (its checksum, its size) against the index, and the end marker of a finished
        shard."""
        entries = sorted(self._index.entries.values())
        problems = []
        pos = k = 0
        with self._archive() as fh:
            while pos < self._index.size:
                fh.seek(pos)
                try:
                    info = tarfile.TarInfo.frombuf(fh.read(BLOCK), "utf-8", "surrogateescape")
                except tarfile.HeaderError as exc:
                    problems.append(f"{self._data}: member {k} at byte {pos}: not a tar header: {exc}")
                    break
                if k >= len(entries) or entries[k] != (pos + BLOCK, info.size):
                    problems.append(f"{self._data}: member {k} at byte {pos} differs from its index entry")
                    break
                pos += BLOCK + info.size + -info.size % BLOCK
                k += 1
            else:
                if k != len(entries):
                    problems.append(f"{self._data}: {k} members, its index lists {len(entries)} clips")
            fh.seek(self._index.size)
            if self._index.complete is not None and fh.read() != END:
                problems.append(f"{self._data}: a finished shard's archive must end with its end-of-archive "
                                f"marker right after its {self._index.size} committed bytes")
        return problems


__all__ = ["TarReader"]
