"""C3D (Tran et al., 2015, "Learning Spatiotemporal Features with 3D Convolutional Networks").

Eight 3x3x3 convolutions (64, 128, 256, 256, 512, 512, 512, 512; stride 1,
padding 1), five max-pools (1x2x2 after conv1 so early temporal information is
kept, 2x2x2 after conv2, conv3b, conv4b and conv5b; pool5 padded (0, 1, 1) so a
16x112x112 clip ends as 512x1x4x4 = 8192 features), two 4096-wide fully
connected layers with dropout 0.5, and a classifier. With ``width=1`` and
``bn=False`` the parameter count is 78,409,573 for 101 classes, 79,634,576 for
400 and 79,991,015 for 487 (Sports-1M).

Options beyond the paper: BatchNorm3d after each convolution, a width
multiplier applied to every convolution and to the fc width, and an input size
other than 16x112x112 (fc6's input is sized from it).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from .layers import Conv3d, scaled

CONV_CHANNELS = (64, 128, 256, 256, 512, 512, 512, 512)
CONV_NAMES = ("conv1", "conv2", "conv3a", "conv3b", "conv4a", "conv4b", "conv5a", "conv5b")
FC_WIDTH = 4096
# Pool after these convolutions: (kernel = stride, padding).
POOLS = {
    "conv1": ((1, 2, 2), (0, 0, 0)),
    "conv2": ((2, 2, 2), (0, 0, 0)),
    "conv3b": ((2, 2, 2), (0, 0, 0)),
    "conv4b": ((2, 2, 2), (0, 0, 0)),
    "conv5b": ((2, 2, 2), (0, 1, 1)),
}
CLASSIFIER_PREFIX = "fc8."
FEATURES = ("fc6", "fc7")  # after their ReLU, before dropout: the paper's video features


def _pooled(size: int, kernel: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // kernel + 1


def feature_shape(clip_len: int, crop_size: int) -> tuple[int, int, int]:
    """(T, H, W) of pool5's output for a clip_len x crop_size x crop_size input."""
    t, h, w = clip_len, crop_size, crop_size
    for kernel, pad in POOLS.values():
        t, h, w = _pooled(t, kernel[0], pad[0]), _pooled(h, kernel[1], pad[1]), _pooled(w, kernel[2], pad[2])
    if min(t, h, w) < 1:
        raise ValueError(f"C3D needs at least 16 frames and 16x16 pixels; got {clip_len}x{crop_size}x{crop_size}")
    return t, h, w


class C3D(nn.Module):
    """C3D for clips shaped (N, 3, T, H, W); returns logits (N, num_classes).

    Args:
        num_classes: size of the classifier (fc8).
        width: multiplier on every convolution's channels and on fc6/fc7's width.
        bn: BatchNorm3d after each convolution (the convolution then has no bias).
        clip_len, crop_size: the input the model is built for; fc6's input size follows from them
            (16 and 112 give the paper's 8192).
        dropout: dropout probability after fc6 and fc7 (0.5 in the paper).
    """

    def __init__(self, num_classes: int, *, width: float = 1.0, bn: bool = False, clip_len: int = 16,
                 crop_size: int = 112, dropout: float = 0.5) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be positive, got {num_classes}")
        if width <= 0:
            raise ValueError(f"width must be positive, got {width}")
        self.num_classes, self.width, self.bn = num_classes, width, bn
        self.clip_len, self.crop_size = clip_len, crop_size
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        c_in = 3
        for name, c in zip(CONV_NAMES, CONV_CHANNELS):
            c_out = scaled(c, width)
            layers[name] = Conv3d(c_in, c_out, kernel_size=3, padding=1, bias=not bn)
            if bn:
                layers[name + "_bn"] = nn.BatchNorm3d(c_out)
            layers[name + "_relu"] = nn.ReLU(inplace=True)
            if name in POOLS:
                kernel, pad = POOLS[name]
                layers["pool" + name[4]] = nn.MaxPool3d(kernel, stride=kernel, padding=pad)
            c_in = c_out
        self.features = nn.Sequential(layers)
        t, h, w = feature_shape(clip_len, crop_size)
        fc = scaled(FC_WIDTH, width)
        self.fc6 = nn.Linear(c_in * t * h * w, fc)
        self.fc7 = nn.Linear(fc, fc)
        self.fc8 = nn.Linear(fc, num_classes)
        self.relu = nn.ReLU(inplace=True)
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """He initialisation for the ReLU layers, a small normal for the classifier."""
        for m in self.modules():
            if isinstance(m, (nn.Conv3d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm3d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.fc8.weight, std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with_features(x)[2]

    def features_and_logits(self, x: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """({"fc6", "fc7"}, logits): the video features ``python -m train eval --export`` writes (``FEATURES``)."""
        fc6, fc7, logits = self.forward_with_features(x)
        return {"fc6": fc6, "fc7": fc7}, logits

    def forward_with_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(fc6, fc7, logits): fc6 and fc7 after their ReLU, before dropout (the C3D paper's video features)."""
        x = self.features(x)
        x = torch.flatten(x, 1)
        fc6 = self.relu(self.fc6(x))
        fc7 = self.relu(self.fc7(self.dropout(fc6)))
        return fc6, fc7, self.fc8(self.dropout(fc7))
