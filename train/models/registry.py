"""The registry of networks (``MODELS``, one ``ModelSpec`` per ``--model`` name) and ``build_model``.

Everything the trainer, ``python -m train eval``, the batch-size probe, the
benchmarks and the device check know of a network is here: how to build it,
the input it is specified for and the smallest it takes, its normalisation,
its classifier's parameter prefix, the video features it returns, its
parameter count and its FLOPs per clip. Nothing outside this package names a
model class.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from loaders.presets import KINETICS_MEAN, KINETICS_STD
from loaders.sampling import SampleSpec

from .c3d import C3D
from .c3d import CLASSIFIER_PREFIX as C3D_CLASSIFIER
from .c3d import FEATURES as C3D_FEATURES
from .i3d import CLASSIFIER_PREFIX as I3D_CLASSIFIER
from .i3d import FEATURES as I3D_FEATURES
from .i3d import i3d_r50
from .inflate import as_state_dict, inflate_into, read_state_dict
from .resnet3d import CLASSIFIER_PREFIX as RESNET_CLASSIFIER
from .resnet3d import FEATURES as RESNET_FEATURES
from .resnet3d import mc3_18, r2plus1d_18, r3d_18

# ImageNet's mean/std in 0..255 units: the normalisation of ImageNet-initialised networks (mmaction2's I3D).
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
OPTIONS = ("width", "bn", "dropout")  # the keyword options an entry's builder may take, as the trainer names them


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One network of the registry: ``name`` (its ``--model``), ``title`` (as papers write it), ``summary``.

    ``builder(num_classes, *, clip_len, crop_size, **options)`` makes it for
    clips of ``clip_len`` frames and ``crop_size`` pixels square (``options``
    among ``OPTIONS``, each the builder's keyword: ``width`` multiplies the
    channels, ``bn`` adds BatchNorm, ``dropout`` before the classifier).
    ``clip_len`` x ``crop_size`` is the input the network is specified for
    (its FLOPs are measured there); ``min_clip_len`` and ``min_crop`` the
    smallest it takes. ``mean``/``std``: the input's normalisation, per RGB
    channel in 0..255 units. ``classifier``: the parameter prefix of the
    classifier (``--finetune`` re-initialises it for another class count).
    ``features``: the names of the per-clip video features
    ``features_and_logits`` returns (``python -m train eval --export``).
    ``params_400``: trainable parameters at width 1 with 400 classes.
    ``flops``: forward FLOPs of one clip of ``clip_len`` x ``crop_size``² at
    width 1 (``torch.utils.flop_counter``: convolutions and matrix products,
    one multiply-add = 2 FLOPs; a training step is about 3 times that).
    ``dropout``: the builder's default dropout. ``inflatable``: takes
    ``inflate_from``, 2-D ResNet-50 weights. ``sampling``: the frames of a
    video one sample is in the network's recipe (``loaders.sampling.
    SampleSpec``), what ``--sampling``, ``--clip-len`` and ``--frame-step``
    default to for it (flags override it): every network here reads the
    stored clips by default (a 16-frame conversion's, or for I3D-R50 the
    64-frame one its workload specifies; docs/training.md gives each recipe's
    windows as flags).
    """

    name: str
    title: str
    summary: str
    builder: Callable[..., nn.Module]
    clip_len: int
    crop_size: int
    min_clip_len: int
    min_crop: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    classifier: str
    features: tuple[str, ...]
    params_400: int
    flops: int
    options: tuple[str, ...]
    dropout: float
    inflatable: bool = False
    sampling: SampleSpec = SampleSpec()

    def __post_init__(self) -> None:
        for name in ("clip_len", "crop_size", "min_clip_len", "min_crop", "params_400", "flops"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model {self.name}: {name} must be an integer >= 1, got {value!r}")
        if self.min_clip_len > self.clip_len or self.min_crop > self.crop_size:
            raise ValueError(f"model {self.name}: its minimum input is larger than its input")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"model {self.name}: mean and std are 3 numbers each, std > 0")
        if not self.classifier.endswith("."):
            raise ValueError(f"model {self.name}: classifier is a parameter prefix ending in '.', "
                             f"got {self.classifier!r}")
        unknown = [o for o in self.options if o not in OPTIONS]
        if unknown:
            raise ValueError(f"model {self.name}: unknown options {', '.join(unknown)} (known: {', '.join(OPTIONS)})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model {self.name}: dropout must be in [0, 1), got {self.dropout}")
        if not isinstance(self.sampling, SampleSpec):
            raise ValueError(f"model {self.name}: sampling must be a SampleSpec, got {type(self.sampling).__name__}")

    def input_problem(self, clip_len: int | None, crop_size: int) -> str | None:
        """Why clips of ``clip_len`` frames (None: not known yet, not checked) and ``crop_size``² pixels are too
        small for this network, or None."""
        if (clip_len is None or clip_len >= self.min_clip_len) and crop_size >= self.min_crop:
            return None
        got = f"{crop_size}x{crop_size} pixels" if clip_len is None else f"{clip_len}x{crop_size}x{crop_size}"
        return (f"{self.title} needs at least {self.min_clip_len} frames and {self.min_crop}x{self.min_crop} pixels; "
                f"got {got}")


def _video_resnet(name: str, title: str, summary: str, builder: Callable[..., nn.Module], *, params_400: int,
                  flops: int) -> ModelSpec:
    """An entry for one of torchvision's video ResNets (Tran et al. 2018): what the three share."""
    return ModelSpec(name=name, title=title, summary=f"Tran et al. 2018; torchvision: {summary}", builder=builder,
                     clip_len=16, crop_size=112, min_clip_len=1, min_crop=1, mean=KINETICS_MEAN, std=KINETICS_STD,
                     classifier=RESNET_CLASSIFIER, features=RESNET_FEATURES, params_400=params_400, flops=flops,
                     options=("width", "dropout"), dropout=0.0)


MODELS: dict[str, ModelSpec] = {
    "c3d": ModelSpec(
        name="c3d", title="C3D",
        summary="Tran et al. 2015: eight 3x3x3 convolutions, fc6/fc7 of 4096",
        builder=C3D, clip_len=16, crop_size=112, min_clip_len=16, min_crop=16,
        mean=KINETICS_MEAN, std=KINETICS_STD, classifier=C3D_CLASSIFIER, features=C3D_FEATURES,
        params_400=79_634_576, flops=77_097_205_760, options=("width", "bn", "dropout"), dropout=0.5),
    "r3d_18": _video_resnet("r3d_18", "R3D-18", "ResNet-18 of 3x3x3 convolutions", r3d_18,
                            params_400=33_371_472, flops=81_393_106_944),
    "mc3_18": _video_resnet("mc3_18", "MC3-18", "3x3x3 in the first stage, 1x3x3 after", mc3_18,
                            params_400=11_695_440, flops=86_685_270_016),
    "r2plus1d_18": _video_resnet("r2plus1d_18", "R(2+1)D-18", "1x3x3 then 3x1x1 convolutions", r2plus1d_18,
                                 params_400=31_505_325, flops=81_038_161_920),
    "i3d_r50": ModelSpec(
        name="i3d_r50", title="I3D-R50",
        summary="Carreira and Zisserman 2017; mmaction2's layout: ResNet-50 inflated to 3-D",
        builder=i3d_r50, clip_len=32, crop_size=224, min_clip_len=5, min_crop=1,
        mean=IMAGENET_MEAN, std=IMAGENET_STD, classifier=I3D_CLASSIFIER, features=I3D_FEATURES,
        params_400=28_043_472, flops=66_256_437_248, options=("width", "dropout"), dropout=0.5, inflatable=True),
}


def model_spec(name: str) -> ModelSpec:
    """The registry's entry ``name``; one-line ValueError listing the choices when there is none."""
    spec = MODELS.get(name)
    if spec is None:
        raise ValueError(f"unknown model {name!r} (choose from {', '.join(MODELS)})")
    return spec


def build_model(name: str, *, num_classes: int, clip_len: int, crop_size: int,
                inflate_from: str | os.PathLike[str] | Mapping[str, torch.Tensor] | None = None,
                **opts: Any) -> nn.Module:
    """Network ``name`` of the registry for ``num_classes`` classes and clips of ``clip_len`` x ``crop_size``².

    ``opts`` are the entry's options (``ModelSpec.options``: ``width``,
    ``bn``, ``dropout``); one it does not take is refused, as is an input
    smaller than it accepts. ``inflate_from``: 2-D weights (a state dict, or
    a file of one) inflated into it (``train.models.inflate``; entries with
    ``inflatable`` only). Every refusal is a one-line ValueError.
    """
    spec = model_spec(name)
    unknown = sorted(set(opts) - set(spec.options))
    if unknown:
        raise ValueError(f"{name} takes no option {', '.join(unknown)} (its options: {', '.join(spec.options)})")
    problem = spec.input_problem(clip_len, crop_size)
    if problem is not None:
        raise ValueError(problem)
    if inflate_from is not None and not spec.inflatable:
        inflatable = ", ".join(n for n, s in MODELS.items() if s.inflatable)
        raise ValueError(f"{name} is not inflated from 2-D weights (that is {inflatable})")
    model = spec.builder(num_classes, clip_len=clip_len, crop_size=crop_size, **opts)
    if inflate_from is not None:
        state = (as_state_dict(inflate_from) if isinstance(inflate_from, Mapping)
                 else read_state_dict(inflate_from))
        inflate_into(model, state, classifier=spec.classifier)
    return model


def flops_per_clip(name: str, *, clip_len: int, crop_size: int, num_classes: int = 400, **opts: Any) -> int:
    """Forward FLOPs of one clip of ``clip_len`` x ``crop_size``² through network ``name`` built with ``opts``.

    Counted by ``torch.utils.flop_counter`` (convolutions and matrix products,
    a multiply-add = 2 FLOPs) on the meta device: no memory, no weights, no
    arithmetic, so it costs a fraction of a second at any size. A training
    step costs about 3 times this per clip (the trainer's MFU figure).
    """
    with torch.device("meta"):
        model = build_model(name, num_classes=num_classes, clip_len=clip_len, crop_size=crop_size, **opts)
        x = torch.empty(1, 3, clip_len, crop_size, crop_size)
    counter = FlopCounterMode(display=False)
    with counter:
        model(x)
    return int(counter.get_total_flops())


__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "MODELS", "OPTIONS", "ModelSpec", "build_model", "flops_per_clip",
           "model_spec"]
