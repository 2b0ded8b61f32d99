"""``build_loader``: a DataLoader with the defaults this project's readers want.

Every default can be overridden; anything else goes to ``DataLoader`` as is.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from .dataset import collate
from .sampler import DistributedClipSampler

START_METHODS = ("fork", "spawn", "forkserver")


def _cpus() -> int:
    # CPUs this process may run on (a SLURM / container limit), falling back to all of them.
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    """CPUs per local rank (``LOCAL_WORLD_SIZE``, default 1), at most 8."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "1")
    try:
        ranks = max(1, int(local))
    except ValueError as exc:
        raise ValueError(f"LOCAL_WORLD_SIZE must be an integer, got {local!r}") from exc
    return max(0, min(_cpus() // ranks, 8))


def build_loader(dataset: Dataset, *, batch_size: int, sampler: Sampler | None = None, train: bool = True,
                 workers: int | None = None, pin_memory: bool | None = None, persistent_workers: bool = True,
                 prefetch_factor: int = 4, drop_last: bool | None = None, start_method: str | None = None,
                 **kw: Any) -> DataLoader:
    """A DataLoader over ``dataset``.

    Defaults: ``sampler`` a ``DistributedClipSampler`` (shuffled in training,
    in order for evaluation; yields (epoch, index), so call
    ``loader.sampler.set_epoch(e)`` each epoch); ``workers`` =
    ``default_workers()``; ``pin_memory`` when CUDA is available;
    ``drop_last`` in training only; ``start_method`` the platform's. A dataset
    with a batched ``__getitems__`` gets the matching ``collate`` unless
    ``collate_fn`` is given. ``persistent_workers`` and ``prefetch_factor``
    apply only with workers.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if start_method is not None and start_method not in START_METHODS:
        raise ValueError(f"start_method must be None or one of {', '.join(START_METHODS)}, got {start_method!r}")
    workers = default_workers() if workers is None else workers
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an int >= 0, got {workers!r}")
    if prefetch_factor < 1:
        raise ValueError(f"prefetch_factor must be >= 1, got {prefetch_factor}")
    if "shuffle" in kw:
        raise ValueError("shuffle is the sampler's job: pass sampler=DistributedClipSampler(..., shuffle=...)")
    if sampler is None:
        seed = getattr(getattr(dataset, "preset", None), "seed", 0)
        sampler = DistributedClipSampler(len(dataset), shuffle=train, seed=seed)
    if "collate_fn" not in kw and getattr(dataset, "__getitems__", None) is not None:
        kw["collate_fn"] = collate
    if workers > 0:
        kw.setdefault("persistent_workers", persistent_workers)
        kw.setdefault("prefetch_factor", prefetch_factor)
        if start_method is not None:
            kw.setdefault("multiprocessing_context", start_method)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                      pin_memory=torch.cuda.is_available() if pin_memory is None else bool(pin_memory),
                      drop_last=train if drop_last is None else bool(drop_last), **kw)


__all__ = ["build_loader", "default_workers"]
