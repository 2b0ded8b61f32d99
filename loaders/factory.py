"""``build_loader``: the loader this project's readers want, over threads or worker processes.

``threads=N`` gives a ``ThreadedClipLoader`` (N reader threads in this
process, preallocated pinned batches); otherwise a ``ClipDataLoader`` (a
``DataLoader`` that can be closed) with ``workers`` processes. Every default
can be overridden; anything else goes to ``DataLoader`` as is. Both kinds
close with ``close()`` or at the end of a ``with`` block.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.dataloader import _BaseDataLoaderIter

from convert.format.system import cpu_count

from .dataset import collate
from .prefetch import PrefetchingSampler
from .sampler import DistributedClipSampler
from .threaded import ThreadedClipLoader

START_METHODS = ("fork", "spawn", "forkserver")


def _cpus_per_rank() -> int:
    # This process's share of the CPUs: LOCAL_WORLD_SIZE ranks (default 1) share them.
    local = os.environ.get("LOCAL_WORLD_SIZE", "1")
    try:
        ranks = max(1, int(local))
    except ValueError as exc:
        raise ValueError(f"LOCAL_WORLD_SIZE must be an integer, got {local!r}") from exc
    return cpu_count() // ranks


def default_workers() -> int:
    """CPUs per local rank (``LOCAL_WORLD_SIZE``, default 1), at most 8."""
    return max(0, min(_cpus_per_rank(), 8))


def default_threads() -> int:
    """Reader threads per local rank: its share of the CPUs (``LOCAL_WORLD_SIZE``), at least 1, at most 16."""
    # Past ~16 threads the part of each read that holds the GIL, not the
    # cores, would be the limit.
    return max(1, min(_cpus_per_rank(), 16))


class ClipDataLoader(DataLoader):
    """A torch ``DataLoader``, unchanged, that also closes: ``close()`` or the end of a ``with`` block.

    A plain DataLoader has no way to end its worker processes: persistent
    workers (``build_loader``'s default) live as long as the loader object,
    and an epoch left mid-way keeps its workers until its iterator is
    garbage-collected. ``close()`` ends the workers of the persistent
    iterator and of the latest one handed out, now; iterating again after it
    starts fresh workers.
    """

    _latest: weakref.ref | None = None

    def __iter__(self) -> _BaseDataLoaderIter:
        it = super().__iter__()
        self._latest = weakref.ref(it)
        return it

    def close(self) -> None:
        """End the worker processes of this loader's iterators (none with ``num_workers=0``)."""
        latest = self._latest() if self._latest is not None else None
        self._latest = None
        for it in {id(x): x for x in (self._iterator, latest) if x is not None}.values():
            # torch's iterator ends its workers this way when it is garbage-collected; there is no public
            # call that does it sooner.
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
        self._iterator = None

    def __enter__(self) -> ClipDataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build_loader(dataset: Dataset, *, batch_size: int, sampler: Sampler | None = None, train: bool = True,
                 workers: int | None = None, threads: int | None = None, pin_memory: bool | None = None,
                 persistent_workers: bool = True, prefetch_factor: int = 4, drop_last: bool | None = None,
                 start_method: str | None = None, **kw: Any) -> ClipDataLoader | ThreadedClipLoader:
    """A loader over ``dataset``: reader threads with ``threads=N``, else a DataLoader (``ClipDataLoader``).

    Defaults: ``sampler`` a ``DistributedClipSampler`` (shuffled in training,
    in order for evaluation; yields (epoch, index), so call
    ``loader.sampler.set_epoch(e)`` each epoch); ``workers`` =
    ``default_workers()``; ``pin_memory`` when CUDA is available;
    ``drop_last`` in training only; ``start_method`` the platform's. A dataset
    with a batched ``__getitems__`` gets the matching ``collate`` unless
    ``collate_fn`` is given. ``persistent_workers`` and ``prefetch_factor``
    apply only with workers.

    ``threads=N`` (``workers`` must then be None or 0): a
    ``ThreadedClipLoader`` with N reader threads (0: read in the calling
    thread), ``prefetch_factor`` batches read ahead in all, the same sampler,
    batches and crops; ``timeout`` (seconds to wait for one batch, default
    300) is the one other keyword it takes. Its batches are valid until the
    next one is asked for.

    Either loader is a context manager: ``with build_loader(...) as loader:``
    ends its reader threads or worker processes at the end of the block, as
    ``loader.close()`` does.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if start_method is not None and start_method not in START_METHODS:
        raise ValueError(f"start_method must be None or one of {', '.join(START_METHODS)}, got {start_method!r}")
    if threads is not None and workers:
        raise ValueError(f"threads={threads!r} and workers={workers!r}: choose reader threads or worker processes")
    workers = (0 if threads is not None else default_workers()) if workers is None else workers
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an int >= 0, got {workers!r}")
    if prefetch_factor < 1:
        raise ValueError(f"prefetch_factor must be >= 1, got {prefetch_factor}")
    if "shuffle" in kw:
        raise ValueError("shuffle is the sampler's job: pass sampler=DistributedClipSampler(..., shuffle=...)")
    if sampler is None:
        seed = getattr(getattr(dataset, "preset", None), "seed", 0)
        sampler = DistributedClipSampler(len(dataset), shuffle=train, seed=seed)  # type: ignore[arg-type]
    store = getattr(dataset, "store", None)
    if getattr(store, "cache", None) is not None:
        # Read from a URL: the sampler's order also drives the shard cache's prefetch. The readers are
        # behind the sampler by the batches read ahead (and the one being used).
        if threads is not None:
            ahead = prefetch_factor if threads else 1  # no reader threads: one batch read at a time
        else:
            ahead = prefetch_factor * workers  # no workers: read as the sampler hands out
        sampler = PrefetchingSampler(sampler, store,  # type: ignore[arg-type]  # a ClipStore with a cache
                                     lag=batch_size * (ahead + 1))
    if threads is not None:
        extra = sorted(set(kw) - {"timeout"})
        if extra:
            raise ValueError(f"a threaded loader takes no {', '.join(extra)} (only timeout besides the named options)")
        return ThreadedClipLoader(dataset, batch_size=batch_size, sampler=sampler, threads=threads,
                                  prefetch=prefetch_factor, pin_memory=pin_memory,
                                  drop_last=train if drop_last is None else bool(drop_last), **kw)
    if "collate_fn" not in kw and getattr(dataset, "__getitems__", None) is not None:
        kw["collate_fn"] = collate
    if workers > 0:
        kw.setdefault("persistent_workers", persistent_workers)
        kw.setdefault("prefetch_factor", prefetch_factor)
        if start_method is not None:
            kw.setdefault("multiprocessing_context", start_method)
    return ClipDataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                          pin_memory=torch.cuda.is_available() if pin_memory is None else bool(pin_memory),
                          drop_last=train if drop_last is None else bool(drop_last), **kw)


def loader_meter(loader: Any) -> Callable[[], dict]:
    """A function returning what ``loader`` did since its previous call (the first: since it was made).

    ``loader_clips_per_s``: clips its readers produced per second of reading,
    times the number of readers: the rate it could deliver if never kept
    waiting. ``loader_queue_depth`` (reader threads only): mean number of
    batches ready when one was asked for, 0 to its prefetch; near 0 the loader
    is the limit, near prefetch the consumer is. A ``DataLoader`` over a
    ``ClipDataset`` reports clips/s (its workers add to the dataset's shared
    counters); anything else reports nothing.
    """
    if isinstance(loader, ThreadedClipLoader):
        def threaded() -> dict:
            s = loader.stats()
            return {"loader_clips_per_s": s["clips_per_s"], "loader_queue_depth": s["queue_depth"]}

        return threaded
    work = getattr(getattr(loader, "dataset", None), "read_work", None)
    if not callable(work):
        return dict
    seen = [0, 0.0]  # the first call reports everything read since the dataset was made
    parallel = max(1, getattr(loader, "num_workers", 0))

    def processes() -> dict:
        clips, seconds = work()
        d_clips, d_seconds = clips - seen[0], seconds - seen[1]
        seen[:] = clips, seconds
        return {"loader_clips_per_s": d_clips * parallel / d_seconds if d_seconds > 0 else None}

    return processes


__all__ = ["ClipDataLoader", "build_loader", "default_threads", "default_workers", "loader_meter"]
