"""The local shard cache of a conversion at a URL: ``ShardCache(url, CacheSettings(...))``.

A remote conversion is read through a local folder that mirrors its layout
(``manifest.json``, ``plan.json``, ``shards/<name>/``): the readers then open
ordinary local shards, and DALI's reader ordinary local TFRecord files.

- **Whole shards, verified on arrival.** A shard is downloaded into a
  temporary folder, checked against the manifest (sizes, every count, the
  shard metadata, every payload's CRC-32 and the shard checksum: the shard
  verifier's check, ``verify_shard``), and renamed into place only then; a
  reader never opens a half-downloaded or unchecked shard.
- **Shared by the processes of a node.** Each shard has a lock file: a
  reader holds it shared while the shard is open, a download holds it
  exclusive, so one download serves every rank and worker of the node, and a
  crashed download (its lock released by the kernel) leaves only a temporary
  folder that the next download removes.
- **Bounded.** ``limit`` bytes in all; before a download, the least recently
  used shards that no reader holds are evicted until it fits. A download that
  cannot fit waits for readers to let go, up to ``wait_s``, then fails in one
  line.
- **Errors** name the URL and the reason: a missing object, a truncated one,
  a checksum mismatch (``FormatError``); an unreachable endpoint, missing
  credentials, a full disk (``RemoteError``). Transient errors are retried
  with backoff (``remote.retried``).

``Prefetcher`` fetches, in the background, the shards a reading order will
need next. The index a reader needs at open (each shard's metadata and video
records) is kept beside the shards, small, so that it survives eviction and
later opens need no download.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .backends import get_backend
from .errors import FormatError, ShardMissing, device_room, machine_cause
from .layout import MANIFEST, MAX_JSON_BYTES, PLAN, SHARD_DIR, inside
from .manifest import Manifest, check_plan
from .records import VideoRecord, sort_records
from .remote import ATTEMPTS, BACKOFF_S, Remote, RemoteError, check_url, read_remote_json
from .system import cpu_count

# The default limit: this fraction of the cache disk's free space (plus what the cache already holds), so that
# the cache never fills a disk other programs write to.
DEFAULT_FRACTION = 0.8
INDEX_DIR = ".index"
LOCK_DIR = ".locks"
RESERVE_DIR = ".reserve"
WANTED_DIR = ".wanted"
DOWNLOAD_LOG = "downloads.log"
GENERATION = "generation"  # the checksum of the manifest whose shards the mirror holds


def default_cache_dir() -> str:
    """The user's cache folder for shards: ``$XDG_CACHE_HOME/videoclips`` (``~/.cache/videoclips``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "videoclips")


class CacheFullError(RemoteError):
    """The cache cannot take a shard: its limit is held by shards in use, or its disk is full."""


class CacheDiskError(RemoteError):
    """The cache folder cannot be used: its disk is full (of bytes or of files), read-only, failing, or another
    user's. A problem of the machine, named with the folder and the real cause."""


F = TypeVar("F", bound=Callable[..., Any])


def _cache_disk(method: F) -> F:
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


@dataclass(frozen=True)
class CacheSettings:
    """How a remote conversion is cached (``open_clips(url, cache=...)``, the trainer's ``--cache-*``).

    ``cache_dir``: where (default ``default_cache_dir()``); ``limit``: bytes
    the cache may hold (default DEFAULT_FRACTION of its disk's free space);
    ``prefetch``: shards fetched ahead of the reading; ``downloads``: shards
    downloaded at once; ``attempts``/``backoff``: the retry loop of each
    transfer; ``wait_s``: how long a download waits for readers to release
    room; ``storage_options``: passed to fsspec (an endpoint, a profile...).
    """

    cache_dir: str | None = None
    limit: int | None = None
    prefetch: int = 2
    downloads: int = 4
    attempts: int = ATTEMPTS
    backoff: float = BACKOFF_S
    wait_s: float = 600.0
    storage_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, low in (("prefetch", 0), ("downloads", 1), ("attempts", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"cache {name} must be an integer >= {low}, got {value!r}")
        if self.limit is not None and (isinstance(self.limit, bool) or not isinstance(self.limit, int)
                                       or self.limit < 1):
            raise ValueError(f"cache limit must be a number of bytes >= 1, got {self.limit!r}")
        for name in ("backoff", "wait_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"cache {name} must be a number >= 0, got {value!r}")
        if not isinstance(self.storage_options, dict):
            raise ValueError(f"storage_options must be a dict, got {type(self.storage_options).__name__}")


def _mirrors_bytes(base: str, *, skip: str) -> int:
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


def _open_lock(path: str) -> int:
    """A descriptor of lock file ``path`` (made if absent), not inherited by child processes."""
    return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)


@contextlib.contextmanager
def _flock(path: str, how: int) -> Iterator[int]:
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, how)
        yield fd
    finally:
        os.close(fd)  # closing drops the lock


def _try_exclusive(path: str) -> int | None:
    """An exclusive lock on ``path`` taken without waiting (its fd), or None when someone holds it."""
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


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


@dataclass(frozen=True)
class ShardSummary:
    """What a reader needs of a shard at open, kept in the cache's index: metadata, records, storage order."""

    meta: dict | None
    records: list[VideoRecord]
    storage_order: list[str] | None
    bytes: int


class ShardCache:
    """The local mirror of the conversion at ``url`` (see the module docstring); picklable."""

    @_cache_disk
    def __init__(self, url: str, settings: CacheSettings | None = None) -> None:
        self.settings = settings = settings or CacheSettings()
        self.url = check_url(url)
        self.remote = Remote(self.url, storage_options=settings.storage_options, attempts=settings.attempts,
                             backoff=settings.backoff)
        self._base = base = os.path.abspath(settings.cache_dir or default_cache_dir())
        tail = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.url.split("://", 1)[-1])[-40:]
        self.dir = os.path.join(base, f"{hashlib.sha256(self.url.encode()).hexdigest()[:16]}-{tail}")
        for sub in (LOCK_DIR, INDEX_DIR, RESERVE_DIR, WANTED_DIR):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        raw, parsed = read_remote_json(self.remote, MANIFEST, "manifest")
        self.manifest = Manifest.from_dict(parsed, self.remote.join(MANIFEST))
        # The manifest's checksum ties the cached shards to the conversion they were verified against: a reader
        # finds out when another process of the node mirrors another conversion at the URL (``_same_conversion``).
        self.generation = hashlib.sha256(raw).hexdigest()
        with _flock(os.path.join(self.dir, ".cache.lock"), fcntl.LOCK_EX):
            self._mirror_metadata(raw)
            self._sweep()
        self.files = self._list_shards()
        self.sizes = [sum(f.values()) for f in self.files]
        self.limit = settings.limit if settings.limit is not None else self._default_limit()
        need = max(self.sizes, default=0) * (1 + settings.prefetch)
        if self.limit < need:
            room = shutil.disk_usage(self.dir).free + self.held_bytes()
            advice = (f"raise --cache-limit to {need} or more" if room >= need else
                      f"its disk can give only {room} bytes: give --cache-dir on a larger disk, or free this one")
            raise CacheFullError(f"{self.url}: cache limit {self.limit} bytes is smaller than the largest shard "
                                 f"({max(self.sizes)} bytes) times {1 + settings.prefetch} (one read, "
                                 f"{settings.prefetch} prefetched): {advice}")
        self.fetched = 0  # shards this process downloaded
        self.fetched_bytes = 0
        self._io_lock = threading.Lock()
        self._wanted_fd: int | None = None

    # -- the mirror's metadata ------------------------------------------------
    def _mirror_metadata(self, raw: bytes) -> None:
        """manifest.json (and plan.json) in the mirror; another conversion at the URL empties it first."""
        path = os.path.join(self.dir, MANIFEST)
        try:
            with open(path, "rb") as f:
                old = f.read()
        except FileNotFoundError:
            old = None
        if old is not None and old != raw:
            # The URL now holds another conversion (or another run of it): nothing cached is known to belong.
            for name in os.listdir(self.dir):
                if name not in (LOCK_DIR, ".cache.lock", RESERVE_DIR, WANTED_DIR):
                    full = os.path.join(self.dir, name)
                    shutil.rmtree(full) if os.path.isdir(full) else os.unlink(full)
            os.makedirs(os.path.join(self.dir, INDEX_DIR), exist_ok=True)
        try:
            plan = self.remote.read_bytes(PLAN, limit=MAX_JSON_BYTES)  # a longer one is refused when checked
        except ShardMissing:
            plan = None  # plan.json is optional (FORMAT.md)
        if plan is not None:
            self._write_atomic(os.path.join(self.dir, PLAN), plan)
        if old != raw:
            self._write_atomic(path, raw)
        if self._mirrored() != self.generation:
            self._write_atomic(os.path.join(self.dir, GENERATION), self.generation.encode())

    def _mirrored(self) -> str | None:
        """The checksum of the manifest the mirror holds shards of now (None before the first)."""
        try:
            with open(os.path.join(self.dir, GENERATION)) as f:
                return f.read().strip()
        except FileNotFoundError:
            return None

    def _same_conversion(self, index: int) -> None:
        """FormatError when the mirror now holds another conversion than the one this reader opened (another
        process opened the URL after it was overwritten): its shards are not this reader's to read or add to."""
        if self._mirrored() != self.generation:
            raise FormatError(f"{self.shard_url(index)}: the conversion at {self.url} changed since this reader "
                              f"opened it (another process of the node opened the new one through the cache "
                              f"{self.dir}); open it again")

    def _sweep(self) -> None:
        """Remove what killed processes left (under the cache lock, at open): a download's or an eviction's folder
        of a shard whose lock nobody holds, an indexing's folder whose process is gone. None of it is counted
        against the limit, so it must not stay."""
        for index, entry in enumerate(self.manifest.shards):
            parent = os.path.dirname(self.local_path(index))
            try:
                names = [n for n in os.listdir(parent) if n.startswith((f".tmp-{entry.name}-",
                                                                         f".evict-{entry.name}-"))]
            except FileNotFoundError:
                continue
            if not names:
                continue
            fd = _try_exclusive(self._lock_path(index))
            if fd is None:
                continue  # being downloaded or evicted right now
            try:
                for name in names:
                    shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            finally:
                os.close(fd)
        index_dir = os.path.join(self.dir, INDEX_DIR)
        for name in os.listdir(index_dir):
            if not name.startswith(".tmp-"):
                continue
            try:
                pid = int(name.rsplit("-", 2)[1])
                os.kill(pid, 0)
            except (ValueError, IndexError, ProcessLookupError):
                shutil.rmtree(os.path.join(index_dir, name), ignore_errors=True)
            except PermissionError:
                pass  # alive, another user's

    @staticmethod
    def _write_atomic(path: str, data: bytes) -> None:
        tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def _list_shards(self) -> list[dict[str, int]]:
        """Per shard: {file relative to its folder: size}, from one listing per folder of shards."""
        parents = sorted({os.path.dirname(s.path) for s in self.manifest.shards})
        listed: dict[str, int] = {}
        for parent in parents:
            for rel, size in self.remote.files(parent).items():
                listed[f"{parent}/{rel}" if parent else rel] = size
        out = []
        files = get_backend(self.manifest.data.backend).files
        for s in self.manifest.shards:
            prefix = s.path + "/"
            # Only the files the backend declares: any other object under the prefix (a stale part, a killed
            # upload's temporary, a key with '..' planted by whoever can write the bucket) is neither
            # downloaded nor counted.
            mine = {k[len(prefix):]: v for k, v in listed.items()
                    if k.startswith(prefix) and files.is_data(k[len(prefix):])}
            if not mine:
                raise ShardMissing(f"{self.remote.join(s.path)}: the manifest names shard {s.name}, no object "
                                   f"is there")
            out.append(mine)
        return out

    def _default_limit(self) -> int:
        """DEFAULT_FRACTION of what the cache root's disk can give every mirror under it (its free space plus what
        they hold), less what the other mirrors hold: two URLs cached side by side never overcommit the disk."""
        held = sum(self.sizes[i] for i in range(len(self.sizes)) if self.present(i))
        others = _mirrors_bytes(self._base, skip=self.dir)
        budget = int((shutil.disk_usage(self.dir).free + held + others) * DEFAULT_FRACTION)
        return max(0, budget - others)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_io_lock"]
        state["_wanted_fd"] = None  # this process's declaration of the shards it wants stays its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._io_lock = threading.Lock()

    # -- paths ----------------------------------------------------------------
    def local_path(self, index: int) -> str:
        """Where shard ``index`` lies in the mirror once fetched."""
        return os.path.join(self.dir, self.manifest.shards[index].path)

    def shard_url(self, index: int) -> str:
        return self.remote.join(self.manifest.shards[index].path)

    def _lock_path(self, index: int) -> str:
        return os.path.join(self.dir, LOCK_DIR, f"{self.manifest.shards[index].name}.lock")

    def present(self, index: int) -> bool:
        """Whether shard ``index`` is in the cache, whole and verified."""
        return os.path.isdir(self.local_path(index))

    def held_bytes(self) -> int:
        """Bytes of the shards in the cache now."""
        return sum(self.sizes[i] for i in range(len(self.sizes)) if self.present(i))

    # -- holding and fetching ---------------------------------------------------
    @_cache_disk
    def acquire(self, index: int, *, before_wait: Callable[[], None] | None = None) -> Hold:
        """Shard ``index`` in the cache (fetched now unless there) and held against eviction.

        ``before_wait`` is called when the download must wait for room (the
        caller's own idle shards can then be released).
        """
        lock = self._lock_path(index)
        while True:
            fd = _open_lock(lock)
            fcntl.flock(fd, fcntl.LOCK_SH)
            if self.present(index):
                try:
                    self._same_conversion(index)
                except FormatError:
                    os.close(fd)
                    raise
                os.utime(lock)  # its last use, for the LRU order
                return Hold(fd)
            os.close(fd)
            self.fetch(index, wait=True, before_wait=before_wait)

    @_cache_disk
    def fetch(self, index: int, *, wait: bool = True, before_wait: Callable[[], None] | None = None,
              on_reserved: Callable[[], None] | None = None) -> bool:
        """Download and verify shard ``index`` unless it is there; False when ``wait=False`` and there is no room.

        Room is made by evicting least recently used shards that no reader
        holds, those no process of the node wants (``want``) first;
        ``wait=False`` (a prefetch) evicts no wanted shard at all.
        ``on_reserved`` is called once the room is
        reserved (or the shard found there), before the download.
        """
        with _flock(self._lock_path(index), fcntl.LOCK_EX):
            if self.present(index):
                if on_reserved is not None:
                    on_reserved()
                return True
            entry = self.manifest.shards[index]
            final = inside(self.dir, entry.path, self.shard_url(index))
            parent = os.path.dirname(final)
            os.makedirs(parent, exist_ok=True)
            for name in os.listdir(parent):  # a download that died: ours to remove (we hold its lock)
                if name.startswith(f".tmp-{entry.name}-"):
                    shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            if not self._reserve(index, wait=wait, before_wait=before_wait):
                return False
            if on_reserved is not None:
                on_reserved()
            tmp = os.path.join(parent, f".tmp-{entry.name}-{os.getpid()}-{threading.get_ident()}")
            try:
                self._download(index, tmp)
                summary = self._verify(index, tmp)
                self._check_indexed(index, summary)
                with _flock(os.path.join(self.dir, ".cache.lock"), fcntl.LOCK_EX):
                    self._same_conversion(index)  # never a shard of the old conversion into a new one's mirror
                    os.rename(tmp, final)
                os.utime(self._lock_path(index))  # just arrived: the most recently used, for the LRU order
            except OSError as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise CacheFullError(f"{self.shard_url(index)}: no space left in the cache {self.dir} "
                                         f"({exc.strerror}: the device has {device_room(self.dir)}, the shard "
                                         f"needs {self.sizes[index]} bytes): free the disk or lower "
                                         f"--cache-limit") from exc
                raise
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.dir, RESERVE_DIR, entry.name))
            self._save_summary(index, summary)
            with self._io_lock:
                self.fetched += 1
                self.fetched_bytes += self.sizes[index]
            with open(os.path.join(self.dir, DOWNLOAD_LOG), "a") as f:
                f.write(f"{entry.name} {self.sizes[index]} {os.getpid()}\n")  # one write: O_APPEND keeps lines whole
            return True

    def _download(self, index: int, tmp: str) -> None:
        entry = self.manifest.shards[index]
        expected = {f["path"]: f["bytes"] for f in entry.extras.get("files", []) if isinstance(f, dict)}
        os.makedirs(tmp, exist_ok=True)
        for rel, size in sorted(self.files[index].items()):
            local = inside(tmp, rel, self.remote.join(f"{entry.path}/{rel}"))
            want = expected.get(rel, size)
            if want != size:
                raise FormatError(f"{self.remote.join(f'{entry.path}/{rel}')}: {size} bytes, the manifest says "
                                  f"{want} (truncated or replaced object?)")
            self.remote.download(f"{entry.path}/{rel}", local, want)
        missing = sorted(set(expected) - set(self.files[index]))
        if missing:
            raise ShardMissing(f"{self.remote.join(f'{entry.path}/{missing[0]}')}: no such object (the manifest "
                               f"lists it)")

    def _verify(self, index: int, tmp: str) -> ShardSummary:
        """The downloaded shard checked as ``verify`` checks it; FormatError naming its URL at the first problem."""
        from .verify import verify_shard

        problems = verify_shard(tmp, index, self.manifest, decode=False)
        if problems:
            text = problems[0].replace(tmp, self.shard_url(index))
            if not text.startswith(self.shard_url(index)):
                text = f"{self.shard_url(index)}: {text}"
            raise FormatError(f"{text} (found on arrival; the shard was not cached)")
        reader = get_backend(self.manifest.data.backend).reader(tmp)
        try:
            return ShardSummary(reader.meta, list(reader.records()), reader.storage_order(), self.sizes[index])
        finally:
            reader.close()

    def _check_indexed(self, index: int, arrived: ShardSummary) -> None:
        """A shard indexed before its download (from its small files) must be the shard that arrived."""
        indexed = self._load_summary(index)
        if indexed is None:
            return
        if (indexed.meta, indexed.records, indexed.storage_order) != (arrived.meta, arrived.records,
                                                                       arrived.storage_order):
            raise FormatError(f"{self.shard_url(index)}: its video records changed since the cache indexed it "
                              f"(replaced while being read?)")

    # -- room -------------------------------------------------------------------
    def _reserve(self, index: int, *, wait: bool, before_wait: Callable[[], None] | None) -> bool:
        """Room for shard ``index`` within the limit, evicting LRU shards no reader holds; False if none (no wait)."""
        name = self.manifest.shards[index].name
        size = self.sizes[index]
        deadline = time.monotonic() + self.settings.wait_s
        waited = False
        while True:
            with _flock(os.path.join(self.dir, ".cache.lock"), fcntl.LOCK_EX):
                # Reservations first: a download that finishes meanwhile renames its shard into place before
                # it drops its reservation, so it is counted once or twice, never missed.
                reserved = self._reserved()
                used = reserved + self.held_bytes()
                if used + size > self.limit:
                    wanted = self.wanted()
                    keep = {index, *(wanted if not wait else ())}
                    used -= self._evict(used + size - self.limit, keep=keep, later=wanted)
                if used + size <= self.limit:
                    self._write_atomic(os.path.join(self.dir, RESERVE_DIR, name), str(size).encode())
                    return True
            if not wait:
                return False
            if not waited and before_wait is not None:
                before_wait()
                waited = True
                continue
            if time.monotonic() > deadline:
                raise CacheFullError(f"{self.shard_url(index)}: the cache {self.dir} (limit {self.limit} bytes) "
                                     f"cannot take this shard ({size} bytes): {used} bytes are held by readers "
                                     f"or downloads; raise --cache-limit")
            time.sleep(0.05)

    def _reserved(self) -> int:
        """Bytes reserved by downloads in progress; a reservation whose download died is dropped."""
        total = 0
        folder = os.path.join(self.dir, RESERVE_DIR)
        for name in os.listdir(folder):
            fd = _try_exclusive(os.path.join(self.dir, LOCK_DIR, f"{name}.lock"))
            if fd is not None:  # nobody downloads it: stale
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, name))
                continue
            with contextlib.suppress(FileNotFoundError, ValueError), open(os.path.join(folder, name)) as f:
                total += int(f.read() or 0)
        return total

    def _evict(self, need: int, *, keep: Collection[int], later: Collection[int] = ()) -> int:
        """Evict least recently used shards no reader holds, but those in ``keep``, until ``need`` bytes are freed;
        those in ``later`` only when the others do not free enough."""
        candidates = []
        for i in range(len(self.sizes)):
            if i not in keep and self.present(i):
                try:
                    candidates.append((i in later, os.path.getmtime(self._lock_path(i)), i))
                except FileNotFoundError:
                    candidates.append((i in later, 0.0, i))
        freed = 0
        for _, _, i in sorted(candidates):
            if freed >= need:
                break
            fd = _try_exclusive(self._lock_path(i))
            if fd is None:
                continue  # a reader holds it (or it is being fetched)
            try:
                final = self.local_path(i)
                gone = os.path.join(os.path.dirname(final), f".evict-{self.manifest.shards[i].name}-{os.getpid()}")
                os.rename(final, gone)  # at once absent for every process, then removed at leisure
                shutil.rmtree(gone, ignore_errors=True)
                freed += self.sizes[i]
            except FileNotFoundError:
                pass
            finally:
                os.close(fd)
        return freed

    # -- what the readers of the node want kept ------------------------------------
    def _wanted_paths(self) -> tuple[str, str]:
        tag = f"{os.getpid()}-{id(self):x}"
        folder = os.path.join(self.dir, WANTED_DIR)
        return os.path.join(folder, f"{tag}.lock"), os.path.join(folder, f"{tag}.json")

    @_cache_disk
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
            fd = _open_lock(lock)
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                same = os.stat(lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._wanted_fd = fd
            else:  # removed as stale between its creation and our lock: make it again
                os.close(fd)
        self._write_atomic(data, json.dumps(sorted({int(s) for s in shards})).encode())

    @_cache_disk
    def unwant(self) -> None:
        """End this reader's declaration (``want``)."""
        fd, self._wanted_fd = self._wanted_fd, None
        if fd is None:
            return
        for path in self._wanted_paths()[::-1]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        os.close(fd)

    @_cache_disk
    def wanted(self) -> set[int]:
        """The shards some live process of the node wants (``want``); declarations of ended processes are removed."""
        folder = os.path.join(self.dir, WANTED_DIR)
        out: set[int] = set()
        for name in os.listdir(folder):
            if not name.endswith(".lock"):
                continue
            lock = os.path.join(folder, name)
            data = lock[:-len(".lock")] + ".json"
            fd = _try_exclusive(lock)
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

    # -- the index ----------------------------------------------------------------
    def _summary_path(self, index: int) -> str:
        entry = self.manifest.shards[index]
        return os.path.join(self.dir, INDEX_DIR, f"{entry.name}-{entry.sha256[:16]}.json")

    def _save_summary(self, index: int, s: ShardSummary) -> None:
        data = {"meta": s.meta, "records": [r.to_dict() for r in s.records], "storage_order": s.storage_order,
                "bytes": s.bytes}
        self._write_atomic(self._summary_path(index), json.dumps(data).encode())

    def _index_from_small_files(self, index: int) -> bool:
        """Index a shard from the small files its backend indexes it from (kilobytes, not the bulk); False when the
        backend has none (its records lie inside its data: indexed when the shard arrives)."""
        files = get_backend(self.manifest.data.backend).files
        if files.indexer is None:
            return False
        entry = self.manifest.shards[index]
        small = sorted(rel for rel in self.files[index] if files.is_index(rel))
        tmp = os.path.join(self.dir, INDEX_DIR, f".tmp-{entry.name}-{os.getpid()}-{threading.get_ident()}")
        os.makedirs(tmp, exist_ok=True)
        try:
            for rel in small:
                local = inside(tmp, rel, self.remote.join(f"{entry.path}/{rel}"))
                self.remote.download(f"{entry.path}/{rel}", local, self.files[index][rel])
            meta, records, order = files.indexer(tmp)
        except FormatError as exc:
            raise FormatError(str(exc).replace(tmp, self.shard_url(index))) from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._save_summary(index, ShardSummary(meta, records, order, self.sizes[index]))
        return True

    def _load_summary(self, index: int) -> ShardSummary | None:
        """The index entry of shard ``index``; None when there is none or it is damaged (then removed)."""
        path = self._summary_path(index)
        try:
            with open(path) as f:
                d = json.load(f)
            return ShardSummary(d["meta"], [VideoRecord.from_dict(r, path) for r in d["records"]],
                                d["storage_order"], int(d["bytes"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            # Damaged (a crash of the machine mid-write): the shard itself says it again.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return None

    @_cache_disk
    def summary(self, index: int) -> ShardSummary:
        """Shard ``index``'s metadata and video records: from the cache's index, else fetched (and indexed)."""
        path = self._summary_path(index)
        if not os.path.exists(path) and not self._index_from_small_files(index):
            self.fetch(index)
        found = self._load_summary(index)
        if found is not None:
            return found
        # The entry was damaged: the shard itself (fetched if need be) says it again.
        hold = self.acquire(index)
        try:
            reader = get_backend(self.manifest.data.backend).reader(self.local_path(index))
            s = ShardSummary(reader.meta, sort_records(list(reader.records())), reader.storage_order(),
                             self.sizes[index])
            reader.close()
        finally:
            hold.release()
        self._save_summary(index, s)
        return s

    @_cache_disk
    def downloads(self) -> list[str]:
        """Names of the shards downloaded into this cache so far, by every process, in order."""
        try:
            with open(os.path.join(self.dir, DOWNLOAD_LOG)) as f:
                return [line.split()[0] for line in f if line.strip()]
        except FileNotFoundError:
            return []


class Prefetcher:
    """Fetches, in the background, the shards a reading order needs next (``settings.prefetch`` ahead).

    ``plan(shards)`` gives an epoch's shards in the order it first needs
    them; ``advance(k, live=...)`` says the reading has reached the k-th of
    them and which shards it still reads. The shards are fetched in the
    plan's order: each one's room is reserved before the next one's, so a
    later shard never takes the room of a sooner one, while up to
    ``settings.downloads`` download at once; the first that finds no room
    ends the round (the next ``advance`` tries again). The live shards and
    those ahead are declared wanted (``ShardCache.want``): a prefetch never
    evicts them to make room, and a reader only when nothing else frees it.
    A prefetch never waits for room and never raises: a shard it could not
    fetch is fetched (or its error raised) by the reader that needs it.
    """

    def __init__(self, cache: ShardCache) -> None:
        self.cache = cache
        self._pool = ThreadPoolExecutor(cache.settings.downloads, thread_name_prefix="shard-prefetch")
        self._driver = ThreadPoolExecutor(1, thread_name_prefix="shard-prefetch-plan")
        self._lock = threading.Lock()
        self._plan: list[int] = []
        self._pos = 0
        self._round = 0
        self._inflight: set[int] = set()
        self.errors: list[str] = []

    def plan(self, shards: Sequence[int]) -> None:
        with self._lock:
            self._plan, self._pos = [int(s) for s in shards], 0
        self.advance(0)

    def advance(self, position: int, *, live: Collection[int] = ()) -> None:
        with self._lock:
            self._pos = max(self._pos, position)
            ahead = self._plan[self._pos:self._pos + 1 + self.cache.settings.prefetch]
            self._round += 1
            token = self._round
        self.cache.want({*live, *ahead})
        self._driver.submit(self._run, token, ahead)

    def _run(self, token: int, ahead: list[int]) -> None:
        """One round: the shards ``ahead`` not there yet, in order, each one's room reserved before the next."""
        for shard in ahead:
            with self._lock:
                if token != self._round:
                    return  # a newer round has the newer plan
                if shard in self._inflight:
                    continue
            if self.cache.present(shard):
                continue
            with self._lock:
                self._inflight.add(shard)
            reserved = threading.Event()
            future = self._pool.submit(self._fetch, shard, reserved)
            while not reserved.wait(0.05):
                if future.done():
                    break
            if not reserved.is_set() and not future.result():  # the loop ended: reserved, or the fetch done
                return  # no room without evicting what is read now or sooner: the next advance tries again

    def _fetch(self, shard: int, reserved: threading.Event) -> bool:
        try:
            return self.cache.fetch(shard, wait=False, on_reserved=reserved.set)
        except (OSError, FormatError) as exc:
            self.errors.append(str(exc))  # the reader that needs the shard fetches it again and raises
            return False
        finally:
            with self._lock:
                self._inflight.discard(shard)

    def close(self) -> None:
        with self._lock:
            self._round += 1  # a round in progress stops at its next shard
        self._driver.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.cache.unwant()


def verify_url(url: str, *, decode: bool = True, workers: int | None = None,
               cache: CacheSettings | None = None) -> tuple[list[str], dict]:
    """``verify`` of the conversion at ``url``: all problems (empty when it is sound), and the counts checked.

    Each shard is downloaded into the shard cache (``cache``: its settings),
    checked on arrival, then decoded in full in a child process as a folder's
    shards are; a few at a time, so the disk holds the cache's limit at most;
    the shards stay cached. A network failure or a full cache disk
    (``RemoteError``) is raised, never reported as a problem of the data.
    """
    from .verify import checked_counts, isolated, totals_problems, verify_shard

    workers = cpu_count() if workers is None else workers
    try:
        sc = ShardCache(url, cache)
    except FormatError as exc:
        return [str(exc)], {}
    manifest = sc.manifest
    problems: list[str] = []
    try:
        check_plan(sc.dir, manifest)  # the mirror holds the URL's plan.json, when there is one
    except FormatError as exc:
        problems.append(str(exc).replace(sc.dir, sc.url))
    # As many shards at once as there are workers and the cache holds.
    at_once = max(1, min(workers, sc.limit // max(max(sc.sizes, default=1), 1) - 1))
    order = list(range(len(manifest.shards)))
    for start in range(0, len(order), at_once):
        holds = {}
        try:
            for i in order[start:start + at_once]:
                try:
                    holds[i] = sc.acquire(i)  # downloaded and checked on arrival unless cached
                except FormatError as exc:
                    problems.append(str(exc))
            tasks: list[tuple[str, Callable[[], list[str]]]] = [
                (manifest.shards[i].name, functools.partial(verify_shard, sc.local_path(i), i, manifest,
                                                            decode=decode)) for i in holds]
            found = isolated(tasks, workers)
        finally:
            for hold in holds.values():
                hold.release()
        for line in found:
            for i in holds:
                line = line.replace(sc.local_path(i), sc.shard_url(i))
            problems.append(line)
    problems += totals_problems(manifest, f"{sc.url}/manifest.json")
    return problems, checked_counts(manifest)


__all__ = ["DEFAULT_FRACTION", "CacheDiskError", "CacheFullError", "CacheSettings", "Hold", "Prefetcher", "ShardCache",
           "ShardSummary", "default_cache_dir", "verify_url"]
