"""The TFRecord writer: a shard's clips appended to part files, committed a part at a time.

The folder's files and the commit protocol are FORMAT.md's *TFRecord shards*
and ``convert.format.parts``; a part is committed (and survives kill -9)
once it is closed: when it reaches ``part_bytes``, and at ``finish``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..base import ClipProducer, ShardWriter, read_back_summary
from ..errors import FormatError, ShardDamaged, StoreError, make_folder, storing
from ..layout import read_json_file, unpack_header, write_json_atomic
from ..parts import PartLog, fsync_path, latest_records
from ..records import VideoRecord
from .options import TFRecordOptions
from .reader import COMPLETE_FILE, DATA, INDEX, META_FILE, TFRecordReader
from .schema import clip_features
from .wire import encode_example, frame_record


class _OpenPart:
    """The part being written: its temporary record file, index entries and video records so far."""

    def __init__(self, log: PartLog, number: int) -> None:
        self.number = number
        self.tmp = log.file(number, DATA) + ".tmp"
        with storing("creating", self.tmp):
            self.fh = open(self.tmp, "wb")
        self.index: list[tuple[int, int]] = []
        self.videos: list[VideoRecord] = []
        self.size = 0

    def append(self, pieces: list[bytes | memoryview]) -> None:
        length = sum(len(p) for p in pieces)
        with storing("writing", self.tmp):
            self.fh.writelines(pieces)
        self.index.append((self.size, length))
        self.size += length

    def rewind(self, size: int, records: int) -> None:
        """Drop what a failed or discarded video wrote."""
        with storing("truncating", self.tmp):
            self.fh.flush()
            self.fh.truncate(size)
            self.fh.seek(size)
        self.size = size
        del self.index[records:]

    def close(self) -> None:
        with storing("closing", self.tmp):
            self.fh.close()


class TFRecordWriter(ShardWriter):
    """Writes a shard's parts; a part is committed (and survives kill -9) once it is closed."""

    backend = "tfrecord"

    def __init__(self, *, path: str, codec: str, meta: dict, options: TFRecordOptions | None = None) -> None:
        super().__init__(path=path, codec=codec, meta=meta, options=options)
        self.options = options or TFRecordOptions()
        make_folder(path)
        self._log = PartLog(path)
        meta_path = os.path.join(path, META_FILE)
        try:
            stored = read_json_file(meta_path, "shard metadata") if os.path.lexists(meta_path) else None
            with storing("listing the parts of", path):
                self._parts = self._log.committed()
            self._done = {vid: rec for vid, (rec, _, _) in latest_records(self._parts, path).items()}
        except FormatError as exc:
            raise ShardDamaged(f"{path}: cannot be opened: {exc}") from exc
        if stored is None:
            write_json_atomic(meta_path, meta, sync=False, sort_keys=True)
        else:
            self.check_meta(stored)
        with storing("listing the parts of", path):
            self._log.discard_uncommitted(self._parts)  # an unfinished part: its videos are converted again
        self._open: _OpenPart | None = None

    def done_records(self) -> dict[str, VideoRecord]:
        return dict(self._done)

    def _part(self) -> _OpenPart:
        if self._open is None:
            self._open = _OpenPart(self._log, PartLog.next_number(self._parts))
        return self._open

    def write_video(self, video_id: str, label: int, produce: Callable[[], ClipProducer],
                    estimate_bytes: int) -> VideoRecord:
        part = self._part()
        size, records = part.size, len(part.index)
        gen = produce()

        def put(_: int, header: bytes, payload: bytes | memoryview) -> None:
            head = unpack_header(header)
            features = clip_features(header, payload, self.codec.parts(payload, head.shape), head)
            part.append(frame_record(*encode_example(features)))

        try:
            # An OSError from anywhere in here is the machine's (the producer reports what the decoder says
            # about the video as its record): nothing of the video is committed, the job stops.
            with storing("writing shard", self.path):
                record = self.drain(video_id, label, gen, put)
            if record.clips == 0:
                part.rewind(size, records)  # keep none of it (skip policy, or nothing usable): only the record
        except BaseException as exc:
            gen.close()
            try:
                part.rewind(size, records)
            except StoreError:
                if not isinstance(exc, StoreError):
                    raise
            raise
        part.videos.append(record)
        self._done[video_id] = record
        if part.size >= self.options.part_bytes:
            self._close_part()
        return record

    def _close_part(self) -> None:
        """Index, rename and commit the open part (the commit file is written last)."""
        part, self._open = self._open, None
        if part is None:
            return
        part.close()
        n = part.number
        if part.index:
            idx = self._log.file(n, INDEX)
            with storing("writing", idx + ".tmp"):
                with open(idx + ".tmp", "w") as fh:
                    fh.writelines(f"{off} {length}\n" for off, length in part.index)
            self._log.publish(n, INDEX)
            self._log.publish(n, DATA)
        else:
            self._log.remove(part.tmp)  # only records of videos without clips: no record file
        self._parts.append(self._log.commit(n, {"records": len(part.index), "bytes": part.size}, part.videos))

    def forget_video(self, video_id: str) -> None:
        rec = self._done.get(video_id)
        if rec is None:
            return
        done = os.path.join(self.path, COMPLETE_FILE)
        if os.path.lexists(done):
            self._log.remove(done)
        if rec.clips:
            raise ValueError(f"{self.path}: {video_id} has clips; only videos without clips can be converted again")
        for commit in self._parts:
            kept = [v for v in commit["videos"] if v["video_id"] != video_id]
            if len(kept) != len(commit["videos"]):
                commit["videos"] = kept
                self._log.rewrite(commit)
        del self._done[video_id]

    def complete_record(self) -> dict | None:
        path = os.path.join(self.path, COMPLETE_FILE)
        return read_json_file(path, "shard summary") if os.path.lexists(path) else None

    def finish(self) -> dict:
        summary = self.complete_record()
        if summary is not None:
            return summary
        self._close_part()
        # Durable before the summary says so (parts were not synced one by one:
        # kill -9 leaves the page cache intact, and only a machine crash
        # could lose them, which a rerun redoes).
        with storing("listing the parts of", self.path):
            names = sorted(os.listdir(self.path))
        for name in names:
            fsync_path(os.path.join(self.path, name))
        with storing("reading back", self.path):
            return self._summarize()

    def _summarize(self) -> dict:
        """Count, sum and checksum what the shard holds, read back as a reader sees it; write the summary."""
        reader = TFRecordReader(self.path)
        try:
            summary = {**read_back_summary(reader), "files": reader.files()}
        finally:
            reader.close()
        write_json_atomic(os.path.join(self.path, COMPLETE_FILE), summary, sync=False, sort_keys=True)
        fsync_path(self.path)
        return summary

    def close(self) -> None:
        if self._open is not None:
            # An open part is never committed on close: only finish() and a
            # full part commit. Its videos are converted again on a rerun.
            part, self._open = self._open, None
            part.close()


__all__ = ["TFRecordWriter"]
