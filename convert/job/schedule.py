"""Run a plan's shards in parallel: joblib on this machine, or joblib's Dask backend on a cluster."""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..format.system import cpu_count
from ..options import JobOptions
from ..worker.plan import Plan
from .supervise import run_shard

SIZE_SAMPLE = 64  # videos per shard whose file size is read to weigh it


def _source_bytes(items: list) -> float:
    """A shard's decoding work, roughly: its videos' file sizes (a sample of them, scaled to all)."""
    if not items:
        return 0.0
    sample = items[::max(1, len(items) // SIZE_SAMPLE)][:SIZE_SAMPLE]
    sizes = []
    for item in sample:
        try:
            sizes.append(os.stat(item.path).st_size)
        except OSError:
            sizes.append(0)  # missing or unreadable: the shard records why, at no decoding cost
    return sum(sizes) / len(sizes) * len(items)


def run_shards(out: str, plan: Plan, opts: JobOptions, indices: Iterable[int] | None = None,
               retry: dict[int, list[int]] | None = None) -> list[dict]:
    """Run the shards ``indices`` (default: all of the plan); their summaries, in any order.

    ``retry`` maps a shard to the videos it converts again despite their records.
    """
    workers = opts.workers or cpu_count()
    indices = range(len(plan.shards)) if indices is None else sorted(indices)
    if len(indices) > workers:
        # Longest first: a worker that draws a short shard last does not leave
        # the others waiting on a long one (the plan's order left a core idle
        # at the end of a job: docs/benchmarks.md).
        weight = {i: _source_bytes(plan.shards[i]) for i in indices}
        indices = sorted(indices, key=lambda i: -weight[i])
    retry = retry or {}
    # joblib schedules the shards on every machine: its threading backend here
    # (a supervisor only waits on its shard process's pipe; the decoding runs
    # in the shard processes, one per core), its Dask backend on a cluster.
    # Importing joblib is a noticeable part of a job's start-up, which is why
    # it is imported here and not with the module.
    from joblib import Parallel, delayed, parallel_config

    # Each task carries its shard's part of the plan (to a Dask worker too): no shard's supervisor or process
    # reads plan.json.
    tasks = [delayed(run_shard)(out, plan.shard(i), opts.shard, retry.get(i, ())) for i in indices]
    if opts.dask:
        from dask.distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=workers, threads_per_worker=1) if opts.dask == "local" else None
        with Client(cluster or opts.dask), parallel_config(backend="dask"):
            results = list(Parallel(return_as="generator_unordered")(tasks))
        if cluster is not None:
            cluster.close()
        return results
    return list(Parallel(n_jobs=min(workers, len(tasks)), backend="threading", return_as="generator_unordered")(tasks))


__all__ = ["run_shards"]
