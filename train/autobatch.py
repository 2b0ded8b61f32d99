"""``--batch-size auto``: the largest per-GPU batch that fits, with headroom.

Activation memory grows linearly with the batch, so two small trial steps
(forward, backward and an optimizer step, under the chosen autocast) give the
fixed and per-clip costs; the prediction is then tried and shrunk by 10% on
out-of-memory until a trial fits. The answer is the largest batch whose peak
stays under ``headroom`` x the GPU's memory, rounded down to a multiple of the
accumulation steps (a batch is split into that many micro-batches, so the
largest micro-batch that fits sets the limit). Under torchrun every rank probes
its own GPU and all take the smallest answer.

This needs CUDA: on the CPU memory is virtual and an oversized batch swaps
rather than failing, so there is nothing safe to measure.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from .errors import TrainError


def plan_batch(peak_at: Callable[[int], int | None], capacity: int, *, start: int = 2,
               limit: int = 4096, refine: int = 6) -> int:
    """Largest batch ``b`` with ``peak_at(b) <= capacity`` (``peak_at`` returns None when ``b`` does not fit).

    Assumes peak memory is close to affine in ``b``: two probes predict the
    answer, which is then tried and shrunk by 10% until it fits. When a
    shrink was needed (something other than the memory model set the limit,
    such as a kernel that fails on large activations), the gap between the
    largest fit and the smallest failure is bisected, at most ``refine`` probes.
    """
    lo_b, hi_b = start, 2 * start
    p_lo, p_hi = peak_at(lo_b), peak_at(hi_b)
    if p_lo is None or p_lo > capacity:
        b = lo_b - 1
        while b >= 1:
            p = peak_at(b)
            if p is not None and p <= capacity:
                return b
            b -= 1
        raise TrainError("--batch-size auto: not even one clip fits on this GPU with the chosen settings")
    if p_hi is None or p_hi > capacity:
        return lo_b
    per_clip = max((p_hi - p_lo) / (hi_b - lo_b), 1.0)
    guess = min(limit, int(hi_b + (capacity - p_hi) / per_clip))
    best = hi_b
    failed = None
    b = guess
    while b > best:
        p = peak_at(b)
        if p is not None and p <= capacity:
            best = b
            break
        failed = b
        b = max(best, int(b * 0.9))
    for _ in range(refine if failed is not None else 0):
        if failed is None or failed - best <= 1:
            break
        mid = (best + failed) // 2
        p = peak_at(mid)
        if p is not None and p <= capacity:
            best = mid
        else:
            failed = mid
    return best


# Messages of errors that mean "this batch is too large for the GPU", not "this code is wrong":
# the caching allocator's out-of-memory; cuDNN failing to get or use workspace or finding no
# engine for a huge 3D convolution (CUDNN_STATUS_*, CUDNN_BACKEND_*, "unable to find an engine");
# cuBLAS failing to allocate; kernels whose launch grid or 32-bit indexing overflows on very
# large activations ("invalid configuration argument", canUse32BitIndexMath, INT_MAX).
TOO_LARGE = ("out of memory", "CUDNN_STATUS_", "CUDNN_BACKEND_", "unable to find an engine",
             "CUBLAS_STATUS_ALLOC_FAILED", "invalid configuration argument", "32BitIndexMath", "32-bit index",
             "INT_MAX")


def too_large(exc: BaseException) -> bool:
    """Whether ``exc`` (from a trial step) says the batch does not fit, rather than a bug to re-raise."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(m.lower() in text.lower() for m in TOO_LARGE)


class AllocatorMemory(Protocol):
    """The allocator calls a probe makes: ``CudaMemory`` (the class itself) or a test's fake."""

    def total(self, device: torch.device) -> int: ...

    def reset(self, device: torch.device) -> None: ...

    def peak(self, device: torch.device) -> int: ...

    def release(self) -> None: ...


class CudaMemory:
    """The allocator calls a probe makes; tests pass a fake with the same methods."""

    @staticmethod
    def total(device: torch.device) -> int:
        return torch.cuda.get_device_properties(device).total_memory

    @staticmethod
    def reset(device: torch.device) -> None:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)

    @staticmethod
    def peak(device: torch.device) -> int:
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)

    @staticmethod
    def release() -> None:
        torch.cuda.empty_cache()


def probe_peak(model: nn.Module, batch: int, shape: tuple[int, int, int], num_classes: int,
               device: torch.device, amp_dtype: torch.dtype | None, channels_last: bool,
               memory: AllocatorMemory = CudaMemory) -> int | None:
    """Peak bytes of one training step at ``batch`` clips of ``(T, H, W)``, or None when it does not fit.

    "Does not fit" is any error ``too_large`` recognises; anything else is re-raised.
    """
    memory.reset(device)
    x = y = out = opt = None
    try:
        x = torch.randn(batch, 3, *shape, device=device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last_3d)
        y = torch.randint(0, num_classes, (batch,), device=device)
        opt = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9)  # holds a momentum buffer, as training does
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            out = model(x)
        nn.functional.cross_entropy(out.float(), y).backward()
        opt.step()
        peak = memory.peak(device)
    except RuntimeError as exc:
        if not too_large(exc):
            raise
        peak = None
    finally:
        model.zero_grad(set_to_none=True)
        x = y = out = opt = None  # free the trial's tensors before the next one
        memory.release()
    return peak


def find_batch_size(model: nn.Module, *, shape: tuple[int, int, int], num_classes: int, device: torch.device,
                    amp_dtype: torch.dtype | None, channels_last: bool, headroom: float = 0.9,
                    accum_steps: int = 1, memory: AllocatorMemory = CudaMemory) -> tuple[int, dict]:
    """(per-process batch, details) for ``--batch-size auto``; the model itself is left untouched.

    Runs on this process alone, with no collective: call it before SyncBatchNorm
    conversion and DDP wrapping (whose forward passes talk to the other ranks),
    then agree on the answer with ``agree_on_batch``.
    """
    if device.type != "cuda" and memory is CudaMemory:
        raise TrainError("--batch-size auto needs a CUDA device (on the CPU there is no memory limit to probe; "
                         "pass a number)")
    if not 0 < headroom <= 1:
        raise TrainError(f"--auto-headroom must be in (0, 1], got {headroom}")
    # Probe a copy, so the real model keeps no gradients or optimizer state;
    # the real one stays resident meanwhile, which makes the answer cautious
    # by one model's weights.
    holder = {"model": copy.deepcopy(model).to(device)}
    total = memory.total(device)
    # The headroom covers what the probe does not allocate: pinned prefetch,
    # the allocator's fragmentation and NCCL buffers.
    capacity = int(headroom * total)
    cache: dict[int, int | None] = {}

    def peak_at(b: int) -> int | None:
        if b not in cache:
            cache[b] = probe_peak(holder["model"], b, shape, num_classes, device, amp_dtype, channels_last, memory)
        return cache[b]

    # cuDNN's autotuner off while probing: with it on, every new batch size
    # re-tunes each 3D convolution, and one probe took longer than the whole
    # search with it off (on an H200: docs/benchmarks.md); the trainer's
    # first steps tune for the batch chosen.
    was = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        micro = plan_batch(peak_at, capacity)
    finally:
        torch.backends.cudnn.benchmark = was
        holder.clear()
        memory.reset(device)
    batch = micro * accum_steps
    return batch, {"micro_batch": micro, "batch": batch, "capacity_bytes": capacity, "total_bytes": total,
                   "probes": {b: p for b, p in sorted(cache.items())}}


def agree_on_batch(local: int | TrainError, reduce_min: Callable[[float], float]) -> int:
    """The smallest batch over all ranks, from one all-reduce; every rank raises if any rank found none.

    ``local`` is this rank's answer, or the TrainError its probe raised (sent as 0,
    so the other ranks learn of it instead of waiting in a collective).
    """
    agreed = int(reduce_min(0.0 if isinstance(local, TrainError) else float(local)))
    if isinstance(local, TrainError):
        raise local
    if agreed < 1:
        raise TrainError("--batch-size auto: another rank found no batch that fits on its GPU (see its error)")
    return agreed
