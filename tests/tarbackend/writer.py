"""The tar writer: a shard's clips appended to one archive, each video committed by rewriting the index.

A video's members are appended after the committed length; then the index,
naming the new length, the video's record and its clips, replaces the old
one atomically (its commit). After a kill at any moment the index names
only whole videos, and a writer reopening the shard cuts the archive back to
the committed length before it appends: the rest is converted again.
``finish`` appends the end-of-archive marker, syncs, and writes the summary
into the index.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable
from typing import Any, BinaryIO

from convert.format.base import ClipProducer, ShardWriter, read_back_summary
from convert.format.errors import FormatError, ShardDamaged, StoreError, make_folder, storing
from convert.format.layout import write_json_atomic
from convert.format.parts import fsync_path
from convert.format.records import VideoRecord

from .files import BLOCK, DATA_FILE, END, INDEX_FILE, read_index
from .options import TarOptions
from .reader import TarReader


def member_header(number: int, size: int) -> bytes:
    """The ustar header of the archive's member ``number`` holding ``size`` bytes: the same bytes on every run
    (no time, owner or mode of this machine)."""
    info = tarfile.TarInfo(f"{number:08d}.clip")
    info.size, info.mtime, info.mode = size, 0, 0o644
    return info.tobuf(format=tarfile.USTAR_FORMAT)


class TarWriter(ShardWriter):
    """Writes a shard's archive; each video is committed (and survives kill -9) once its index is written."""

    backend = "tar"

    def __init__(self, *, path: str, codec: str, meta: dict, options: TarOptions | None = None) -> None:
        super().__init__(path=path, codec=codec, meta=meta, options=options)
        self.options = options or TarOptions()
        make_folder(path)
        self._data = os.path.join(path, DATA_FILE)
        self._index = os.path.join(path, INDEX_FILE)
        self._fh: BinaryIO | None = None
        self._end = -1  # the archive's length as this writer left it (-1: not opened yet)
        if not os.path.lexists(self._index):
            with storing("creating", self._data):
                open(self._data, "wb").close()  # what a killed first run left of it is no one's
            self._commit({"meta": meta, "bytes": 0, "videos": [], "clips": [], "complete": None})
            return
        try:
            index = read_index(path)
            size = os.path.getsize(self._data)
        except (FormatError, FileNotFoundError) as exc:
            raise ShardDamaged(f"{path}: cannot be opened: {exc}") from exc
        if size < index.size:
            raise ShardDamaged(f"{path}: cannot be opened: {self._data} holds {size} bytes, its index commits "
                               f"{index.size} (truncated?)")
        self.check_meta(index.meta)
        self._state = index.state

    def _commit(self, state: dict[str, Any]) -> None:
        """Write ``state`` as the index, atomically: the commit of what it names."""
        write_json_atomic(self._index, state, sync=self.options.sync, sort_keys=True, separators=(",", ":"))
        self._state = state

    def done_records(self) -> dict[str, VideoRecord]:
        return {raw["video_id"]: VideoRecord.from_dict(raw, self._index) for raw in self._state["videos"]}

    def _archive(self) -> BinaryIO:
        """The archive, open for writing at its committed length (anything after it cut off)."""
        if self._fh is None:
            with storing("opening", self._data):
                self._fh = open(self._data, "r+b")
        start = self._state["bytes"]
        if self._end != start:
            with storing("truncating", self._data):
                self._fh.flush()
                self._fh.truncate(start)
                self._fh.seek(start)
            self._end = start
        return self._fh

    def write_video(self, video_id: str, label: int, produce: Callable[[], ClipProducer],
                    estimate_bytes: int) -> VideoRecord:
        fh = self._archive()
        entries: list[list[Any]] = []
        number = len(self._state["clips"])

        def put(clip_index: int, header: bytes, payload: bytes | memoryview) -> None:
            size = len(header) + len(payload)
            block = member_header(number + len(entries), size)
            fh.writelines((block, header, payload, bytes(-size % BLOCK)))
            entries.append([video_id, clip_index, self._end + len(block), size])
            self._end += len(block) + size + -size % BLOCK

        gen = produce()
        try:
            # An OSError from anywhere in here is the machine's (the producer reports what the decoder says
            # about the video as its record): nothing of the video is committed, the job stops.
            with storing("writing shard", self.path):
                record = self.drain(video_id, label, gen, put)
            if record.clips == 0:
                entries = []  # keep none of it (skip policy, or nothing usable): only the record
            end = self._end if entries else self._state["bytes"]
            with storing("writing", self._data):
                fh.flush()
                if self.options.sync:
                    os.fsync(fh.fileno())
            videos = [v for v in self._state["videos"] if v["video_id"] != video_id]
            self._commit({**self._state, "bytes": end, "videos": [*videos, record.to_dict()],
                          "clips": self._state["clips"] + entries, "complete": None})
        except BaseException:
            gen.close()
            self._end = -1  # whatever was appended is cut off before the next write
            raise
        return record

    def forget_video(self, video_id: str) -> None:
        done = self.done_records().get(video_id)
        if done is None:
            return
        if done.clips:
            raise ValueError(f"{self.path}: {video_id} has clips; only videos without clips can be converted again")
        videos = [v for v in self._state["videos"] if v["video_id"] != video_id]
        self._commit({**self._state, "videos": videos, "complete": None})

    def complete_record(self) -> dict | None:
        return self._state.get("complete")

    def finish(self) -> dict:
        summary = self.complete_record()
        if summary is not None:
            return summary
        fh = self._archive()
        with storing("finishing", self._data):
            fh.write(END)
            fh.flush()
            os.fsync(fh.fileno())
        self._end += len(END)
        with storing("reading back", self.path):
            reader = TarReader(self.path)
            try:
                summary = read_back_summary(reader)
            finally:
                reader.close()
        self._commit({**self._state, "complete": summary})
        fsync_path(self._index)
        fsync_path(self.path)
        return summary

    def close(self) -> None:
        fh, self._fh = self._fh, None
        self._end = -1
        if fh is not None:
            # What is not committed stays past the committed length; a rerun cuts it off.
            with storing("closing", self._data):
                fh.close()


__all__ = ["TarWriter", "member_header"]
