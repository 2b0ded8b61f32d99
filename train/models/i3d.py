"""I3D-R50: a ResNet-50 inflated to 3-D, in mmaction2's layout (``configs/_base_/models/i3d_r50.py``).

Carreira and Zisserman 2017 ("Quo Vadis, Action Recognition?") inflate an
ImageNet network's 2-D kernels to 3-D; mmaction2's I3D-R50 does so for
ResNet-50, and this is that network:

* ``conv1``: 5x7x7, stride (2, 2, 2), padding (2, 3, 3), 64 channels, BatchNorm, ReLU;
* ``maxpool``: 1x3x3, stride (2, 2, 2), padding (0, 1, 1) (time halved again);
* four stages of bottleneck blocks (3, 4, 6, 3; widths 64, 128, 256, 512,
  expansion 4; the first block of stages 2-4 strides 2 in space, never in
  time), with a 2x1x1 max-pool, stride (2, 1, 1), after the first stage;
* in a block, ``conv1`` (1x1 in ResNet-50) is inflated to 3x1x1 (temporal
  padding 1) in the pattern (1, 1, 1) / (1, 0, 1, 0) / (1, 0, 1, 0, 1, 0) /
  (0, 1, 0), otherwise 1x1x1; ``conv2`` is 1x3x3 with the block's spatial
  stride (stride on the 3x3, as torchvision's ResNet-50 v1.5 and mmaction2's
  ``pytorch`` style), ``conv3`` 1x1x1; the shortcut a 1x1x1 convolution with
  the spatial stride;
* convolutions without bias, each followed by BatchNorm; global average
  pooling, dropout 0.5, a linear classifier (mmaction2's ``I3DHead``).

28,043,472 parameters at 400 classes. The parameter names are torchvision's
ResNet-50's (``conv1``, ``bn1``, ``layerN.M.conv1``/``bn1``/``conv2``/``bn2``/
``conv3``/``bn3``, ``layerN.M.downsample.0``/``.1``, ``fc``), so an ImageNet
ResNet-50 state dict inflates into it key by key (``train.models.inflate``).
A 64-frame clip leaves 8 frames at the last stage; the pools need at least 5
frames in.
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import Conv3d, PooledResNet, scaled

STAGES = (64, 128, 256, 512)
BLOCKS = (3, 4, 6, 3)
EXPANSION = 4
# Which blocks of each stage get a 3x1x1 first convolution (mmaction2's i3d_r50 ``inflate``).
INFLATE = ((1, 1, 1), (1, 0, 1, 0), (1, 0, 1, 0, 1, 0), (0, 1, 0))
FEATURES = ("pool",)  # the globally pooled features before the classifier (2048 at width 1)
CLASSIFIER_PREFIX = "fc."


class Bottleneck(nn.Module):
    """1x1x1 or 3x1x1 (``inflate``), 1x3x3 with the spatial ``stride``, 1x1x1 to ``planes`` x 4; BN after each."""

    def __init__(self, c_in: int, planes: int, *, stride: int = 1, inflate: bool = False) -> None:
        super().__init__()
        c_out = planes * EXPANSION
        t = 3 if inflate else 1
        self.conv1 = Conv3d(c_in, planes, kernel_size=(t, 1, 1), padding=(t // 2, 0, 0), bias=False)
        self.bn1 = nn.BatchNorm3d(planes)
        self.conv2 = Conv3d(planes, planes, kernel_size=(1, 3, 3), stride=(1, stride, stride), padding=(0, 1, 1),
                            bias=False)
        self.bn2 = nn.BatchNorm3d(planes)
        self.conv3 = Conv3d(planes, c_out, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm3d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(
                Conv3d(c_in, c_out, kernel_size=1, stride=(1, stride, stride), bias=False), nn.BatchNorm3d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out: torch.Tensor = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.relu(self.bn3(self.conv3(out)) + identity)
        return out


class I3DResNet50(PooledResNet):
    """I3D-R50 for clips shaped (N, 3, T, H, W); returns logits (N, num_classes). See the module docstring.

    Args:
        num_classes: size of the classifier (``fc``).
        width: multiplier on every channel count (1.0: the network above; smaller for cheap tests).
        dropout: before the classifier (mmaction2's I3DHead: 0.5).

    Initialised as mmaction2 does: He (fan-out) convolutions, BatchNorm to
    identity, the classifier from N(0, 0.01) with zero bias; ``--inflate-from``
    then replaces every convolution and BatchNorm with ImageNet's.
    """

    def __init__(self, num_classes: int, *, width: float = 1.0, dropout: float = 0.5) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be positive, got {num_classes}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        stem = scaled(64, width)
        self.conv1 = Conv3d(3, stem, kernel_size=(5, 7, 7), stride=(2, 2, 2), padding=(2, 3, 3), bias=False)
        self.bn1 = nn.BatchNorm3d(stem)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool3d(kernel_size=(1, 3, 3), stride=(2, 2, 2), padding=(0, 1, 1))
        self.pool2 = nn.MaxPool3d(kernel_size=(2, 1, 1), stride=(2, 1, 1))
        c_in = stem
        stages = []
        for i, (planes, blocks, pattern) in enumerate(zip(STAGES, BLOCKS, INFLATE)):
            p = scaled(planes, width)
            layer = []
            for j in range(blocks):
                layer.append(Bottleneck(c_in, p, stride=2 if i > 0 and j == 0 else 1, inflate=bool(pattern[j])))
                c_in = p * EXPANSION
            stages.append(nn.Sequential(*layer))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.add_head(c_in, num_classes, dropout)

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        """conv1, BN, ReLU and the first max-pool."""
        out: torch.Tensor = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return out

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        """Everything before the global pooling: (N, 2048 x width, T', H', W')."""
        x = self.pool2(self.layer1(self.stem(x)))
        out: torch.Tensor = self.layer4(self.layer3(self.layer2(x)))
        return out


def i3d_r50(num_classes: int, *, width: float = 1.0, dropout: float = 0.5, clip_len: int = 32,
            crop_size: int = 224) -> I3DResNet50:
    """I3D-R50 (``clip_len``/``crop_size`` unused: the pooling adapts, from 5 frames up)."""
    return I3DResNet50(num_classes, width=width, dropout=dropout)


__all__ = ["CLASSIFIER_PREFIX", "FEATURES", "INFLATE", "Bottleneck", "I3DResNet50", "i3d_r50"]
