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
from typing import Callable

import torch
from torch import nn

from .errors import TrainError


def plan_batch(peak_at: Callable[[int], int | None], capacity: int, *, start: int = 2,
               limit: int = 4096) -> int:
    """Largest batch ``b`` with ``peak_at(b) <= capacity`` (``peak_at`` returns None when ``b`` does not fit).

    Assumes peak memory is close to affine in ``b``: two probes predict the
    answer, which is then tried and shrunk by 10% until it fits.
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
    b = guess
    while b > best:
        p = peak_at(b)
        if p is not None and p <= capacity:
            best = b
            break
        b = max(best, int(b * 0.9))
    return best


def probe_peak(model: nn.Module, batch: int, shape: tuple[int, int, int], num_classes: int,
               device: torch.device, amp_dtype: torch.dtype | None, channels_last: bool) -> int | None:
    """Peak bytes of one training step at ``batch`` clips of ``(T, H, W)``, or None on out-of-memory."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
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
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    except torch.cuda.OutOfMemoryError:
        peak = None
    finally:
        model.zero_grad(set_to_none=True)
        x = y = out = opt = None  # noqa: F841 - free the trial's tensors before the next one
        torch.cuda.empty_cache()
    return peak


def find_batch_size(model: nn.Module, *, shape: tuple[int, int, int], num_classes: int, device: torch.device,
                    amp_dtype: torch.dtype | None, channels_last: bool, headroom: float = 0.9,
                    accum_steps: int = 1) -> tuple[int, dict]:
    """(per-process batch, details) for ``--batch-size auto``; the model itself is left untouched."""
    if device.type != "cuda":
        raise TrainError("--batch-size auto needs a CUDA device (on the CPU there is no memory limit to probe; "
                         "pass a number)")
    if not 0 < headroom <= 1:
        raise TrainError(f"--auto-headroom must be in (0, 1], got {headroom}")
    # Probe a copy, so the real model keeps no gradients or optimizer state;
    # the real one stays resident meanwhile, which makes the answer cautious
    # by one model's weights.
    holder = {"model": copy.deepcopy(model).to(device)}
    total = torch.cuda.get_device_properties(device).total_memory
    # The headroom covers what the probe does not allocate: pinned prefetch,
    # the allocator's fragmentation and NCCL buffers.
    capacity = int(headroom * total)
    cache: dict[int, int | None] = {}

    def peak_at(b: int) -> int | None:
        if b not in cache:
            cache[b] = probe_peak(holder["model"], b, shape, num_classes, device, amp_dtype, channels_last)
        return cache[b]

    micro = plan_batch(peak_at, capacity)
    holder.clear()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    batch = micro * accum_steps
    return batch, {"micro_batch": micro, "batch": batch, "capacity_bytes": capacity, "total_bytes": total,
                   "probes": {b: p for b, p in sorted(cache.items())}}
