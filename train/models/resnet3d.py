"""torchvision's video ResNets, defined here with torchvision's parameter names: r3d_18, mc3_18, r2plus1d_18.

Tran et al. 2018, "A Closer Look at Spatiotemporal Convolutions for Action
Recognition", as torchvision.models.video builds them: a stem, four stages of
two BasicBlocks (64, 128, 256, 512 channels; the first block of stages 2-4
strides 2 in time and space), global average pooling and one linear
classifier, BatchNorm after every convolution. The three differ in their
convolutions:

* r3d_18: every convolution 3x3x3; the stem 3x7x7, stride (1, 2, 2).
* mc3_18 ("mixed convolutions"): r3d_18's stem and first stage, then 1x3x3
  convolutions only (no temporal convolution, stride (1, s, s)), so time is
  never downsampled after the first stage.
* r2plus1d_18: every 3x3x3 convolution factored into a 1x3x3 spatial one and
  a 3x1x1 temporal one with BatchNorm and ReLU between; the middle width is
  chosen so the pair has the parameters of the 3x3x3 it replaces (45 in the
  stem).

Parameter counts at 400 classes: 33,371,472, 11,695,440 and 31,505,325, as
torchvision's. The names (``stem.0.weight``, ``layer2.0.conv1.0.3.weight``,
``layer3.0.downsample.1.running_mean``, ``fc.weight``) are torchvision's, so a
state dict of torchvision's model loads here (``--finetune``). They are not
imported from torchvision: its wheels on PyPI are CUDA builds whose C
extension does not load against the CPU torch the tests run with.

``width`` multiplies every channel count (the cheap models the tests build);
at 1.0 the networks are torchvision's exactly. ``dropout`` (default 0, as
torchvision) is applied to the pooled features before the classifier. Any
clip of at least one frame and one pixel goes through (the pooling adapts).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .layers import Conv3d, PooledResNet, scaled

STAGES = (64, 128, 256, 512)
BLOCKS = (2, 2, 2, 2)
R2PLUS1D_STEM_MID = 45  # torchvision's (2+1)D stem: 3 -> 45 (1x7x7), 45 -> 64 (3x1x1)
FEATURES = ("pool",)  # the globally pooled features before the classifier (512 at width 1)
CLASSIFIER_PREFIX = "fc."

# A stage's convolution: (in, out, middle width, stride) -> module; its 1x1x1 shortcut's stride for ``stride``.
ConvMaker = Callable[[int, int, int, int], nn.Module]


def conv_3x3x3(c_in: int, c_out: int, mid: int, stride: int) -> nn.Module:
    """A full 3x3x3 convolution (``mid`` unused)."""
    return Conv3d(c_in, c_out, kernel_size=3, stride=stride, padding=1, bias=False)


def conv_1x3x3(c_in: int, c_out: int, mid: int, stride: int) -> nn.Module:
    """A spatial-only 1x3x3 convolution, striding in space only (``mid`` unused)."""
    return Conv3d(c_in, c_out, kernel_size=(1, 3, 3), stride=(1, stride, stride), padding=(0, 1, 1), bias=False)


def conv_2plus1d(c_in: int, c_out: int, mid: int, stride: int) -> nn.Module:
    """1x3x3 (c_in -> mid, spatial stride), BatchNorm, ReLU, 3x1x1 (mid -> c_out, temporal stride).

    Indices 0, 1, 3 hold the weights (2 is the ReLU), as in torchvision's ``Conv2Plus1D``.
    """
    return nn.Sequential(
        Conv3d(c_in, mid, kernel_size=(1, 3, 3), stride=(1, stride, stride), padding=(0, 1, 1), bias=False),
        nn.BatchNorm3d(mid),
        nn.ReLU(inplace=True),
        Conv3d(mid, c_out, kernel_size=(3, 1, 1), stride=(stride, 1, 1), padding=(1, 0, 0), bias=False),
    )


def _shortcut_stride(conv: ConvMaker, stride: int) -> tuple[int, int, int]:
    # A stage without temporal convolutions does not stride in time on its shortcut either.
    return (1, stride, stride) if conv is conv_1x3x3 else (stride, stride, stride)


class BasicBlock(nn.Module):
    """Two convolutions with BatchNorm (``conv1``: conv, BN, ReLU; ``conv2``: conv, BN), plus the shortcut.

    The middle width of a (2+1)D pair is computed once from the block's input
    and output channels and used by both of its convolutions, as torchvision does.
    """

    def __init__(self, c_in: int, c_out: int, conv: ConvMaker, *, stride: int = 1) -> None:
        super().__init__()
        mid = (c_in * c_out * 27) // (c_in * 9 + 3 * c_out)
        self.conv1 = nn.Sequential(conv(c_in, c_out, mid, stride), nn.BatchNorm3d(c_out), nn.ReLU(inplace=True))
        self.conv2 = nn.Sequential(conv(c_out, c_out, mid, 1), nn.BatchNorm3d(c_out))
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(
                Conv3d(c_in, c_out, kernel_size=1, stride=_shortcut_stride(conv, stride), bias=False),
                nn.BatchNorm3d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out: torch.Tensor = self.relu(self.conv2(self.conv1(x)) + identity)
        return out


def basic_stem(c_out: int) -> nn.Sequential:
    """3x7x7 convolution, stride (1, 2, 2), BatchNorm, ReLU (r3d_18, mc3_18)."""
    return nn.Sequential(Conv3d(3, c_out, kernel_size=(3, 7, 7), stride=(1, 2, 2), padding=(1, 3, 3), bias=False),
                         nn.BatchNorm3d(c_out), nn.ReLU(inplace=True))


def r2plus1d_stem(c_out: int, mid: int) -> nn.Sequential:
    """1x7x7 (3 -> mid, stride (1, 2, 2)), BatchNorm, ReLU, 3x1x1 (mid -> c_out), BatchNorm, ReLU."""
    return nn.Sequential(
        Conv3d(3, mid, kernel_size=(1, 7, 7), stride=(1, 2, 2), padding=(0, 3, 3), bias=False),
        nn.BatchNorm3d(mid), nn.ReLU(inplace=True),
        Conv3d(mid, c_out, kernel_size=(3, 1, 1), stride=1, padding=(1, 0, 0), bias=False),
        nn.BatchNorm3d(c_out), nn.ReLU(inplace=True))


class VideoResNet(PooledResNet):
    """A stem, four stages of BasicBlocks (``convs``: one convolution maker per stage), pooling, classifier.

    Clips shaped (N, 3, T, H, W) give logits (N, num_classes). Initialised as
    torchvision does: He (fan-out) for convolutions, BatchNorm to identity,
    the classifier from N(0, 0.01) with zero bias.
    """

    def __init__(self, *, stem: nn.Module, convs: tuple[ConvMaker, ConvMaker, ConvMaker, ConvMaker],
                 num_classes: int, width: float = 1.0, dropout: float = 0.0) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be positive, got {num_classes}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.stem = stem
        c_in = scaled(STAGES[0], width)
        stages = []
        for i, (channels, blocks, conv) in enumerate(zip(STAGES, BLOCKS, convs)):
            c_out = scaled(channels, width)
            stride = 1 if i == 0 else 2
            layer = [BasicBlock(c_in, c_out, conv, stride=stride)]
            layer += [BasicBlock(c_out, c_out, conv) for _ in range(1, blocks)]
            stages.append(nn.Sequential(*layer))
            c_in = c_out
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.add_head(c_in, num_classes, dropout)

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        """The stem and the four stages: (N, 512 x width, T', H', W')."""
        x = self.stem(x)
        out: torch.Tensor = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return out


def r3d_18(num_classes: int, *, width: float = 1.0, dropout: float = 0.0, clip_len: int = 16,
           crop_size: int = 112) -> VideoResNet:
    """R3D-18: 3x3x3 convolutions throughout (``clip_len``/``crop_size`` unused: the pooling adapts)."""
    return VideoResNet(stem=basic_stem(scaled(STAGES[0], width)), convs=(conv_3x3x3,) * 4, num_classes=num_classes,
                       width=width, dropout=dropout)


def mc3_18(num_classes: int, *, width: float = 1.0, dropout: float = 0.0, clip_len: int = 16,
           crop_size: int = 112) -> VideoResNet:
    """MC3-18: 3x3x3 convolutions in the first stage, 1x3x3 in the others."""
    return VideoResNet(stem=basic_stem(scaled(STAGES[0], width)), convs=(conv_3x3x3,) + (conv_1x3x3,) * 3,
                       num_classes=num_classes, width=width, dropout=dropout)


def r2plus1d_18(num_classes: int, *, width: float = 1.0, dropout: float = 0.0, clip_len: int = 16,
                crop_size: int = 112) -> VideoResNet:
    """R(2+1)D-18: every 3x3x3 convolution factored into 1x3x3 and 3x1x1."""
    stem = r2plus1d_stem(scaled(STAGES[0], width), scaled(R2PLUS1D_STEM_MID, width))
    return VideoResNet(stem=stem, convs=(conv_2plus1d,) * 4, num_classes=num_classes, width=width, dropout=dropout)


__all__ = ["CLASSIFIER_PREFIX", "FEATURES", "BasicBlock", "VideoResNet", "mc3_18", "r2plus1d_18", "r3d_18"]
