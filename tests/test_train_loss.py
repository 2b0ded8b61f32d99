"""The training loss: label smoothing as torch defines it, and non-finite losses counted, skipped or stopped."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from train import checkpoint as ckpt_io
from train.data import TrainData, build_train_data
from train.dist import DistInfo
from train.engine import StepConfig, TrainState, model_input, train_one_epoch
from train.main import main, run_argv
from train.metrics import MetricsLog, read_metrics
from train.models import MODELS
from train.models.c3d import C3D

from .train_fixtures import common, cpu_config, tiny_data  # noqa: F401

CPU = torch.device("cpu")


def test_label_smoothing_loss_is_torchs(tiny_data, tmp_path):
    """Step 1's logged loss equals CrossEntropyLoss(label_smoothing=0.1) of the model on that batch."""
    argv = common(tiny_data, tmp_path / "ls") + ["--epochs", "1", "--max-steps", "1", "--batch-size", "8",
                                                 "--lr", "0", "--dropout", "0", "--label-smoothing", "0.1"]
    run_argv(argv)
    (row,) = [r for r in read_metrics(str(tmp_path / "ls" / "metrics.jsonl")) if r["kind"] == "train"]
    # The same batch and weights (lr 0 leaves them as initialised), computed here.
    data = build_train_data(cpu_config(argv), DistInfo(0, 1, 0, CPU, None))
    data.set_epoch(0)
    batch = next(iter(data))
    model = C3D(5, width=0.0625, clip_len=16, crop_size=32, dropout=0.0)
    model.load_state_dict(ckpt_io.load(ckpt_io.latest_path(str(tmp_path / "ls")))["model"])
    with torch.no_grad():
        logits = model(model_input(batch["clip"], data.mean, data.std, CPU, False)).float()
    smoothed = float(nn.CrossEntropyLoss(label_smoothing=0.1)(logits, batch["label"]))
    plain = float(nn.CrossEntropyLoss()(logits, batch["label"]))
    assert row["loss"] == pytest.approx(smoothed, rel=1e-6)
    assert abs(smoothed - plain) > 1e-3  # the option really changed the loss


class _NanAt(C3D):
    """C3D whose ``nan_call``-th training forward returns NaN logits."""

    nan_call = 3

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.calls = 0

    def forward(self, x):
        out = super().forward(x)
        if self.training:
            self.calls += 1
            if self.calls == self.nan_call:
                return out * float("nan")
        return out


def test_nonfinite_loss_stops_fp32_run_naming_the_step(tiny_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(MODELS, "c3d", dataclasses.replace(MODELS["c3d"], builder=_NanAt))
    out = tmp_path / "nan"
    code = main(common(tiny_data, out) + ["--epochs", "2", "--batch-size", "8", "--ckpt-every", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "non-finite training loss (nan) at step 3 (epoch 1, step 3 of it) with --amp off" in err
    saved = ckpt_io.load(ckpt_io.latest_path(str(out)))
    assert saved["step"] == 2  # the bad step was never applied or saved
    assert all(torch.isfinite(v).all() for v in saved["model"].values())


class _Batches:
    """Four batches of 2 clips (uint8 N, T, H, W, C), as TrainData yields them."""

    mean, std, batch_size, steps_per_epoch = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), 2, 4

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(self.steps_per_epoch):
            yield {"clip": torch.randint(0, 4, (2, 1, 2, 2, 3), dtype=torch.uint8, generator=g),
                   "label": torch.tensor([0, 1]), "index": torch.tensor([0, 1])}

    def loader_stats(self) -> dict:
        return {}


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        out = self.fc(x.flatten(1))
        return out * float("nan") if self.calls == 2 else out


def test_nonfinite_loss_with_fp16_scaler_is_counted_and_skipped(tmp_path, capsys):
    """A GradScaler (enabled on the CPU here; fp16 on GPUs) skips the NaN step; the run goes on and counts it."""
    torch.manual_seed(0)
    model = _Tiny()
    seen = []

    def criterion(out, y):
        loss = nn.functional.cross_entropy(out, y)
        seen.append(float(loss.detach()))
        return loss

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000)
    weights = []
    opt.register_step_post_hook(lambda *a: weights.append(model.fc.weight.detach().clone()))
    log = MetricsLog(str(tmp_path), enabled=True, tensorboard=False)
    log.start(None)
    state = TrainState()
    cfg = StepConfig(device=CPU, amp_dtype=None, accum_steps=1, log_every=4)
    data = TrainData(_Batches(), None, ["a", "b"], _Batches.mean, _Batches.std, _Batches.batch_size,
                     _Batches.steps_per_epoch, meter=lambda: {})
    stopped = train_one_epoch(model, None, criterion, opt, sched, scaler, data, state, cfg, log,
                              save=lambda st: None)
    assert not stopped and state.step == 4 and state.nonfinite == 1
    assert len(weights) == 3  # the optimizer ran for the three finite steps only
    assert float(scaler.get_scale()) == 512.0  # halved once, for the skipped step
    (row,) = [r for r in read_metrics(log.path) if r["kind"] == "train"]
    finite = [v for v in seen if v == v]
    assert len(finite) == 3 and row["nonfinite_steps"] == 1
    assert row["loss"] == pytest.approx(sum(finite) / 3, rel=1e-6)  # the NaN step is not averaged in
    assert "non-finite training loss (nan) at step 2 (epoch 1, step 2 of it)" in capsys.readouterr().out
