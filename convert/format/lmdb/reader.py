"""The LMDB reader: a finished shard through this process's shared read-only handle."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Generator, Iterator, Sequence
from typing import Any, cast

import lmdb

from ..base import ShardReader, changed_error, file_identity
from ..errors import FormatError, ShardMissing
from ..layout import MAX_JSON_BYTES, ClipHeader, unpack_header
from ..records import VideoRecord
from .common import (
    COMPLETE_KEY,
    DATA_FILE,
    HANDLES,
    INDEX_FILE,
    ORDER_KEY,
    SHARD_KEY,
    clip_key,
    clip_key_count,
    index_bytes,
    read_records,
)


class LmdbReader(ShardReader):
    """A finished LMDB shard through this process's shared read-only handle."""

    backend = "lmdb"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._opened = False
        if not os.path.exists(os.path.join(path, DATA_FILE)):
            raise ShardMissing(f"{path}: shard missing (no {DATA_FILE})")
        self._env(acquire=True)  # open now: a missing or damaged shard fails here, not mid-epoch
        self._opened = True  # close() releases it: the handle closes with the last reader using it
        try:
            self._index()
        except BaseException:
            self.close()
            raise

    def _index(self) -> None:
        path = self.path
        data = os.path.join(path, DATA_FILE)
        self._identity = file_identity(data)
        self.file_size = os.path.getsize(data)
        with self._reading(), self._txn() as txn:
            self._meta: dict | None = self._json(txn, SHARD_KEY, "shard metadata")
            self._complete: dict | None = self._json(txn, COMPLETE_KEY, "shard summary")
            order = self._json(txn, ORDER_KEY, "storage order")
        if order is not None and not (isinstance(order, list) and all(isinstance(v, str) for v in order)):
            raise FormatError(f"{path}: m/order is not a list of video ids")
        self._order: list[str] | None = order

    def _json(self, txn: lmdb.Transaction, key: bytes, what: str) -> Any:
        raw = txn.get(key)
        if raw is None:
            return None
        if len(raw) > min(MAX_JSON_BYTES, self.file_size):
            raise FormatError(f"{self.path}: {key.decode()} claims {len(raw)} bytes (damaged page?)")
        try:
            return json.loads(bytes(raw))
        except (ValueError, RecursionError) as exc:
            raise FormatError(f"{self.path}: the {what} ({key.decode()}) is not valid JSON: {exc}") from exc

    def _env(self, *, acquire: bool = False) -> lmdb.Environment:
        # Asked of the process-wide cache on every use, never kept: a reader
        # that crossed a fork (DataLoader and DALI workers) must not use the
        # handle its parent had open.
        try:
            return HANDLES.acquire(self.path) if acquire else HANDLES.get(self.path)
        except (OSError, lmdb.Error) as exc:
            raise FormatError(str(exc) if isinstance(exc, OSError) else f"{self.path}: shard cannot be opened: "
                              f"{exc}") from exc

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Any LMDB error inside (a damaged page, tree or meta page) as one FormatError naming the shard."""
        try:
            yield
        except lmdb.Error as exc:
            raise FormatError(f"{self.path}: read failed: {type(exc).__name__}: {exc}") from exc

    def _txn(self) -> lmdb.Transaction:
        with self._reading():
            return self._env().begin(buffers=True)

    @property
    def meta(self) -> dict | None:
        # Version 1 stored only {"codec": name} under m/shard.
        return self._meta if isinstance(self._meta, dict) and "format_version" in self._meta else None

    def complete(self) -> dict | None:
        return self._complete

    def records(self) -> list[VideoRecord]:
        # Read afresh on every call, never kept: a store indexes them once into arrays, and a reader held for a
        # whole run would otherwise keep a Python object per video of its shard (a reader process's largest heap).
        with self._reading(), self._txn() as txn:
            return read_records(txn, self.path, self.file_size)

    def storage_order(self) -> list[str] | None:
        return self._order

    def _value(self, txn: lmdb.Transaction, video_id: str, clip_index: int) -> tuple[memoryview, ClipHeader]:
        """(header, payload view) of one clip; its stored length checked before anything past the header is read."""
        # The transactions here are begun with buffers=True: LMDB hands out views of its mapped pages.
        value = cast("memoryview | None", txn.get(clip_key(video_id, clip_index)))
        if value is None:
            raise FormatError(f"{self.where(video_id, clip_index)}: missing")
        if len(value) > self.file_size:
            raise FormatError(f"{self.where(video_id, clip_index)}: value claims {len(value)} bytes, more than the "
                              f"{self.file_size}-byte file (damaged page?)")
        try:
            header = unpack_header(value, value_len=len(value))
        except FormatError as exc:
            raise FormatError(f"{self.where(video_id, clip_index)}: {exc}") from exc
        if (header.video_id, header.clip_index) != (video_id, clip_index):
            raise FormatError(f"{self.where(video_id, clip_index)}: header says {header.video_id!r} clip "
                              f"{header.clip_index}")
        return value, header

    def check_unchanged(self) -> None:
        if file_identity(os.path.join(self.path, DATA_FILE)) != self._identity:
            raise changed_error(self.path)

    def read(self, clips: Sequence[tuple[str, int]]) -> Generator[tuple[int, ClipHeader, memoryview], None, None]:
        self.check_unchanged()
        with self._reading(), self._txn() as txn:
            for pos, (vid, c) in enumerate(clips):
                value, header = self._value(txn, vid, c)
                yield pos, header, value[header.offset:]

    def iter_clips(self) -> Iterator[tuple[memoryview | bytes, ClipHeader, memoryview]]:
        self.check_unchanged()
        with self._reading(), self._txn() as txn:
            for rec in self.records():
                for c in range(rec.clips):
                    value, header = self._value(txn, rec.video_id, c)
                    yield value[:header.offset], header, value[header.offset:]

    def clip_keys(self) -> int:
        """Number of ``c/`` keys actually stored (verify compares it with the records)."""
        with self._reading(), self._txn() as txn:
            return clip_key_count(txn)

    def check_storage(self) -> list[str]:
        records = self.records()
        held, stored = sum(r.clips for r in records), self.clip_keys()
        problems = [] if held == stored else [f"{self.path}: video records count {held} clips, shard holds {stored}"]
        # The index file (absent in shards written before it) must say what the data says: a remote shard is
        # indexed from it alone.
        index = os.path.join(self.path, INDEX_FILE)
        if os.path.lexists(index):
            try:
                with open(index, "rb") as f:
                    same = f.read() == index_bytes(self._meta, records, self._order)
            except OSError as exc:
                problems.append(f"{index}: cannot be read: {exc.strerror}")
            else:
                if not same:
                    problems.append(f"{index}: the shard's index file differs from what data.mdb holds (metadata, "
                                    f"video records, storage order)")
        return problems

    def where(self, video_id: str, clip_index: int) -> str:
        return f"{self.path}: {clip_key(video_id, clip_index).decode(errors='replace')}"

    def close(self) -> None:
        if self._opened:
            self._opened = False
            HANDLES.release(self.path)


__all__ = ["LmdbReader"]
