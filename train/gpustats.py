"""GPU utilisation and memory from NVML, logged beside clips/s and data-wait when ``nvidia-ml-py`` is installed;
the GPU's peak FLOP/s for the model FLOPs utilisation (MFU) logged beside them.

``nvidia-ml-py`` (module ``pynvml``, in the ``dali`` extra) is optional: without
it, or on the CPU, or when NVML cannot start (no driver), ``GpuStats.sample``
returns nothing and the fields are left out of the log. NVML numbers GPUs
as the driver does, not as ``CUDA_VISIBLE_DEVICES`` renumbers them, so the GPU
is found by its UUID (what torch reports for the CUDA device).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

# Dense bf16 tensor-core peaks (FLOP/s) by a part of the GPU's name: the denominator of model FLOPs utilisation.
PEAKS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "L4": 121e12}


def peak_flops(device: torch.device) -> float | None:
    """The GPU's dense bf16 peak in FLOP/s, from its name (``PEAKS``); None on the CPU or for another GPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAKS.items() if k in name), None)


class GpuStats:
    """Samples one GPU's utilisation (percent of the last sample period busy) and memory in use."""

    def __init__(self, device: torch.device, nvml: Any = None) -> None:
        self.nvml: Any = None
        self.handle: Any = None
        if device.type != "cuda":
            return
        try:
            nvml = nvml if nvml is not None else importlib.import_module("pynvml")
        except ImportError:
            return
        try:
            nvml.nvmlInit()
            self.handle = _handle(nvml, device)
            self.nvml = nvml
        except Exception:  # noqa: BLE001 - pynvml.NVMLError has no common base to import without pynvml
            self.handle = None  # no driver / no permission: the fields are simply not logged

    @property
    def available(self) -> bool:
        return self.handle is not None

    def sample(self) -> dict[str, float]:
        """``{"gpu_util_pct", "gpu_mem_used_mb", "gpu_mem_total_mb"}``, or ``{}`` without NVML."""
        if self.handle is None:
            return {}
        util = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
        mem = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
        return {"gpu_util_pct": float(util.gpu), "gpu_mem_used_mb": mem.used / 2**20,
                "gpu_mem_total_mb": mem.total / 2**20}


def _handle(nvml: Any, device: torch.device) -> Any:
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is not None:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except Exception:  # noqa: BLE001, S110 - an older NVML or another UUID format: fall back to the index
            pass
    return nvml.nvmlDeviceGetHandleByIndex(device.index or 0)


def format_gpu(sample: dict[str, float]) -> str:
    """``"gpu 93% 40.1/141.0 GiB"`` for the progress bar, or ``""`` without a sample."""
    if not sample:
        return ""
    return (f"gpu {sample['gpu_util_pct']:.0f}% {sample['gpu_mem_used_mb'] / 1024:.1f}/"
            f"{sample['gpu_mem_total_mb'] / 1024:.1f} GiB")
