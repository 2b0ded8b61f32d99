"""How a job runs (never what it produces): parallelism, shard count, the shard processes' knobs, Dask."""

from __future__ import annotations

from dataclasses import dataclass

from .supervise import ShardOptions


@dataclass(frozen=True)
class JobOptions:
    """How to run (not what to produce): parallelism, timeouts, shard count."""

    workers: int = 0  # 0: every core
    shards: int | None = None
    shard: ShardOptions = ShardOptions()
    dask: str | None = None  # scheduler address, or "local" for a LocalCluster
    progress: bool = True


__all__ = ["JobOptions"]
