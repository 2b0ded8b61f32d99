"""Optimizer and learning-rate schedule, both stepped once per optimizer step.

The paper's recipe (``--schedule step``, the default): SGD with momentum 0.9,
lr 0.003 for mini-batches of 30 clips, divided by 10 every 4 epochs
(``--lr-step-epochs 4 --lr-gamma 0.1``), 16 epochs. ``--lr`` is given for a
global batch of ``--lr-ref-batch`` clips (30) and scaled linearly to the real
global batch (batch x processes) unless ``--no-lr-scaling``. ``--schedule
cosine`` decays to 0 over ``--epochs``. Both start with a linear warm-up of
``--warmup-steps`` (or ``--warmup-epochs``) optimizer steps.

The schedule's length comes from ``--epochs``, never from ``--max-steps``:
stopping early and resuming must not change the learning rate of any step.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .errors import TrainError


def effective_lr(base_lr: float, global_batch: int, ref_batch: int, scale: bool) -> float:
    """``base_lr`` scaled linearly from ``ref_batch`` to ``global_batch`` clips per step."""
    return base_lr * global_batch / ref_batch if scale else base_lr


def build_optimizer(model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float
                    ) -> torch.optim.Optimizer:
    """SGD (the paper) or AdamW; no weight decay on biases and norm parameters."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=False)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr)
    raise TrainError(f"--optimizer {name}: expected sgd or adamw")


def lr_factor(step: int, *, schedule: str, steps_per_epoch: int, total_steps: int, warmup_steps: int,
              step_epochs: float, gamma: float) -> float:
    """Multiplier on the base lr for optimizer step ``step`` (0-based)."""
    warm = min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    if schedule == "step":
        epoch = step // max(steps_per_epoch, 1)
        return warm * gamma ** int(epoch // step_epochs) if step_epochs > 0 else warm
    if schedule == "cosine":
        span = max(total_steps - warmup_steps, 1)
        progress = min(max(step - warmup_steps, 0) / span, 1.0)
        return warm * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "constant":
        return warm
    raise TrainError(f"--schedule {schedule}: expected step, cosine or constant")


def build_scheduler(optimizer: torch.optim.Optimizer, *, schedule: str, steps_per_epoch: int, epochs: int,
                    warmup_steps: int, step_epochs: float, gamma: float) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over optimizer steps; its state dict holds plain numbers only (a closure, not an object)."""
    total = steps_per_epoch * epochs

    def factor(step: int) -> float:
        return lr_factor(step, schedule=schedule, steps_per_epoch=steps_per_epoch, total_steps=total,
                         warmup_steps=warmup_steps, step_epochs=step_epochs, gamma=gamma)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
