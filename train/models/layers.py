"""What every network of the registry shares: the guarded ``Conv3d``, the width multiplier, parameter counts."""

from __future__ import annotations

import torch
from torch import nn


def _temporal_out(depth: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    return (depth + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


class Conv3d(nn.Conv3d):
    """``nn.Conv3d`` that runs in float32 under CPU autocast where oneDNN's bfloat16 weight gradient is wrong.

    Why: in PyTorch 2.13's CPU build (still so in 2.14), oneDNN's bfloat16
    Conv3d weight gradient is garbage (NaN, or values around 1e30) when the
    temporal kernel is deeper than the input and the output is at least two
    frames deep (so the padding reaches both ends): C3D's conv5a/conv5b and
    the last stage of the 3-D ResNets at 16-frame clips (a 3-deep kernel over
    2 frames), I3D's 5-deep stem over 3 or 4 frames. The rule was found by
    comparing bf16 with float32 weight gradients over kernel depths 1-5,
    strides, paddings, channel counts and depths 1-8 (1,920 layers: every
    wrong one, and only those, fits it); the forward pass and the input's
    gradient were right in every case. Such layers see few frames, so they
    are a small part of the work; GPUs are unaffected and keep bfloat16.
    ``tests/test_train_model.py`` and ``tests/test_train_models.py`` check the
    gradients of every model against float32.

    Parameter names are ``nn.Conv3d``'s, so state dicts are those of a plain ``nn.Conv3d``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and torch.is_autocast_enabled("cpu") and self._bf16_wrong(x.shape[2]):
            with torch.autocast("cpu", enabled=False):
                return super().forward(x.float())
        return super().forward(x)

    def _bf16_wrong(self, depth: int) -> bool:
        kernel = self.kernel_size[0]
        if depth >= kernel or isinstance(self.padding, str):  # 'same'/'valid' padding: not used in this package
            return False
        out = _temporal_out(depth, kernel, self.stride[0], self.padding[0], self.dilation[0])
        return out >= 2


def scaled(channels: int, width: float) -> int:
    """Channels after the width multiplier (at least 1)."""
    return max(1, round(channels * width))


def init_resnet(model: nn.Module) -> None:
    """The 3-D ResNets' initialisation (torchvision's and mmaction2's): He (fan-out) for every convolution,
    BatchNorm to the identity, each linear layer from N(0, 0.01) with zero bias, in module order."""
    for m in model.modules():
        if isinstance(m, nn.Conv3d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm3d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.01)
            nn.init.zeros_(m.bias)


class PooledResNet(nn.Module):
    """What the 3-D ResNets share after their trunk: global average pooling, dropout, a linear classifier
    (``avgpool``, ``dropout``, ``fc``: torchvision's names), their initialisation (``init_resnet``), and
    ``features_and_logits``/``forward``. A subclass builds its layers, then ``add_head``, and defines ``trunk``."""

    def add_head(self, features: int, num_classes: int, dropout: float) -> None:
        """The pooling, dropout and classifier over ``features`` channels, registered after the trunk's layers
        (so the state dict's order is torchvision's), then every weight initialised."""
        self.avgpool = nn.AdaptiveAvgPool3d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(features, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torchvision's (and mmaction2's) initialisation: ``init_resnet``."""
        init_resnet(self)

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        """Everything before the global pooling: (N, C, T', H', W')."""
        raise NotImplementedError

    def features_and_logits(self, x: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """({"pool": the pooled features}, logits)."""
        pooled = torch.flatten(self.avgpool(self.trunk(x)), 1)
        return {"pool": pooled}, self.fc(self.dropout(pooled))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features_and_logits(x)[1]


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = ["Conv3d", "PooledResNet", "count_parameters", "init_resnet", "scaled"]
