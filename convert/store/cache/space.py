"""The shard cache's space accounting: what the cache holds, reservations, eviction, the shards the node wants.

``Space`` counts the bytes of one mirror's shards against its limit.
Before a download, room is reserved under the cache lock (a reservation file
per download, dropped when its download dies); the least recently used
shards that no reader holds are evicted until it fits, those some process of
the node wants (``want``) last. ``mirrors_bytes`` counts what the other
mirrors under the same cache root hold, so that two URLs cached side by side
never overcommit one disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable, Collection, Sequence

from convert.format.layout import SHARD_DIR

from .common import (
    CACHE_LOCK,
    GENERATION,
    RESERVE_DIR,
    WANTED_DIR,
    CacheFullError,
    flock,
    lock_path,
    open_lock,
    try_exclusive,
    write_atomic,
)
from .settings import DEFAULT_FRACTION


def mirrors_bytes(base: str, *, skip: str) -> int:
    """Bytes of the shards held by the mirrors under cache root ``base`` but ``skip`` (files under their shard
    folders; temporary ones included, as they take room too)."""
    total = 0
    try:
        mirrors = [e.path for e in os.scandir(base) if e.is_dir(follow_symlinks=False) and e.path != skip
                   and os.path.exists(os.path.join(e.path, GENERATION))]
    except FileNotFoundError:
        return 0
    for mirror in mirrors:
        for dirpath, _, names in os.walk(os.path.join(mirror, SHARD_DIR)):
            for name in names:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, name)).st_size
    return total




class Space:
    """The room of one mirror (folder ``dir``, under cache root ``base``): its shards' ``names``, local ``paths``,
    ``urls`` (how errors name them) and ``sizes``; ``limit`` bytes in all, set once known (``default_limit``)."""

    def __init__(self, *, dir: str, base: str, names: Sequence[str], paths: Sequence[str], urls: Sequence[str],
                 sizes: Sequence[int], wait_s: float) -> None:
        self.dir, self.base = dir, base
        self.names, self.paths, self.urls, self.sizes = list(names), list(paths), list(urls), list(sizes)
        self.wait_s = wait_s
        self.limit = 0
        self._wanted_fd: int | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_wanted_fd": None}  # this process's declaration of wanted shards stays its own

    def default_limit(self) -> int:
        """DEFAULT_FRACTION of what the cache root's disk can give every mirror under it (its free space plus what
        they hold), less what the other mirrors hold: two URLs cached side by side never overcommit the disk."""
        others = mirrors_bytes(self.base, skip=self.dir)
        budget = int((shutil.disk_usage(self.dir).free + self.held_bytes() + others) * DEFAULT_FRACTION)
        return max(0, budget - others)

    def lock_path(self, index: int) -> str:
        """Shard ``index``'s lock file (``common.lock_path``)."""
        return lock_path(self.dir, self.names[index])

    def present(self, index: int) -> bool:
        """Whether shard ``index`` is in the cache, whole and verified."""
        return os.path.isdir(self.paths[index])

    def held_bytes(self) -> int:
        """Bytes of the shards in the cache now."""
        return sum(self.sizes[i] for i in range(len(self.sizes)) if self.present(i))

    def release(self, index: int) -> None:
        """Drop shard ``index``'s reservation (its download ended, arrived or not)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.dir, RESERVE_DIR, self.names[index]))

    def reserve(self, index: int, *, wait: bool, before_wait: Callable[[], None] | None) -> bool:
        """Room for shard ``index`` within the limit, evicting LRU shards no reader holds; False if none (no wait)."""
        name = self.names[index]
        size = self.sizes[index]
        deadline = time.monotonic() + self.wait_s
        waited = False
        while True:
            with flock(os.path.join(self.dir, CACHE_LOCK), fcntl.LOCK_EX):
                # Reservations first: a download that finishes meanwhile renames its shard into place before
                # it drops its reservation, so it is counted once or twice, never missed.
                reserved = self.reserved()
                used = reserved + self.held_bytes()
                if used + size > self.limit:
                    wanted = self.wanted()
                    keep = {index, *(wanted if not wait else ())}
                    used -= self.evict(used + size - self.limit, keep=keep, later=wanted)
                if used + size <= self.limit:
                    write_atomic(os.path.join(self.dir, RESERVE_DIR, name), str(size).encode())
                    return True
            if not wait:
                return False
            if not waited and before_wait is not None:
                before_wait()
                waited = True
                continue
            if time.monotonic() > deadline:
                raise CacheFullError(f"{self.urls[index]}: the cache {self.dir} (limit {self.limit} bytes) "
                                     f"cannot take this shard ({size} bytes): {used} bytes are held by readers "
                                     f"or downloads; raise --cache-limit")
            time.sleep(0.05)

    def reserved(self) -> int:
        """Bytes reserved by downloads in progress; a reservation whose download died is dropped."""
        total = 0
        folder = os.path.join(self.dir, RESERVE_DIR)
        for name in os.listdir(folder):
            fd = try_exclusive(lock_path(self.dir, name))
            if fd is not None:  # nobody downloads it: stale
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, name))
                continue
            with contextlib.suppress(FileNotFoundError, ValueError), open(os.path.join(folder, name)) as f:
                total += int(f.read() or 0)
        return total

    def evict(self, need: int, *, keep: Collection[int], later: Collection[int] = ()) -> int:
        """Evict least recently used shards no reader holds, but those in ``keep``, until ``need`` bytes are freed;
        those in ``later`` only when the others do not free enough."""
        candidates = []
        for i in range(len(self.sizes)):
            if i not in keep and self.present(i):
                try:
                    candidates.append((i in later, os.path.getmtime(self.lock_path(i)), i))
                except FileNotFoundError:
                    candidates.append((i in later, 0.0, i))
        freed = 0
        for _, _, i in sorted(candidates):
            if freed >= need:
                break
            fd = try_exclusive(self.lock_path(i))
            if fd is None:
                continue  # a reader holds it (or it is being fetched)
            try:
                final = self.paths[i]
                gone = os.path.join(os.path.dirname(final), f".evict-{self.names[i]}-{os.getpid()}")
                os.rename(final, gone)  # at once absent for every process, then removed at leisure
                shutil.rmtree(gone, ignore_errors=True)
                freed += self.sizes[i]
            except FileNotFoundError:
                pass
            finally:
                os.close(fd)
        return freed

    def _wanted_paths(self) -> tuple[str, str]:
        tag = f"{os.getpid()}-{id(self):x}"
        folder = os.path.join(self.dir, WANTED_DIR)
        return os.path.join(folder, f"{tag}.lock"), os.path.join(folder, f"{tag}.json")

    def want(self, shards: Collection[int]) -> None:
        """Declare the shards this reader reads now or next, for every process of the node.

        A shard some process wants is evicted only when no other shard frees
        the room (and never by a prefetch): with a shard-windowed order the
        shards of the window being read, and the next ones fetched, stay, so
        each is downloaded once per epoch. The declaration lasts until the next
        call or the process's end (its lock file is held meanwhile).
        """
        lock, data = self._wanted_paths()
        while self._wanted_fd is None:
            fd = open_lock(lock)
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                same = os.stat(lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._wanted_fd = fd
            else:  # removed as stale between its creation and our lock: make it again
                os.close(fd)
        write_atomic(data, json.dumps(sorted({int(s) for s in shards})).encode())

    def unwant(self) -> None:
        """End this reader's declaration (``want``)."""
        fd, self._wanted_fd = self._wanted_fd, None
        if fd is None:
            return
        for path in self._wanted_paths()[::-1]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        os.close(fd)

    def wanted(self) -> set[int]:
        """The shards some live process of the node wants (``want``); declarations of ended processes are removed."""
        folder = os.path.join(self.dir, WANTED_DIR)
        out: set[int] = set()
        for name in os.listdir(folder):
            if not name.endswith(".lock"):
                continue
            lock = os.path.join(folder, name)
            data = lock[:-len(".lock")] + ".json"
            fd = try_exclusive(lock)
            if fd is not None:  # its process has ended (or not declared yet: then it has nothing to lose)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(data)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(lock)
                os.close(fd)
                continue
            with contextlib.suppress(FileNotFoundError, ValueError), open(data) as f:
                out.update(int(s) for s in json.load(f) if 0 <= int(s) < len(self.sizes))
        return out



__all__ = ["Space", "mirrors_bytes"]
