"""The tar backend's two files, its index (what it holds, how it is checked) and its ``ShardFiles``."""

from __future__ import annotations

import os
import re
from typing import Any

from convert.format.base import ShardFiles, ShardIndex
from convert.format.errors import FormatError
from convert.format.layout import read_json_file
from convert.format.records import VideoRecord, sort_records

DATA_FILE = "clips.tar"
INDEX_FILE = DATA_FILE + ".index"
BLOCK = 512  # a tar archive is made of 512-byte blocks: each member's header, its data padded to a whole block
END = bytes(2 * BLOCK)  # the end-of-archive marker, written once the shard is finished

# Where a clip lies in the archive: the first byte of its value (after its member's header) and its length.
Entry = tuple[int, int]


class Index:
    """The checked content of ``clips.tar.index``.

    ``state`` is the JSON object as stored: ``meta`` (the shard metadata),
    ``bytes`` (the committed length of the archive, its end marker not
    counted), ``videos`` (the video records in commit order), ``clips``
    (``[video id, clip index, offset, size]`` in archive order) and
    ``complete`` (the summary once the shard is finished, else null).
    """

    def __init__(self, state: dict[str, Any], where: str) -> None:
        self.state = state
        if not isinstance(state, dict) or not isinstance(state.get("meta"), dict):
            raise FormatError(f"{where}: not a tar shard index (no metadata object)")
        size, videos, clips = state.get("bytes"), state.get("videos"), state.get("clips")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0 or size % BLOCK:
            raise FormatError(f"{where}: committed length {size!r} is not a whole number of {BLOCK}-byte blocks")
        if not isinstance(videos, list) or not isinstance(clips, list):
            raise FormatError(f"{where}: lacks its list of video records or of clips")
        complete = state.get("complete")
        if complete is not None and not isinstance(complete, dict):
            raise FormatError(f"{where}: its summary is a {type(complete).__name__}, not an object")
        self.records = sort_records([VideoRecord.from_dict(raw, where) for raw in videos])
        self.entries: dict[tuple[str, int], Entry] = {}
        end = 0
        for item in clips:
            if not (isinstance(item, list) and len(item) == 4 and isinstance(item[0], str)
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in item[1:])):
                raise FormatError(f"{where}: clip entry {_short(item)} is not [video id, clip index, offset, size]")
            vid, clip, offset, length = item
            if offset < end + BLOCK or offset % BLOCK or length < 0 or offset + length > size:
                raise FormatError(f"{where}: clip entry {_short(item)} lies outside the committed archive or "
                                  f"out of order")
            self.entries[(vid, clip)] = (offset, length)
            end = offset + length
        held = {(r.video_id, c) for r in self.records for c in range(r.clips)}
        if held != set(self.entries) or len(self.entries) != len(clips):
            raise FormatError(f"{where}: its {len(clips)} clip entries disagree with its video records, which "
                              f"count {len(held)} clips")

    @property
    def meta(self) -> dict:
        return self.state["meta"]

    @property
    def size(self) -> int:
        return self.state["bytes"]

    @property
    def complete(self) -> dict | None:
        return self.state.get("complete")

    def storage_order(self) -> list[str]:
        """Ids of the videos with clips, in the order their clips lie in the archive."""
        return sorted((r.video_id for r in self.records if r.clips),
                      key=lambda vid: self.entries[(vid, 0)][0])


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_index(path: str) -> Index:
    """The index of the shard folder ``path``, checked; FormatError naming the file when it is not one."""
    where = os.path.join(path, INDEX_FILE)
    return Index(read_json_file(where, "tar shard index"), where)


def shard_index(path: str) -> ShardIndex:
    """(metadata, video records, storage order) from the index file alone: the archive is not needed."""
    index = read_index(path)
    return index.meta, index.records, index.storage_order()


FILES = ShardFiles(data=(re.escape(DATA_FILE), re.escape(INDEX_FILE)), index=(re.escape(INDEX_FILE),),
                   indexer=shard_index)

__all__ = ["BLOCK", "DATA_FILE", "END", "FILES", "INDEX_FILE", "Index", "read_index", "shard_index"]
