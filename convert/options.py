"""How a job runs (never what it produces): parallelism, shard count, the shard processes' knobs, Dask."""

from __future__ import annotations

from dataclasses import dataclass

from .job.supervise import ShardOptions

# The ranges of the running options (checked as the command line is parsed): wide enough for any real
# job, and each bound what the code can honour (a poll timeout holds its milliseconds in a C int; more
# FFmpeg threads per video only add start-up; a shard process needs some heap before its first video).
MAX_WORKERS = 4096
MAX_SHARDS = 100_000
MAX_TIMEOUT = 7 * 24 * 3600.0  # seconds
MAX_RETRIES = 100
MAX_DECODE_THREADS = 64
MIN_MEMORY = 256 << 20  # bytes


@dataclass(frozen=True)
class JobOptions:
    """How to run (not what to produce): parallelism, timeouts, shard count."""

    workers: int = 0  # 0: every core
    shards: int | None = None
    shard: ShardOptions = ShardOptions()
    dask: str | None = None  # scheduler address, or "local" for a LocalCluster
    progress: bool = True  # the tqdm bar (the command line's choice: on a terminal, without --no-progress)
    # Seconds between progress lines where no bar is drawn (a log, a pipe); None: no lines.
    progress_every: float | None = None


__all__ = ["MAX_DECODE_THREADS", "MAX_RETRIES", "MAX_SHARDS", "MAX_TIMEOUT", "MAX_WORKERS", "MIN_MEMORY",
           "JobOptions"]
