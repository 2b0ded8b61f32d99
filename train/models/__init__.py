"""The networks the trainer builds, by name: ``MODELS`` (the registry), ``build_model`` (the one builder).

    from train.models import build_model
    model = build_model("r3d_18", num_classes=400, clip_len=16, crop_size=112, width=1.0)

Entries (``--model``): ``c3d`` (the default), ``r3d_18``, ``mc3_18``,
``r2plus1d_18`` (torchvision's video ResNets, with torchvision's parameter
names) and ``i3d_r50`` (mmaction2's I3D-R50, inflatable from a 2-D
ResNet-50's ImageNet weights). Each is a ``ModelSpec`` (``registry``): how to
build it, the input it needs, its normalisation, classifier, features,
parameters and FLOPs. Every network returns logits from ``forward`` and
``(features, logits)`` from ``features_and_logits`` (``VideoModel``).

Modules: ``layers`` (the guarded ``Conv3d``, the width multiplier), ``c3d``,
``resnet3d``, ``i3d``, ``finetune`` (``--finetune``'s loading), ``inflate``
(``--inflate-from``), ``registry``.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .finetune import load_for_finetuning, strip_prefixes
from .inflate import inflate_into, inflate_kernel, inflated_state, read_state_dict
from .layers import count_parameters, scaled
from .registry import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    MODELS,
    OPTIONS,
    ModelSpec,
    build_model,
    flops_per_clip,
    model_spec,
)


class VideoModel(Protocol):
    """What every network of the registry offers besides ``forward`` (clips in, logits out)."""

    def features_and_logits(self, x: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(the video features named in its ``ModelSpec.features``, each (N, F); the logits (N, classes))."""
        ...


__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "MODELS", "OPTIONS", "ModelSpec", "VideoModel", "build_model",
           "count_parameters", "flops_per_clip", "inflate_into", "inflate_kernel", "inflated_state",
           "load_for_finetuning", "model_spec", "read_state_dict", "scaled", "strip_prefixes"]
