"""Inflating 2-D ImageNet weights into a 3-D network (``--inflate-from``), key by key.

A 2-D convolution's kernel (out, in, kh, kw) fills the 3-D convolution of
the same name, (out, in, T, kh, kw), repeated T times over time and divided
by T (Carreira and Zisserman 2017): on a clip whose frames are all the same
the 3-D convolution then gives what the 2-D one gives on a frame. BatchNorm
weights, biases and running statistics are copied. The 2-D classifier
(ImageNet's 1,000 classes) is not used; the 3-D one keeps its fresh init.

Every 2-D convolution and BatchNorm must be used and every 3-D one filled:
a missing, left-over or mis-shaped key is refused in one line naming it, so
a state dict of another network never half-loads. Files are read with
``torch.load(weights_only=True)``: an untrusted pickle is never executed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..safeload import load_weights_only
from .finetune import strip_prefixes

WRAPPERS = ("state_dict", "model")  # a state dict saved inside a dict under one of these keys (mmcv, this trainer)


def read_state_dict(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The state dict in file ``path`` (bare, or under ``state_dict``/``model``); one-line ValueError otherwise."""
    if not os.path.isfile(path):
        raise ValueError("no such file")
    loaded = load_weights_only(path)
    return as_state_dict(loaded)


def as_state_dict(loaded: Any) -> dict[str, torch.Tensor]:
    """``loaded`` as a state dict of tensors (unwrapping ``state_dict``/``model``); one-line ValueError otherwise."""
    if isinstance(loaded, Mapping):
        for key in WRAPPERS:
            inner = loaded.get(key)
            if isinstance(inner, Mapping) and inner:
                loaded = inner
                break
    if not isinstance(loaded, Mapping) or not loaded:
        raise ValueError(f"holds {'an empty dict' if isinstance(loaded, Mapping) else 'a ' + type(loaded).__name__}, "
                         f"not a state dict of tensors")
    bad = next((k for k, v in loaded.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)), None)
    if bad is not None:
        raise ValueError(f"not a state dict of tensors ({bad!r} is a {type(loaded[bad]).__name__})")
    return strip_prefixes(loaded)


def inflate_kernel(kernel: torch.Tensor, depth: int, *, centre: bool = False) -> torch.Tensor:
    """A 2-D kernel (out, in, kh, kw) as a 3-D one (out, in, ``depth``, kh, kw).

    Repeated over time and divided by ``depth`` (the sum over time is the 2-D
    kernel); with ``centre``, all of it on the middle tap and zeros elsewhere
    (each output frame then sees one input frame: the test of frame-wise equality).
    """
    if kernel.dim() != 4:
        raise ValueError(f"a 2-D kernel is (out, in, kh, kw), got shape {tuple(kernel.shape)}")
    if centre:
        out = kernel.new_zeros((kernel.shape[0], kernel.shape[1], depth, *kernel.shape[2:]))
        out[:, :, depth // 2] = kernel
        return out
    return kernel.unsqueeze(2).repeat(1, 1, depth, 1, 1) / depth


def inflated_state(model: nn.Module, state2d: Mapping[str, torch.Tensor], *, classifier: str,
                   centre: bool = False) -> dict[str, torch.Tensor]:
    """``model``'s state dict filled from the 2-D ``state2d`` (same names), the classifier's entries left out.

    One-line ValueError naming the first key that is missing from ``state2d``,
    left over in it (a 2-D layer the 3-D network has not), or of a shape that
    does not inflate to the 3-D one.
    """
    own = {k: v for k, v in model.state_dict().items() if not k.startswith(classifier)}
    given = {k: v for k, v in strip_prefixes(state2d).items() if not k.startswith(classifier)}
    missing = [k for k in own if k not in given]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"the 2-D weights lack {missing[0]}{more}: not a 2-D network of this one's layers and names "
                         f"(torchvision's ResNet-50 at this --model-width)")
    unused = [k for k in given if k not in own]
    if unused:
        more = f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""
        raise ValueError(f"the 2-D weights hold {unused[0]}{more}, which the 3-D network has not: every 2-D layer "
                         f"must be used")
    out = {}
    for key, target in own.items():
        source = given[key]
        if target.dim() == 5:
            fits = source.dim() == 4 and source.shape == target.shape[:2] + target.shape[3:]
            if fits:
                out[key] = inflate_kernel(source, target.shape[2], centre=centre).to(target.dtype)
        else:
            fits = source.shape == target.shape
            if fits:
                out[key] = source.to(target.dtype)
        if not fits:
            raise ValueError(f"{key}: the 2-D weights' {tuple(source.shape)} does not inflate to "
                             f"{tuple(target.shape)}")
    return out


def inflate_into(model: nn.Module, state2d: Mapping[str, torch.Tensor], *, classifier: str,
                 centre: bool = False) -> list[str]:
    """Load the inflated ``state2d`` into ``model`` (``inflated_state``); returns the keys left at their init
    (the classifier's)."""
    state = inflated_state(model, state2d, classifier=classifier, centre=centre)
    model.load_state_dict(state, strict=False)
    return sorted(k for k in model.state_dict() if k not in state)


__all__ = ["as_state_dict", "inflate_into", "inflate_kernel", "inflated_state", "read_state_dict"]
