"""How many batches a training epoch has, for the trainer and every loader, and DALI's sharding arithmetic.

No DALI import here: the trainer sizes its epochs (``train.config``) with
these before any loader exists, on machines without DALI too.

``epoch_steps`` is the one count: a rank's share of ``samples`` cut into
batches, the partial last batch either dropped (the samplers' loaders,
DataLoader's ``drop_last``, DALI's source route) or padded to a whole batch
(DALI's ``pad_last_batch``, the native TFRecord route). ``shard_sizes`` and
``padded_steps`` are the native route's sharding: contiguous ranges of the
records, every shard padded to the largest one, in whole batches.
"""

from __future__ import annotations


def epoch_steps(samples: int, batch_size: int, *, pad_last_batch: bool) -> int:
    """Batches of an epoch of ``samples`` (one rank's): the partial last one dropped, or padded to a whole one."""
    if pad_last_batch:
        return -(-samples // batch_size)
    return samples // batch_size


def shard_sizes(clips: int, world_size: int) -> list[int]:
    """Clips per rank in DALI's sharding (contiguous ranges, ``clips * r // world_size`` onwards)."""
    return [clips * (r + 1) // world_size - clips * r // world_size for r in range(world_size)]


def padded_steps(clips: int, world_size: int, batch_size: int) -> int:
    """Batches per rank per epoch with ``pad_last_batch``: every shard padded to the largest, in whole batches."""
    return epoch_steps(max(shard_sizes(clips, world_size)), batch_size, pad_last_batch=True)


__all__ = ["epoch_steps", "padded_steps", "shard_sizes"]
