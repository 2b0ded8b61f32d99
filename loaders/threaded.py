"""``ThreadedClipLoader``: a batch loader whose readers are threads of the training process.

Why threads: everything a reader does per clip runs in C without the GIL (an
LMDB read is a pointer into the map, a TFRecord read a view of a memory-mapped
file; numpy's crop and flip copies, LZ4 block decompression and libjpeg-turbo
through simplejpeg all release it). Worker processes instead must hand every
batch over in fresh shared memory, which caps even a bare read-and-copy far
below what one thread reads (docs/benchmarks.md).

How it works: the sampler's items are cut into batches exactly as
``DataLoader`` cuts them (same order, same ``drop_last``); each batch gets a
slot of a small ring of preallocated batch buffers (pinned when CUDA is
available, so ``.to(device, non_blocking=True)`` copies from memory that never
moves); each batch is read by one thread, or cut into contiguous slices when
there are more threads than batches in flight, and every thread writes its
clips' crops straight into its rows of the slot (``dataset.read_into``). Up
to ``prefetch`` batches are in flight while the consumer works on the one it
holds. Crops are keyed by (seed, epoch, index) as
everywhere else, so the batches are bit-identical to the ``DataLoader`` path's.

**A batch is valid until you ask for the next one.** Its tensors are views of
a ring slot that is refilled after the next ``next()``: clone what you keep
longer. On CUDA, the slot is refilled only after the GPU has finished the work
queued on the current stream before that ``next()`` (a CUDA event), so a
``non_blocking`` copy made from it while you held it is safe.

Errors: bad data in a reader thread comes back in the consuming thread as the
same one-line ``FormatError`` (naming the shard and the clip) as on the
``DataLoader`` path. A read that hangs (a dead network filesystem) raises
``LoaderTimeout`` after ``timeout`` seconds, naming the clips still being read.
"""

from __future__ import annotations

import math
import queue
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any

import torch
from torch.utils.data import Sampler

# How long close() waits for the reader threads to end (they have no read in flight by then).
SHUTDOWN_WAIT = 10.0

__all__ = ["LoaderTimeout", "ThreadedClipLoader"]


class LoaderTimeout(TimeoutError):
    """No batch arrived within the loader's timeout (a read is stuck)."""


class _Pool:
    """Daemon threads running submitted calls in order of submission.

    Daemon, not ``concurrent.futures.ThreadPoolExecutor``: that pool joins its
    threads at interpreter exit, so a read stuck in the kernel would keep a
    finished (or failed) training process from ever exiting.
    """

    def __init__(self, threads: int, name: str) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{k}", daemon=True) for k in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            future, fn, args = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
                future.set_exception(exc)

    def submit(self, fn: Callable, *args: Any) -> Future:
        future: Future = Future()
        self._tasks.put((future, fn, args))
        return future

    def shutdown(self, wait: float = 0.0) -> None:
        """Let the threads end once the calls queued before this one are done; wait up to ``wait`` s for them.

        Waiting matters at the end of a process: a daemon thread still ending
        while the interpreter finalizes is stopped by ``pthread_exit`` and
        the process can abort ("terminate called without an active
        exception", exit status 134: 2 runs in 8 of a script that closed its
        loader and exited at once, none once the threads were joined).
        """
        for _ in self._threads:
            self._tasks.put(None)
        deadline = time.monotonic() + wait
        for t in self._threads:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            t.join(remaining)

    @property
    def threads(self) -> list[threading.Thread]:
        return list(self._threads)


class _InlinePool:
    """``threads=0``: each call runs at once, in the consumer's thread."""

    def submit(self, fn: Callable, *args: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - raised by the consumer, as from a thread
            future.set_exception(exc)
        return future

    def shutdown(self, wait: float = 0.0) -> None:
        pass

    @property
    def threads(self) -> list[threading.Thread]:
        return []


class _Slot:
    """One preallocated batch: a tensor per field, their numpy views, and the GPU work that may still read it."""

    def __init__(self, fields: dict[str, tuple[tuple[int, ...], torch.dtype]], batch_size: int, pin: bool) -> None:
        self.tensors = {k: torch.empty((batch_size, *shape), dtype=dt, pin_memory=pin)
                        for k, (shape, dt) in fields.items()}
        self.arrays = {k: t.numpy() for k, t in self.tensors.items()}
        self.event: Any = None  # torch.cuda.Event recorded when the consumer let go of the slot

    def wait_for_consumer(self) -> None:
        event = self.event
        if event is not None:
            event.synchronize()


def _slices(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous, near-equal (start, stop) ranges covering 0..n (none empty)."""
    parts = max(1, min(parts, n))
    bounds = [n * k // parts for k in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


class ThreadedClipLoader:
    """Batches of ``dataset`` read by ``threads`` threads into a ring of preallocated (pinned) buffers.

    ``dataset`` must offer ``batch_fields()`` and ``read_into(items, out)``
    (``ClipDataset`` does). ``sampler`` yields the items (``(epoch, index)``
    from ``DistributedClipSampler``); they are grouped into batches of
    ``batch_size`` in order, the last one dropped when short and
    ``drop_last``. ``prefetch``: batches read ahead of the consumer (the ring
    holds one more). ``threads=0`` reads each batch in the consumer's thread
    when it is asked for (no read-ahead), into the same ring. ``timeout``: seconds to wait for one batch before
    raising ``LoaderTimeout``. Iterate it like a ``DataLoader``; one epoch's
    iterator at a time (starting another ends the previous one). ``close()``,
    or the end of a ``with`` block, stops and joins the reader threads; a
    later iteration starts fresh ones.
    """

    def __init__(self, dataset: Any, *, batch_size: int, sampler: Sampler, threads: int, prefetch: int = 4,
                 pin_memory: bool | None = None, drop_last: bool = False, timeout: float = 300.0) -> None:
        missing = [m for m in ("batch_fields", "read_into") if not callable(getattr(dataset, m, None))]
        if missing:
            raise ValueError(f"a threaded loader needs a dataset with {' and '.join(missing)} "
                             f"(ClipDataset has them), got {type(dataset).__name__}")
        for name, value, low in (("batch_size", batch_size, 1), ("threads", threads, 0), ("prefetch", prefetch, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.dataset = dataset
        self.sampler = sampler
        self.batch_size = batch_size
        self.threads = threads
        self.prefetch = prefetch
        self.drop_last = bool(drop_last)
        self.timeout = float(timeout)
        if pin_memory and not torch.cuda.is_available():
            warnings.warn("pin_memory=True but CUDA is not available: the batch ring is not pinned", stacklevel=2)
        # Pinned only where CUDA is (pinning needs it), as DataLoader does.
        self.pin_memory = torch.cuda.is_available() and (pin_memory is None or bool(pin_memory))
        self._fields = dataset.batch_fields()
        # Tasks per batch: enough that the batches in flight keep every thread busy. Whole
        # batches where prefetch allows (measured faster than halves: fewer hand-overs, and
        # the threads do not finish together and queue for the GIL),
        # slices of each batch when there are more threads than batches in flight.
        self._parts = max(1, math.ceil(threads / prefetch))
        self._pool: _Pool | _InlinePool | None = None
        self._slots: list[_Slot] | None = None
        self._epoch: _EpochIterator | None = None
        self._lock = threading.Lock()
        self._clips = 0
        self._busy = 0.0
        self._depth_sum = 0
        self._depth_n = 0

    def __len__(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]  # the samplers it takes have a length
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[dict]:
        if self._epoch is not None:
            self._epoch.close()
        if self._pool is None:
            self._pool = _Pool(self.threads, "clip-reader") if self.threads else _InlinePool()
            # One slot per batch in flight plus the one the consumer holds.
            self._slots = [_Slot(self._fields, self.batch_size, self.pin_memory) for _ in range(self._ahead() + 1)]
        self._epoch = _EpochIterator(self, self._slots or [])
        return self._epoch

    def _ahead(self) -> int:
        return self.prefetch if self.threads else 1

    def _fill(self, slot: _Slot, items: Sequence[Any], start: int, stop: int) -> dict[str, list]:
        """Read ``items[start:stop]`` into rows start..stop of ``slot`` (runs in a reader thread)."""
        slot.wait_for_consumer()
        t0 = time.perf_counter()
        lists: dict[str, list] = self.dataset.read_into(items[start:stop],
                                                        {k: a[start:stop] for k, a in slot.arrays.items()})
        busy = time.perf_counter() - t0
        with self._lock:
            self._clips += stop - start
            self._busy += busy
        return lists

    def _note_depth(self, ready: int) -> None:
        with self._lock:
            self._depth_sum += ready
            self._depth_n += 1

    def stats(self, reset: bool = True) -> dict[str, float | None]:
        """What the loader did since the last call (with ``reset``).

        ``clips``: clips read. ``clips_per_s``: clips read per second of reader-thread time, times
        the number of threads: the rate it would deliver if never kept
        waiting by its consumer. ``queue_depth``: mean number of batches
        already read and waiting when the consumer asked for one (0 to
        ``prefetch``: near 0, the loader is the limit; near ``prefetch``, the
        consumer is). None where nothing was measured.
        """
        with self._lock:
            out = {"clips": self._clips,
                   "clips_per_s": self._clips * max(1, self.threads) / self._busy if self._busy > 0 else None,
                   "queue_depth": self._depth_sum / self._depth_n if self._depth_n else None,
                   "prefetch": self.prefetch}
            if reset:
                self._clips, self._busy, self._depth_sum, self._depth_n = 0, 0.0, 0, 0
        return out

    def _abandon(self) -> None:
        """After a timeout: leave the stuck threads and their slots behind; a new iteration gets fresh ones."""
        if self._pool is not None:
            self._pool.shutdown()
        self._pool, self._slots, self._epoch = None, None, None

    def close(self) -> None:
        """End the current epoch's iterator and let the reader threads go."""
        if self._epoch is not None:
            self._epoch.close()
            self._epoch = None
        if self._pool is not None:
            # The epoch's close waited for the reads in flight, so the threads end at once; the bound
            # only matters for a read stuck in the kernel, which is left behind as before.
            self._pool.shutdown(wait=SHUTDOWN_WAIT)
            self._pool = None
            self._slots = None

    def __enter__(self) -> ThreadedClipLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the daemon threads die with the process anyway
            pass

    def __repr__(self) -> str:
        return (f"ThreadedClipLoader({len(self)} batches of {self.batch_size}, {self.threads} threads, "
                f"prefetch {self.prefetch}, pinned={self.pin_memory})")


class _EpochIterator:
    """One pass over the sampler: keeps ``prefetch`` batches in flight, hands them out in order."""

    def __init__(self, loader: ThreadedClipLoader, slots: list[_Slot]) -> None:
        self.loader = loader
        self.items = iter(loader.sampler)
        self.free: deque[_Slot] = deque(slots)
        self.inflight: deque[tuple[_Slot, list, list[tuple[Future, int, int]]]] = deque()
        self.held: _Slot | None = None
        self.done = False
        self._top_up()

    def _next_items(self) -> list | None:
        batch = []
        for item in self.items:
            batch.append(item)
            if len(batch) == self.loader.batch_size:
                return batch
        if batch and not self.loader.drop_last:
            return batch
        return None

    def _top_up(self) -> None:
        loader = self.loader
        pool = loader._pool
        while not self.done and len(self.inflight) < loader._ahead() and self.free:
            items = self._next_items()
            if items is None:
                self.done = True
                break
            if pool is None:  # the loader was closed under this iterator
                raise RuntimeError("the threaded loader was closed while its epoch was being read")
            slot = self.free.popleft()
            tasks = [(pool.submit(loader._fill, slot, items, a, b), a, b)
                     for a, b in _slices(len(items), loader._parts)]
            self.inflight.append((slot, items, tasks))

    def _release_held(self) -> None:
        slot, self.held = self.held, None
        if slot is None:
            return
        slot.event = None
        if self.loader.pin_memory and torch.cuda.is_initialized():
            # Whatever the consumer queued on the GPU with this batch (its
            # non_blocking copy) must finish before the slot is written again.
            slot.event = torch.cuda.Event()
            slot.event.record()
        self.free.append(slot)

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> dict:
        self._release_held()
        self._top_up()
        if not self.inflight:
            raise StopIteration
        # Batches already read when asked for (with threads=0 none is: each is read now).
        ready = sum(all(f.done() for f, _, _ in tasks) for _, _, tasks in self.inflight) if self.loader.threads else 0
        self.loader._note_depth(ready)
        slot, items, tasks = self.inflight.popleft()
        futures = [f for f, _, _ in tasks]
        _, pending = wait_futures(futures, timeout=self.loader.timeout)
        if pending:
            self.close(wait=False)
            self.loader._abandon()
            raise LoaderTimeout(self._stuck_message(items, [(a, b) for f, a, b in tasks if f in pending]))
        for f in futures:
            exc = f.exception()
            if exc is not None:
                self.close()
                raise exc
        n = len(items)
        self.held = slot
        batch: dict[str, Any] = {k: (t if n == t.shape[0] else t[:n]) for k, t in slot.tensors.items()}
        for f in futures:  # the fields that are lists (video ids), slice after slice
            for key, values in f.result().items():
                batch.setdefault(key, []).extend(values)
        return batch

    def _stuck_message(self, items: list, ranges: list[tuple[int, int]]) -> str:
        store = getattr(self.loader.dataset, "store", None)

        def name(item: Any) -> str:
            i = item[1] if isinstance(item, (tuple, list)) else item
            try:
                return f"clip {i} ({store.where(int(i))})" if store is not None else f"clip {i}"
            except (IndexError, ValueError, OSError):
                return f"clip {i}"

        first = "; ".join(f"{name(items[a])} and {b - a - 1} after it" if b - a > 1 else name(items[a])
                          for a, b in ranges[:3])
        more = f" (+{len(ranges) - 3} more slices)" if len(ranges) > 3 else ""
        return (f"no batch after {self.loader.timeout:g} s: {len(ranges)} reader thread(s) still reading {first}"
                f"{more}; is the storage hung?")

    def close(self, wait: bool = True) -> None:
        """Cancel what has not started and wait for what has (a slot must not be written after this)."""
        self.done = True
        running = []
        for _, _, tasks in self.inflight:
            for f, _, _ in tasks:
                if not f.cancel():
                    running.append(f)
        self.inflight.clear()
        if wait:
            # A read cannot be interrupted; one stuck past the timeout is left
            # behind with its slot (the loader then starts fresh ones).
            _, stuck = wait_futures(running, timeout=self.loader.timeout)
            if stuck:
                self.loader._abandon()

