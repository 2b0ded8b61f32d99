"""What the parts of the shard cache share: its folder's names, lock files and holds, atomic writes, its errors."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from convert.format.errors import FormatError, machine_cause

from ..remote import RemoteError

# The mirror's own folders and files, beside the conversion's (FORMAT.md's names never start with '.').
INDEX_DIR = ".index"
LOCK_DIR = ".locks"
RESERVE_DIR = ".reserve"
WANTED_DIR = ".wanted"
CACHE_LOCK = ".cache.lock"
DOWNLOAD_LOG = "downloads.log"
GENERATION = "generation"  # the checksum of the manifest whose shards the mirror holds


class CacheFullError(RemoteError):
    """The cache cannot take a shard: its limit is held by shards in use, or its disk is full."""


class CacheDiskError(RemoteError):
    """The cache folder cannot be used: its disk is full (of bytes or of files), read-only, failing, or another
    user's. A problem of the machine, named with the folder and the real cause."""


F = TypeVar("F", bound=Callable[..., Any])


def cache_disk(method: F) -> F:
    """A failure of the cache's own disk inside ``method`` is one ``CacheDiskError`` naming the cache folder and the
    cause (``machine_cause``), never a bare OSError; errors of the URL and of the data pass as they are."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (RemoteError, FormatError):
            raise
        except OSError as exc:
            folder = str(getattr(self, "dir", None) or getattr(self, "_base", ""))
            raise CacheDiskError(f"the shard cache {folder}: {machine_cause(exc, folder)}") from exc

    return wrapper  # type: ignore[return-value]


def open_lock(path: str) -> int:
    """A descriptor of lock file ``path`` (made if absent), not inherited by child processes."""
    return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)


@contextlib.contextmanager
def flock(path: str, how: int) -> Iterator[int]:
    """Lock file ``path`` locked ``how`` (``fcntl.LOCK_SH``/``LOCK_EX``) for the block."""
    fd = open_lock(path)
    try:
        fcntl.flock(fd, how)
        yield fd
    finally:
        os.close(fd)  # closing drops the lock


def try_exclusive(path: str) -> int | None:
    """An exclusive lock on ``path`` taken without waiting (its fd), or None when someone holds it."""
    fd = open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def write_atomic(path: str, data: bytes) -> None:
    """``data`` into file ``path``, renamed into place: a reader sees the old file or the new, never a part."""
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def lock_path(mirror: str, name: str) -> str:
    """Shard ``name``'s lock file in the mirror at ``mirror``: held shared by its readers, exclusive by its download
    or eviction."""
    return os.path.join(mirror, LOCK_DIR, f"{name}.lock")


class Hold:
    """A reader's hold on a cached shard (a shared lock): the shard is not evicted until ``release()``."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.release()


__all__ = ["CACHE_LOCK", "DOWNLOAD_LOG", "GENERATION", "INDEX_DIR", "LOCK_DIR", "RESERVE_DIR", "WANTED_DIR",
           "CacheDiskError", "CacheFullError", "Hold", "cache_disk", "flock", "lock_path", "open_lock", "try_exclusive",
           "write_atomic"]
