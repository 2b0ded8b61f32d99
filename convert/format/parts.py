"""The append-only part protocol: how a backend whose files cannot be rewritten commits videos.

A shard of such a backend (TFRecord) is a folder of numbered **parts**. A
part's data files are written under temporary names (``<name>.tmp``), renamed
to their own names when the part closes, and the part's **commit**
(``part-NNNNN.json``: its number, its data files' summary and its video
records) is written last, atomically. After a kill at any moment a part is
either committed, with every file in place, or not there at all: a writer
reopening the shard deletes whatever belongs to no commit, and its videos are
converted again. Parts are ordered by number, never by name (``part-100000``
sorts before ``part-99999`` as text), and a later part's record of a video
overrides an earlier one's.

Every file operation runs inside ``storing``: a failure of the machine is a
``StoreError`` naming the file, never a property of a video.
"""

from __future__ import annotations

import os
import re
from typing import Any

from .errors import FormatError, storing
from .layout import read_json_file, write_json_atomic
from .records import VideoRecord

COMMIT = "json"
_PART = re.compile(r"part-(\d{5,})\.([a-z0-9]+)(\.tmp)?$")


def part_name(number: int, ext: str) -> str:
    """``part-NNNNN.<ext>``: the number in decimal, at least five digits."""
    return f"part-{number:05d}.{ext}"


def fsync_path(path: str) -> None:
    """fsync a file or folder (a folder: its entries, after renames)."""
    with storing("syncing", path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class PartLog:
    """The committed parts of one shard folder, and the operations of the protocol on them."""

    def __init__(self, path: str) -> None:
        self.path = path

    def file(self, number: int, ext: str) -> str:
        return os.path.join(self.path, part_name(number, ext))

    def committed(self) -> list[dict]:
        """The commits present, in part order, each checked to name its own number and list video records."""
        found = []
        for name in os.listdir(self.path):
            m = _PART.match(name)
            if m and m.group(2) == COMMIT and not m.group(3):
                found.append((int(m.group(1)), name))
        commits = []
        for number, name in sorted(found):
            where = os.path.join(self.path, name)
            commit = read_json_file(where, "part commit")
            if not isinstance(commit, dict) or commit.get("part") != number:
                got = commit.get("part") if isinstance(commit, dict) else type(commit).__name__
                raise FormatError(f"{where}: says part {got}")
            if not isinstance(commit.get("videos"), list):
                raise FormatError(f"{where}: lacks its list of video records")
            commits.append(commit)
        return commits

    def discard_uncommitted(self, committed: list[dict]) -> None:
        """Delete every part file that no commit covers, and every temporary file (an unfinished part)."""
        numbers = {c["part"] for c in committed}
        for name in os.listdir(self.path):
            m = _PART.match(name)
            if m and (int(m.group(1)) not in numbers or m.group(3)):
                where = os.path.join(self.path, name)
                with storing("removing the unfinished part file", where):
                    os.remove(where)

    @staticmethod
    def next_number(committed: list[dict]) -> int:
        return committed[-1]["part"] + 1 if committed else 0

    def publish(self, number: int, ext: str) -> None:
        """Give part ``number``'s finished ``.tmp`` data file its own name."""
        final = self.file(number, ext)
        with storing("renaming", final + ".tmp"):
            os.replace(final + ".tmp", final)

    def commit(self, number: int, fields: dict[str, Any], videos: list[VideoRecord]) -> dict:
        """Write part ``number``'s commit (last, atomically); returns it."""
        commit = {"part": number, **fields, "videos": [rec.to_dict() for rec in videos]}
        write_json_atomic(self.file(number, COMMIT), commit, sync=False, sort_keys=True)
        return commit

    def rewrite(self, commit: dict) -> None:
        """Replace a committed part's commit (a video dropped from its records), atomically."""
        write_json_atomic(self.file(commit["part"], COMMIT), commit, sync=False, sort_keys=True)

    def remove(self, path: str) -> None:
        with storing("removing", path):
            os.remove(path)


def latest_records(committed: list[dict], where: str) -> dict[str, tuple[VideoRecord, int, int]]:
    """Per video id: its record, the part holding it and its first record number there (later parts win)."""
    by_id: dict[str, tuple[VideoRecord, int, int]] = {}
    for commit in committed:
        first = 0
        for raw in commit["videos"]:
            rec = VideoRecord.from_dict(raw, where)
            by_id[rec.video_id] = (rec, commit["part"], first)
            first += rec.clips
    return by_id


__all__ = ["COMMIT", "PartLog", "fsync_path", "latest_records", "part_name"]
