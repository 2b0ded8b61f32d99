"""Optimizer and learning-rate schedule, both stepped once per optimizer step.

The paper's recipe (``--schedule step``, the default): SGD with momentum 0.9,
lr 0.003 for mini-batches of 30 clips, divided by 10 every 4 epochs
(``--lr-step-epochs 4 --lr-gamma 0.1``), 16 epochs. ``--lr`` is given for a
global batch of ``--lr-ref-batch`` clips (30) and scaled to the real global
batch (batch x processes): linearly (``--lr-scaling linear``, the default),
by the square root (``sqrt``) or not at all (``none``), then capped at
``--max-lr``. ``--schedule cosine`` decays to 0 over ``--epochs``.

Warm-up: ``--warmup-steps`` / ``--warmup-epochs`` ramp linearly from 0. When
neither is given and the scaled lr is above ``--lr``, a warm-up is added by
default (``plan_lr``), ramping from ``--lr`` to the scaled lr: a large batch
with a linearly scaled lr diverges in its first steps without one (Goyal et
al. 2017, "Accurate, Large Minibatch SGD": 5 epochs, from the reference lr).

The schedule's length comes from ``--epochs``, never from ``--max-steps``:
stopping early and resuming must not change the learning rate of any step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .errors import TrainError

SCALINGS = ("linear", "sqrt", "none")
SCHEDULES = ("step", "cosine", "constant")
# The default warm-up, in epochs: Goyal et al.'s 5, but at most a quarter of the
# run, and over before the step schedule's first decay (at most half its
# period), so the peak lr is trained at for a while. The paper's 16 epochs with
# a step every 4 give 2 epochs.
AUTO_WARMUP_EPOCHS = 5.0


def scaled_lr(base_lr: float, global_batch: int, ref_batch: int, scaling: str) -> float:
    """``base_lr`` (given for ``ref_batch`` clips) for ``global_batch`` clips per step."""
    if scaling == "linear":
        return base_lr * global_batch / ref_batch
    if scaling == "sqrt":
        return base_lr * math.sqrt(global_batch / ref_batch)
    if scaling == "none":
        return base_lr
    raise TrainError(f"--lr-scaling {scaling}: expected one of {', '.join(SCALINGS)}")


@dataclass(frozen=True)
class LrPlan:
    """The peak learning rate, the warm-up towards it, and one line saying why."""

    lr: float
    warmup_steps: int
    warmup_from: float  # the warm-up's first factor of ``lr`` is warmup_from + (1 - warmup_from) / warmup_steps
    why: str


def plan_lr(*, base_lr: float, global_batch: int, ref_batch: int, scaling: str, max_lr: float | None,
            warmup_steps: int | None, warmup_epochs: float | None, steps_per_epoch: int, epochs: int,
            schedule: str, step_epochs: float) -> LrPlan:
    """Scale ``--lr`` to the global batch, cap it, and choose the warm-up (see the module docstring)."""
    if ref_batch < 1:
        raise TrainError(f"--lr-ref-batch must be at least 1, got {ref_batch}")
    if max_lr is not None and max_lr <= 0:
        raise TrainError(f"--max-lr must be positive, got {max_lr}")
    scaled = scaled_lr(base_lr, global_batch, ref_batch, scaling)
    lr = scaled
    why = f"lr {lr:.4g}"
    if scaling != "none" and global_batch != ref_batch:
        ratio = f"{global_batch}/{ref_batch}" if scaling == "linear" else f"sqrt({global_batch}/{ref_batch})"
        why += f" = --lr {base_lr:g} x {ratio} ({scaling} scaling to the global batch {global_batch})"
    else:
        why += " (--lr as given)"
    if max_lr is not None and scaled > max_lr:
        lr = max_lr
        why = f"lr {lr:.4g}: --max-lr caps {why}"
    if warmup_steps is not None or warmup_epochs is not None:
        steps = round(warmup_epochs * steps_per_epoch) if warmup_epochs is not None else int(warmup_steps or 0)
        if steps < 0:
            raise TrainError(f"warm-up must be >= 0 steps, got {steps}")
        why += f"; warm-up {steps} steps from 0 (as asked)" if steps else "; no warm-up (as asked)"
        return LrPlan(lr, steps, 0.0, why)
    if lr <= base_lr:
        return LrPlan(lr, 0, 0.0, why + "; no warm-up (the lr is not above --lr)")
    limits = [AUTO_WARMUP_EPOCHS, epochs / 4]
    if schedule == "step" and step_epochs > 0:
        limits.append(step_epochs / 2)
    epochs_w = min(limits)
    steps = max(1, round(epochs_w * steps_per_epoch))
    why += (f"; warm-up {steps} steps ({epochs_w:g} epochs) from --lr {base_lr:g}, because the lr is above --lr "
            f"(--warmup-steps to choose)")
    return LrPlan(lr, steps, base_lr / lr, why)


def build_optimizer(model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float
                    ) -> torch.optim.Optimizer:
    """SGD (the paper) or AdamW; no weight decay on biases and norm parameters."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
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
              step_epochs: float, gamma: float, warmup_from: float = 0.0) -> float:
    """Multiplier on the peak lr for optimizer step ``step`` (0-based).

    The warm-up multiplies the schedule by a ramp from ``warmup_from`` to 1 over
    ``warmup_steps`` steps (its first step already at ``1/warmup_steps`` of the way).
    """
    if warmup_steps > 0:
        warm = warmup_from + (1.0 - warmup_from) * min(1.0, (step + 1) / warmup_steps)
    else:
        warm = 1.0
    if schedule == "step":
        epoch = step // max(steps_per_epoch, 1)
        return warm * gamma ** int(epoch // step_epochs) if step_epochs > 0 else warm
    if schedule == "cosine":
        span = max(total_steps - warmup_steps, 1)
        progress = min(max(step - warmup_steps, 0) / span, 1.0)
        return warm * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "constant":
        return warm
    raise TrainError(f"--schedule {schedule}: expected one of {', '.join(SCHEDULES)}")


def build_scheduler(optimizer: torch.optim.Optimizer, *, schedule: str, steps_per_epoch: int, epochs: int,
                    warmup_steps: int, step_epochs: float, gamma: float,
                    warmup_from: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over optimizer steps; its state dict holds plain numbers only (a closure, not an object)."""
    total = steps_per_epoch * epochs

    def factor(step: int) -> float:
        return lr_factor(step, schedule=schedule, steps_per_epoch=steps_per_epoch, total_steps=total,
                         warmup_steps=warmup_steps, step_epochs=step_epochs, gamma=gamma, warmup_from=warmup_from)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
