"""One code path for one process or many.

Run as one process::

    python -m train --data OUT ...

On one machine with N GPUs (or N CPU processes with gloo)::

    torchrun --nproc_per_node N -m train --data OUT ...

On several machines, start the same command on every node with a rendezvous
point that all of them reach (``--batch-size`` stays per process, so the
global batch is batch x nodes x nproc_per_node)::

    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d \\
        --rdzv_endpoint HOST0:29400 --rdzv_id JOB42 -m train --data OUT ...

(or the static form: ``--nnodes 2 --node_rank K --master_addr HOST0
--master_port 29500``). torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; this
module reads them, picks ``cuda:LOCAL_RANK`` (nccl) on GPUs and the CPU (gloo)
otherwise, and every rank must see the same ``--data`` and ``--out`` paths
(shared storage) because rank 0 writes checkpoints that all ranks resume from.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .errors import TrainError


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: rank, world size, local rank, its device and the backend."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(name: str, local_rank: int) -> torch.device:
    """``auto`` is this rank's GPU when CUDA is there, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise TrainError(f"--device {name}: CUDA is not available on this machine (use --device cpu)")
        if device.index is None:
            device = torch.device("cuda", local_rank)
        if device.index >= torch.cuda.device_count():
            raise TrainError(f"{device} requested but only {torch.cuda.device_count()} GPU(s) visible")
    elif device.type != "cpu":
        raise TrainError(f"--device {name}: only cpu and cuda are supported")
    return device


def init_distributed(device: str = "auto", backend: str | None = None, timeout_min: float = 30.0) -> DistInfo:
    """Read torchrun's environment, choose the device and start the process group when there are ranks."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
    if backend == "nccl" and dev.type != "cuda":
        raise TrainError("--dist-backend nccl needs CUDA devices; use gloo on the CPU")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        kwargs: dict[str, Any] = {}
        if dev.type == "cuda":
            kwargs["device_id"] = dev  # lets nccl bind its communicator eagerly
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                                timeout=timedelta(minutes=timeout_min), **kwargs)
    return DistInfo(rank, world, local_rank, dev, backend if world > 1 else None)


def cleanup() -> None:
    """Tear the process group down (so a test can run main() twice in one process)."""
    if dist.is_available() and dist.is_initialized():
        # DDP's reducer sits in reference cycles; collect it while the group is
        # alive, or gloo work it holds may be freed during interpreter shutdown,
        # which aborts the process ("terminate called without an active exception").
        gc.collect()
        dist.destroy_process_group()


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    if active():
        dist.barrier()


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (a one-element list without a process group)."""
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce(values: list[float], device: torch.device, op: str = "sum") -> list[float]:
    """Sum (or min/max) a few numbers across ranks, e.g. a logged loss."""
    if not active():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op])
    return t.tolist()
