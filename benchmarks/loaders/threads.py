"""``--sections threads``: each reader through ``build_loader(threads=N)``, reader threads in the training process.

Timed in the same interleaved rounds as the DataLoader section
(``common.run_rounds``), so that each thread rate can be divided by the
DataLoader rate of the same round (``common.paired``).
"""

from __future__ import annotations

import argparse

from .common import ON_THE_FLY, Config, DatasetMaker, Results, Rounds, paired, thread_counts


def threaded_names(datasets: dict[str, DatasetMaker]) -> list[str]:
    """The readers timed with reader threads: all but the on-the-fly baseline, the read+copy bound last."""
    return [n for n in datasets if n != ON_THE_FLY]


def configs(names: list[str], args: argparse.Namespace, cpus: int) -> list[Config]:
    """Every reader at every reader-thread count (``thread_counts``)."""
    return [(name, "threads", n) for name in names for n in thread_counts(args.thread_counts, cpus)]


def thread_table(names: list[str], results: Results, dataloader: Results, args: argparse.Namespace, cpus: int,
                 rounds: Rounds | None = None) -> None:
    """Each reader through ``build_loader(threads=N)``, against DataLoader workers and the in-process bound.

    The ratio columns are of the best rounds; the ``med`` columns are the
    medians of the ratios within each round (``paired``), the steadier
    figure on a noisy machine.
    """
    counts = thread_counts(args.thread_counts, cpus)
    rounds = rounds or []
    in_process = dataloader.get((names[-1], 0), {}).get("clips_s")

    def ratio(value: float | None, width: int) -> str:
        return f"{value:{width - 1}.2f}x" if value is not None else f"{'-':>{width}s}"

    print("\nReader threads in the training process (build_loader(threads=N)):")
    print(f"{'reader':22s} {'threads':>7s} {'clips/s':>9s} {'MB/s':>8s} {'x 1 thread':>10s} {'med':>6s} "
          f"{'x DataLoader':>12s} {'med':>6s} {'of bound':>9s}")
    for name in names:
        for n in counts:
            r = results[(name, n)]
            one = results[(name, counts[0])]["clips_s"]
            dl = dataloader.get((name, n))
            of_bound = f"{r['clips_s'] / in_process:8.0%}" if in_process else f"{'-':>9s}"
            print(f"{name:22s} {n:7d} {r['clips_s']:9.1f} {r['mb_s']:8.1f} {ratio(r['clips_s'] / one, 10)} "
                  f"{ratio(paired(rounds, ('threads', name, n), ('threads', name, counts[0])), 6)} "
                  f"{ratio(r['clips_s'] / dl['clips_s'] if dl else None, 12)} "
                  f"{ratio(paired(rounds, ('threads', name, n), ('workers', name, n)), 6)} {of_bound}")
    print("x DataLoader: against as many worker processes as threads; of bound: against the read+copy bound "
          "in one process (0 workers); med: median over rounds of the ratio within a round.")


__all__ = ["configs", "thread_table", "threaded_names"]
