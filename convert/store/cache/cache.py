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

The cache is cut along its seams: ``settings`` (``CacheSettings``),
``common`` (folder names, lock files, errors), ``space`` (what it holds
against its limit, reservations, eviction), ``index`` (what a reader needs
of each shard at open, kept beside the shards, small, so that it survives
eviction and later opens need no download), ``prefetch`` (the shards a
reading order needs next, fetched in the background) and this module, the
mirror itself: its metadata, and fetching and holding shards.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import threading
from collections.abc import Callable, Collection

from convert.format.backends import get_backend
from convert.format.errors import FormatError, ShardMissing, device_room
from convert.format.layout import MANIFEST, MAX_PLAN_BYTES, PLAN, inside
from convert.format.records import sort_records

from ..remote import Remote, check_url, read_remote_manifest
from .common import (
    CACHE_LOCK,
    DOWNLOAD_LOG,
    GENERATION,
    INDEX_DIR,
    LOCK_DIR,
    RESERVE_DIR,
    WANTED_DIR,
    CacheFullError,
    Hold,
    cache_disk,
    flock,
    lock_path,
    open_lock,
    try_exclusive,
    write_atomic,
)
from .index import ShardSummary, SummaryIndex, sweep_index
from .settings import CacheSettings, default_cache_dir
from .space import Space


class ShardCache:
    """The local mirror of the conversion at ``url`` (see the module docstring); picklable."""

    @cache_disk
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
        raw, self.manifest = read_remote_manifest(self.remote)
        # The manifest's checksum ties the cached shards to the conversion they were verified against: a reader
        # finds out when another process of the node mirrors another conversion at the URL (``_same_conversion``).
        self.generation = hashlib.sha256(raw).hexdigest()
        with flock(os.path.join(self.dir, CACHE_LOCK), fcntl.LOCK_EX):
            self._mirror_metadata(raw)
            self._sweep()
        self.files = self._list_shards()
        self.sizes = [sum(f.values()) for f in self.files]
        count = range(len(self.manifest.shards))
        urls = [self.shard_url(i) for i in count]
        self.space = Space(dir=self.dir, base=base, names=[s.name for s in self.manifest.shards],
                           paths=[self.local_path(i) for i in count], urls=urls, sizes=self.sizes,
                           wait_s=settings.wait_s)
        self.index = SummaryIndex(dir=self.dir, manifest=self.manifest, remote=self.remote, files=self.files,
                                  sizes=self.sizes, urls=urls)
        self.limit = self.space.limit = (settings.limit if settings.limit is not None
                                         else self.space.default_limit())
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
                if name not in (LOCK_DIR, CACHE_LOCK, RESERVE_DIR, WANTED_DIR):
                    full = os.path.join(self.dir, name)
                    shutil.rmtree(full) if os.path.isdir(full) else os.unlink(full)
            os.makedirs(os.path.join(self.dir, INDEX_DIR), exist_ok=True)
        if self.manifest.plan is None:
            # An older conversion's manifest does not record its plan: readers check it against the plan itself.
            # One that does needs no copy to be read (only ``verify``, ``mirror_plan``).
            self._copy_plan()
        if old != raw:
            write_atomic(path, raw)
        if self._mirrored() != self.generation:
            write_atomic(os.path.join(self.dir, GENERATION), self.generation.encode())

    def _copy_plan(self) -> None:
        """plan.json into the mirror, when the URL has one (it is optional, FORMAT.md)."""
        try:
            plan = self.remote.read_bytes(PLAN, limit=MAX_PLAN_BYTES)  # a longer one is refused when checked
        except ShardMissing:
            return
        write_atomic(os.path.join(self.dir, PLAN), plan)

    @cache_disk
    def mirror_plan(self) -> None:
        """Copy the URL's plan.json into the mirror (what ``verify`` checks the manifest against)."""
        with flock(os.path.join(self.dir, CACHE_LOCK), fcntl.LOCK_EX):
            self._copy_plan()

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
            fd = try_exclusive(lock_path(self.dir, entry.name))
            if fd is None:
                continue  # being downloaded or evicted right now
            try:
                for name in names:
                    shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            finally:
                os.close(fd)
        sweep_index(self.dir)

    def _list_shards(self) -> list[dict[str, int]]:
        """Per shard: {file name: size}: the files its manifest entry lists, found in one listing per folder of
        shards (the sizes the manifest gives; in a version 2 manifest, the listed objects the backend declares)."""
        parents = sorted({os.path.dirname(s.path) for s in self.manifest.shards})
        listed: dict[str, int] = {}
        for parent in parents:
            for rel, size in self.remote.files(parent).items():
                listed[f"{parent}/{rel}" if parent else rel] = size
        out = []
        files = get_backend(self.manifest.data.backend).files
        for s in self.manifest.shards:
            prefix = s.path + "/"
            # Only the files the manifest lists (or, in a version 2 manifest, the backend declares): any other
            # object under the prefix (a stale part, a killed upload's temporary, a key with '..' planted by
            # whoever can write the bucket) is neither downloaded nor counted.
            found = {k[len(prefix):]: v for k, v in listed.items() if k.startswith(prefix)}
            sizes = {f.name: f.bytes for f in s.shard_files or ()}
            mine = {name: sizes.get(name, found[name]) for name in files.listed(s, found, self.remote.join(MANIFEST))
                    if name in found}
            if not mine:
                raise ShardMissing(f"{self.remote.join(s.path)}: the manifest names shard {s.name}, no object "
                                   f"is there")
            out.append(mine)
        return out

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_io_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._io_lock = threading.Lock()

    # -- paths ----------------------------------------------------------------
    def local_path(self, index: int) -> str:
        """Where shard ``index`` lies in the mirror once fetched."""
        return os.path.join(self.dir, self.manifest.shards[index].path)

    def shard_url(self, index: int) -> str:
        """How errors name shard ``index``: its URL."""
        return self.remote.join(self.manifest.shards[index].path)

    def present(self, index: int) -> bool:
        """Whether shard ``index`` is in the cache, whole and verified."""
        return self.space.present(index)

    def held_bytes(self) -> int:
        """Bytes of the shards in the cache now."""
        return self.space.held_bytes()

    @cache_disk
    def want(self, shards: Collection[int]) -> None:
        """Declare the shards this reader reads now or next, for every process of the node (``Space.want``)."""
        self.space.want(shards)

    @cache_disk
    def unwant(self) -> None:
        """End this reader's declaration (``want``)."""
        self.space.unwant()

    @cache_disk
    def wanted(self) -> set[int]:
        """The shards some live process of the node wants (``want``)."""
        return self.space.wanted()

    # -- holding and fetching ---------------------------------------------------
    @cache_disk
    def acquire(self, index: int, *, before_wait: Callable[[], None] | None = None) -> Hold:
        """Shard ``index`` in the cache (fetched now unless there) and held against eviction.

        ``before_wait`` is called when the download must wait for room (the
        caller's own idle shards can then be released).
        """
        lock = self.space.lock_path(index)
        while True:
            fd = open_lock(lock)
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

    @cache_disk
    def fetch(self, index: int, *, wait: bool = True, before_wait: Callable[[], None] | None = None,
              on_reserved: Callable[[], None] | None = None) -> bool:
        """Download and verify shard ``index`` unless it is there; False when ``wait=False`` and there is no room.

        Room is made by evicting least recently used shards that no reader
        holds, those no process of the node wants (``want``) first;
        ``wait=False`` (a prefetch) evicts no wanted shard at all.
        ``on_reserved`` is called once the room is
        reserved (or the shard found there), before the download.
        """
        with flock(self.space.lock_path(index), fcntl.LOCK_EX):
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
            if not self.space.reserve(index, wait=wait, before_wait=before_wait):
                return False
            if on_reserved is not None:
                on_reserved()
            tmp = os.path.join(parent, f".tmp-{entry.name}-{os.getpid()}-{threading.get_ident()}")
            try:
                self._download(index, tmp)
                summary = self._verify(index, tmp)
                self._check_indexed(index, summary)
                with flock(os.path.join(self.dir, CACHE_LOCK), fcntl.LOCK_EX):
                    self._same_conversion(index)  # never a shard of the old conversion into a new one's mirror
                    os.rename(tmp, final)
                os.utime(self.space.lock_path(index))  # just arrived: the most recently used, for the LRU order
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
                self.space.release(index)
            self.index.save(index, summary)
            with self._io_lock:
                self.fetched += 1
                self.fetched_bytes += self.sizes[index]
            with open(os.path.join(self.dir, DOWNLOAD_LOG), "a") as f:
                f.write(f"{entry.name} {self.sizes[index]} {os.getpid()}\n")  # one write: O_APPEND keeps lines whole
            return True

    def _download(self, index: int, tmp: str) -> None:
        """The shard's files into ``tmp``: exactly those ``files`` names, each checked against its listed size
        (their checksums are checked on arrival, ``_verify``)."""
        entry = self.manifest.shards[index]
        expected = {f.name: f.bytes for f in entry.shard_files or ()}
        missing = sorted(set(expected) - set(self.files[index]))
        if missing:
            raise ShardMissing(f"{self.remote.join(f'{entry.path}/{missing[0]}')}: no such object (the manifest "
                               f"lists it)")
        os.makedirs(tmp, exist_ok=True)
        for rel, want in sorted(self.files[index].items()):
            local = inside(tmp, rel, self.remote.join(f"{entry.path}/{rel}"))
            self.remote.download(f"{entry.path}/{rel}", local, want)

    def _verify(self, index: int, tmp: str) -> ShardSummary:
        """The downloaded shard checked as ``verify`` checks it; FormatError naming its URL at the first problem."""
        from ..verify import verify_shard

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
        indexed = self.index.load(index)
        if indexed is None:
            return
        if (indexed.meta, indexed.records, indexed.storage_order) != (arrived.meta, arrived.records,
                                                                       arrived.storage_order):
            raise FormatError(f"{self.shard_url(index)}: its video records changed since the cache indexed it "
                              f"(replaced while being read?)")

    @cache_disk
    def summary(self, index: int) -> ShardSummary:
        """Shard ``index``'s metadata and video records: from the cache's index, else fetched (and indexed)."""
        found = None
        if not self.index.has(index):
            found = self.index.from_small_files(index)  # as saved: not parsed again
            if found is None:
                self.fetch(index)
        found = found or self.index.load(index)
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
        self.index.save(index, s)
        return s

    @cache_disk
    def downloads(self) -> list[str]:
        """Names of the shards downloaded into this cache so far, by every process, in order."""
        try:
            with open(os.path.join(self.dir, DOWNLOAD_LOG)) as f:
                return [line.split()[0] for line in f if line.strip()]
        except FileNotFoundError:
            return []


__all__ = ["ShardCache"]
