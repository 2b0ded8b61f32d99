"""NVML fields in the training log, with a fake pynvml (no GPU here)."""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import pytest
import torch

from train import gpustats
from train.data import TrainData
from train.engine import StepConfig, TrainState, _log_window
from train.gpustats import GpuStats, format_gpu
from train.metrics import MetricsLog, read_metrics

GIB = 2**30
CUDA0 = torch.device("cuda", 0)


class FakeNvml:
    """The pynvml calls GpuStats makes, answering for one GPU with UUID GPU-abc."""

    def __init__(self, util=93, used=40.1 * GIB, total=141.0 * GIB, fail_init=False):
        self.util, self.used, self.total, self.fail_init = util, used, total, fail_init

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid != "GPU-abc":
            raise RuntimeError("not found")
        return "handle-abc"

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"handle-{index}"

    def nvmlDeviceGetUtilizationRates(self, handle):
        assert handle == "handle-abc"
        return SimpleNamespace(gpu=self.util, memory=50)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=self.used, total=self.total, free=self.total - self.used)


@pytest.fixture
def fake_props(monkeypatch):
    monkeypatch.setattr(gpustats.torch.cuda, "get_device_properties", lambda d: SimpleNamespace(uuid="abc"))


def test_sample_and_format(fake_props):
    stats = GpuStats(CUDA0, nvml=FakeNvml())
    assert stats.available
    sample = stats.sample()
    assert sample == {"gpu_util_pct": 93.0, "gpu_mem_used_mb": pytest.approx(40.1 * 1024),
                      "gpu_mem_total_mb": 141.0 * 1024}
    assert format_gpu(sample) == "gpu 93% 40.1/141.0 GiB"


def test_absent_nvml_leaves_the_fields_out(fake_props, monkeypatch):
    assert GpuStats(torch.device("cpu"), nvml=FakeNvml()).sample() == {}
    assert GpuStats(CUDA0, nvml=FakeNvml(fail_init=True)).sample() == {}
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import raises ImportError
    assert GpuStats(CUDA0).sample() == {} and format_gpu({}) == ""


def test_log_window_records_gpu_fields(fake_props, tmp_path):
    log = MetricsLog(str(tmp_path), enabled=True, tensorboard=False)
    log.start(None)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    data = TrainData(None, None, [], (0.0,), (1.0,), batch_size=4, steps_per_epoch=10, meter=lambda: {})
    cfg = StepConfig(device=torch.device("cpu"), amp_dtype=None, accum_steps=1,
                     gpu=GpuStats(CUDA0, nvml=FakeNvml(util=71)))
    window = {"steps": 2, "finite": 2, "wait": 0.1, "start": time.perf_counter() - 1.0}
    _log_window(torch.tensor(3.0), window, opt, torch.amp.GradScaler("cpu", enabled=False), data,
                TrainState(step=2, epoch_step=2), cfg, log, None, 1)
    (row,) = read_metrics(log.path)
    assert row["loss"] == 1.5 and row["gpu_util_pct"] == 71.0 and row["gpu_mem_used_mb"] == pytest.approx(41062.4)
    cfg_cpu = StepConfig(device=torch.device("cpu"), amp_dtype=None, accum_steps=1, gpu=GpuStats(torch.device("cpu")))
    _log_window(torch.tensor(3.0), window, opt, torch.amp.GradScaler("cpu", enabled=False), data,
                TrainState(step=4, epoch_step=4), cfg_cpu, log, None, 1)
    assert "gpu_util_pct" not in read_metrics(log.path)[1]
